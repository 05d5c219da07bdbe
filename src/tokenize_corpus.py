"""Build and tokenise the training corpus and validation file (METHODS §3; demo: embedded).

    python src/tokenize_corpus.py --config-json '{"source":"embedded","seed":1729,
        "n_train_tokens":1000000,"n_val_tokens":65536,"compact_vocab":true}' \\
        --train train.parquet --val val.parquet --vocab vocab.parquet --manifest corpus.json

Writes the token files (one uint16 column ``token`` of GPT-2 ids), the model vocabulary
map (model id <-> GPT-2 id) and the corpus manifest with every hash downstream records cite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from headgeom import corpus
from headgeom.hashing import content_hash
from headgeom.io import write_json, write_parquet
from headgeom.tokenizer import EOT_ID, load_gpt2_tokenizer, tokenizer_files_sha256

DEFAULTS = {"source": "embedded", "seed": 1729, "compact_vocab": True}
REQUIRED = ("n_train_tokens", "n_val_tokens")

TOKEN_SCHEMA = pa.schema([("token", pa.uint16())])
TOKEN_DESCRIPTIONS = {
    "token": "GPT-2 BPE token id in corpus order; documents are each followed by EOT (50256)"
}
VOCAB_SCHEMA = pa.schema([("model_id", pa.int32()), ("gpt2_id", pa.int32()), ("text", pa.string())])
VOCAB_DESCRIPTIONS = {
    "model_id": "row of the model's embedding / unembedding (0-based, dense)",
    "gpt2_id": "GPT-2 BPE id that model_id stands for (sorted ascending)",
    "text": "decoded text of the GPT-2 token (invalid UTF-8 fragments shown as U+FFFD)",
}


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults; reject unknown keys, wrong types and unsupported sources clearly."""
    unknown = set(config) - set(DEFAULTS) - set(REQUIRED)
    if unknown:
        raise ValueError(
            f"corpus config: unknown keys {sorted(unknown)}; "
            f"allowed: {sorted([*DEFAULTS, *REQUIRED])}"
        )
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise ValueError(f"corpus config: missing required keys {missing}")
    cfg = {**DEFAULTS, **config}
    if cfg["source"] != "embedded":
        raise ValueError(
            f"corpus config: source = {cfg['source']!r} is not supported; only 'embedded' "
            "(the generated demo corpus) is supported in this version (FineWeb-Edu comes later)"
        )
    for key in ("seed", *REQUIRED):
        value = cfg[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"corpus config: {key} = {value!r} must be a non-negative integer")
    if not isinstance(cfg["compact_vocab"], bool):
        raise ValueError(f"corpus config: compact_vocab = {cfg['compact_vocab']!r} must be a bool")
    return cfg


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True, help="the `corpus` config block as JSON")
    parser.add_argument("--train", required=True, type=Path, help="output token Parquet (train)")
    parser.add_argument("--val", required=True, type=Path, help="output token Parquet (val)")
    parser.add_argument("--vocab", required=True, type=Path, help="output vocabulary Parquet")
    parser.add_argument("--manifest", required=True, type=Path, help="output manifest JSON")
    args = parser.parse_args(argv)

    try:
        cfg = resolve_config(json.loads(args.config_json))
    except json.JSONDecodeError as err:
        parser.error(f"--config-json is not valid JSON ({err})")
    config_hash = content_hash(cfg)

    tok = load_gpt2_tokenizer()
    total = cfg["n_train_tokens"] + cfg["n_val_tokens"]
    with tqdm(total=total, unit="tok", unit_scale=True, file=sys.stderr, desc="corpus") as bar:
        train, val = corpus.build_demo_corpus(
            cfg["seed"], cfg["n_train_tokens"], cfg["n_val_tokens"], tok, progress=bar.update
        )
    vocab = corpus.build_vocab([train, val]) if cfg["compact_vocab"] else corpus.identity_vocab()
    hashes = {
        "train_sha256": corpus.token_bytes_sha256(train),
        "val_sha256": corpus.token_bytes_sha256(val),
        "vocab_sha256": corpus.vocab_sha256(vocab),
    }
    common = {"config": cfg, "config_hash": config_hash, "eot_id": EOT_ID}

    for role, path, arr in (("train", args.train, train), ("val", args.val, val)):
        write_parquet(
            path,
            pa.table({"token": pa.array(arr, type=pa.uint16())}),
            TOKEN_SCHEMA,
            metadata={
                **common,
                "role": role,
                "n_tokens": len(arr),
                "token_sha256": hashes[f"{role}_sha256"],
            },
            descriptions=TOKEN_DESCRIPTIONS,
        )
    texts = tok.decode_batch([[int(i)] for i in vocab], skip_special_tokens=False)
    write_parquet(
        args.vocab,
        pa.table(
            {
                "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
                "gpt2_id": pa.array(vocab.astype(np.int32)),
                "text": pa.array(texts, type=pa.string()),
            }
        ),
        VOCAB_SCHEMA,
        metadata={
            **common,
            "compact_vocab": cfg["compact_vocab"],
            "vocab_size": len(vocab),
            "vocab_sha256": hashes["vocab_sha256"],
        },
        descriptions=VOCAB_DESCRIPTIONS,
    )
    manifest = {
        "record_type": "corpus_manifest",
        **common,
        "tokenizer": {"name": "gpt2", "files_sha256": tokenizer_files_sha256()},
        "n_train_tokens": len(train),
        "n_val_tokens": len(val),
        **hashes,
        "vocab_size": len(vocab),
        "files": {
            "train": _file_sha256(args.train),
            "val": _file_sha256(args.val),
            "vocab": _file_sha256(args.vocab),
        },
    }
    write_json(args.manifest, manifest)
    print(
        f"corpus: {len(train)} train + {len(val)} val tokens, vocab {len(vocab)}, "
        f"train_sha256 {hashes['train_sha256'][:12]}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
