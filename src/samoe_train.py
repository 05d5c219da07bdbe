"""Continued pretraining of one upcycled SA-MoE run (SAMOE §7) on the cpt-train stream:
per-group learning rates, the shared-expert freeze, warmup and cosine, decay on matrices
only, the auxiliary losses; the same loop for all three variants.

    python src/samoe_train.py --config-json '{...run config...}' --step0 step0.safetensors \\
        --init-manifest init.json --corpus-dir results/samoe-demo/samoe/corpus \\
        --checkpoint model.safetensors --log train_log.parquet --manifest manifest.json

The step-0 checkpoint and the corpus files are verified against their manifests first; a
config that differs from the one the step-0 model was upcycled with is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from headgeom.data.corpus import compact, read_tokens
from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import content_hash
from headgeom.runtime import set_threads
from headgeom.samoe import results
from headgeom.samoe.checkpoint import load_verified_moe, save_moe
from headgeom.samoe.config import CPTConfig
from headgeom.samoe.cpt import continued_pretraining
from headgeom.samoe.manifest import run_manifest, verified_inputs, write_run_manifest
from headgeom.training.loop import seed_everything


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--step0", required=True, type=Path)
    parser.add_argument("--init-manifest", required=True, type=Path)
    parser.add_argument("--corpus-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    set_threads(args.threads)
    model, vocab, init = load_verified_moe(args.step0, args.init_manifest)
    if init["config_hash"] != content_hash(cfg):
        raise ValueError(f"{args.init_manifest}: the step-0 model was upcycled with config "
                         f"{init['config_hash'][:12]}, this job's is {content_hash(cfg)[:12]}; "
                         "rerun samoe_upcycle")  # fmt: skip
    files = {"cpt_train": args.corpus_dir / "cpt_train.parquet"}
    verified_inputs(args.corpus_dir / "manifest.json", files)
    tokens = compact(read_tokens(files["cpt_train"]), vocab)
    cpt = CPTConfig.from_dict(cfg["cpt"])
    seed_everything(cfg["seed"])  # nothing in the loop draws, but the global RNG is fixed
    start = time.perf_counter()
    log = continued_pretraining(model, tokens, cpt, cfg["data_seed"])
    seconds = time.perf_counter() - start
    log.insert(0, "seed", cfg["seed"])
    log.insert(0, "variant", cfg["variant"])
    log.insert(0, "family", cfg["family"])
    with all_or_nothing(args.checkpoint, args.log, args.manifest):
        save_moe(args.checkpoint, model, vocab, {"run": cfg, "step": cpt.steps})
        results.CPT_LOG.write(args.log, log, {"config": cfg, "config_hash": content_hash(cfg)})
        write_run_manifest(args.manifest, run_manifest(
            "samoe_run_manifest", cfg, args.checkpoint,
            {"step0": args.step0, **files}, {"init": args.init_manifest},
            init_content_sha256=init["init"]["content_sha256"],
            final_loss=float(log["loss"].iloc[-1]), seconds=seconds,
            threads=args.threads))  # fmt: skip
    print(f"trained {cfg['family']}/{cfg['variant']}/s{cfg['seed']}: {cpt.steps} steps in "
          f"{seconds:.1f} s, loss {log['loss'].iloc[0]:.3f} → {log['loss'].iloc[-1]:.3f}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
