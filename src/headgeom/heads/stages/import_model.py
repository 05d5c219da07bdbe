"""Import a GPT-2 checkpoint the user brings (no training recipe) as the workspace's checkpoint.

    python -m headgeom.heads.stages.import_model --run-json '{...}' \\
        --val-tokens corpus/val_tokens.parquet \\
        --n-ctx 32 --batch-size 16 --threads 1 \\
        --checkpoint model.safetensors --manifest manifest.json --log train_log.parquet

Converts the ``transformers`` GPT2LMHeadModel directory (format hf-gpt2) or TransformerLens
state dict (tl-gpt2) named by the run config's ``import`` block (headgeom.model.importing)
into a ``learned`` checkpoint with the full GPT-2 vocabulary, and writes its manifest
(SHA-256 of every imported file, the format, the conversion version, the validation loss
on the study's validation file) and a one-row run log (step 0) that the paper tables read
as they read a training log. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import results
from headgeom.data.corpus import read_tokens
from headgeom.hashing import manifest_hash
from headgeom.io import write_manifest
from headgeom.runtime import set_threads
from headgeom.training.import_job import import_run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-json", required=True, help="import run config (Study.import_config)")
    p.add_argument("--val-tokens", required=True, help="val_tokens.parquet (GPT-2 ids)")
    p.add_argument("--n-ctx", type=int, required=True, help="validation window length")
    p.add_argument("--batch-size", type=int, required=True, help="validation batch size")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--checkpoint", required=True, help="output checkpoint .safetensors")
    p.add_argument("--manifest", required=True, help="output manifest.json")
    p.add_argument("--log", required=True, help="output run log .parquet")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    run = json.loads(args.run_json)
    val = read_tokens(args.val_tokens)
    manifest, log, metadata = import_run(
        run, args.checkpoint, val, n_ctx=args.n_ctx, batch_size=args.batch_size
    )
    results.TRAIN_LOG.write(args.log, log, metadata)
    write_manifest(args.manifest, manifest)
    print(
        f"{args.checkpoint}: imported {run['import']['path']} "
        f"(val loss {manifest['val_loss_nats']:.4f} nats); manifest {manifest_hash(args.manifest)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
