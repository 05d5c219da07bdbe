"""Train the toy dense source of one SA-MoE family (SAMOE §4): the workspace GPT on the
dense-train stream, once for every variant and seed.

    python -m headgeom.samoe.stages.dense \\
        --config-json '{"family":"toy","dense":{...},"data_seed":1729}' \\
        --corpus-dir results/samoe-demo/samoe/corpus --checkpoint model.safetensors \\
        --log train_log.parquet --manifest manifest.json --threads 1

The corpus files are verified against their manifest first; the checkpoint (safetensors, with
the vocabulary map) is hashed into the manifest, which also records the final validation loss.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.data.corpus import compact, read_tokens, read_vocab
from headgeom.data.corpus_sources import all_or_nothing
from headgeom.model.checkpoint import save_checkpoint
from headgeom.runtime import set_threads
from headgeom.samoe import results
from headgeom.samoe.config import DenseConfig
from headgeom.samoe.dense import train_dense
from headgeom.samoe.manifest import run_manifest, verified_inputs, write_run_manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--corpus-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    set_threads(args.threads)
    d = args.corpus_dir
    files = {"dense_train": d / "dense_train.parquet", "dense_val": d / "dense_val.parquet",
             "vocab": d / "vocab.parquet"}  # fmt: skip
    verified_inputs(d / "manifest.json", files)
    vocab = read_vocab(str(files["vocab"]))
    train_ids = compact(read_tokens(files["dense_train"]), vocab)
    val_ids = compact(read_tokens(files["dense_val"]), vocab)
    dense = DenseConfig.from_dict(cfg["dense"])
    model, result = train_dense(dense, train_ids, val_ids, len(vocab), cfg["data_seed"])
    with all_or_nothing(args.checkpoint, args.log, args.manifest):
        save_checkpoint(args.checkpoint, model, vocab, {"samoe_dense": cfg})
        log = result.log[["step", "loss", "lr", "val_loss"]]
        results.DENSE_LOG.write(args.log, log, {"family": cfg["family"], "config": cfg})
        write_run_manifest(args.manifest, run_manifest(
            "samoe_dense_manifest", cfg, args.checkpoint, files,
            {"corpus": d / "manifest.json"}, val_loss=result.val_loss,
            n_params=model.n_params(), seconds=result.seconds))  # fmt: skip
    print(
        f"dense {cfg['family']}: {model.n_params():,} parameters, {dense.steps} steps, "
        f"val loss {result.val_loss:.4f} nats, {result.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
