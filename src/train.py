"""Train one (model, seed) on the tokenized corpus: checkpoint + per-step training log.

    python src/train.py --config-json '{"model_name": "learned", "seed": 42, ...}' \\
        --train-tokens train_tokens.parquet --val-tokens val_tokens.parquet \\
        --vocab vocab.parquet --corpus-manifest manifest.json --threads 1 \\
        --checkpoint model.safetensors --log train_log.parquet

The token and vocabulary files are verified against the SHA-256 the corpus manifest records
for them (its ``files`` map) before training.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pyarrow as pa
import torch

from headgeom.checkpoint import save_checkpoint
from headgeom.corpus import compact, read_tokens, read_vocab
from headgeom.hashing import (
    environment,
    manifest_hash,
    read_manifest_field,
    sha256_file,
    source_freeze,
    verify_file,
)
from headgeom.io import write_parquet
from headgeom.training import build_model, parse_run_config, train

LOG_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("tokens", pa.int64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("grad_norm", pa.float64()),
        ("seconds", pa.float64()),
        ("val_loss", pa.float64()),
    ]
)
LOG_DESCRIPTIONS = {
    "step": "optimizer update s (1-based; step 0 is the initialisation)",
    "tokens": "training tokens seen after this update (s * batch_size * n_ctx)",
    "loss": "training next-token cross-entropy of this update's batch, nats",
    "lr": "learning rate used by this update",
    "grad_norm": "global gradient L2 norm before clipping",
    "seconds": "wall-clock training seconds since the start at the end of this update "
    "(validation excluded)",
    "val_loss": "validation cross-entropy in nats (METHODS §3.4) after this update; null "
    "except every eval_every steps and at the final step",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="run config as a JSON object")
    p.add_argument("--train-tokens", required=True, help="train_tokens.parquet (GPT-2 ids)")
    p.add_argument("--val-tokens", required=True, help="val_tokens.parquet (GPT-2 ids)")
    p.add_argument("--vocab", required=True, help="vocab.parquet (model_id ↔ gpt2_id)")
    p.add_argument("--corpus-manifest", required=True, help="corpus manifest.json")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--checkpoint", required=True, help="output .safetensors")
    p.add_argument("--log", required=True, help="output training log .parquet")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = parse_run_config(json.loads(args.config_json))
    torch.set_num_threads(args.threads)
    source = source_freeze()  # the code as training starts

    manifest = args.corpus_manifest
    file_sha256 = read_manifest_field(manifest, "files")  # role -> SHA-256 of the file bytes
    for role, path in (
        ("train", args.train_tokens),
        ("val", args.val_tokens),
        ("vocab", args.vocab),
    ):
        verify_file(path, file_sha256[role], manifest)
    vocab = read_vocab(args.vocab)
    train_ids = compact(read_tokens(args.train_tokens), vocab, dtype=np.int32)
    val_ids = compact(read_tokens(args.val_tokens), vocab, dtype=np.int32)

    model = build_model(run, n_vocab=len(vocab))
    print(
        f"{run.config_id}: {model.n_params():,} trainable parameters, "
        f"{len(train_ids):,} train / {len(val_ids):,} val tokens, {args.threads} thread(s)",
        file=sys.stderr,
    )
    result = train(
        model,
        train_ids,
        val_ids,
        run.training,
        data_seed=run.data_seed,
        progress=not args.no_progress,
        device=args.device,
    )
    steps_per_s = run.training.steps / result.seconds
    print(
        f"done: val loss {result.val_loss:.6f} nats, {steps_per_s:.2f} steps/s "
        f"on {result.device} ({result.precision})",
        file=sys.stderr,
    )

    model.cpu()
    save_checkpoint(args.checkpoint, model, vocab)
    metadata = {
        "config": run.raw,
        "config_hash": run.config_hash,
        "model_name": run.model_name,
        "config_id": run.config_id,
        "seed": run.seed,
        "data_seed": run.data_seed,
        "n_params": model.n_params(),
        "val_loss_nats": result.val_loss,
        "corpus_manifest_sha256": manifest_hash(manifest),
        "checkpoint_file_sha256": sha256_file(args.checkpoint),
        "device": result.device,
        "precision": result.precision,
        "threads": args.threads,
        "train_seconds": result.seconds,
        "source": source,
        "environment": environment(),
    }
    write_parquet(args.log, result.log, LOG_SCHEMA, metadata, LOG_DESCRIPTIONS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
