"""Continued pretraining of one upcycled SA-MoE run (SAMOE §7) on the cpt-train stream:
per-group learning rates, the shared-expert freeze, warmup and cosine, decay on matrices
only, the auxiliary losses; the same loop for all three variants.

    python src/samoe_train.py --config-json '{...run config...}' --step0 step0.safetensors \\
        --init-manifest init.json --corpus-dir results/samoe-demo/samoe/corpus \\
        --checkpoint model.safetensors --log train_log.parquet --manifest manifest.json

The step-0 checkpoint and the corpus files are verified against their manifests first; a
config that differs from the one the step-0 model was upcycled with is refused.

Resumable (docs/samoe.md, as src/train.py): the state is written to ``--resume-dir`` every
10 minutes and when SIGTERM or SIGUSR1 arrives (Slurm's warning before a time limit);
the job then exits 75 and a rerun continues from the state to the same bytes. A state of
another run (config, step-0 model or corpus differ) is refused, naming what differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from headgeom.data.corpus import compact, read_tokens
from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import content_hash, manifest_hash
from headgeom.runtime import set_threads
from headgeom.samoe import results
from headgeom.samoe.checkpoint import load_verified_moe, save_moe
from headgeom.samoe.config import CPTConfig
from headgeom.samoe.cpt import continued_pretraining
from headgeom.samoe.manifest import run_manifest, verified_inputs, write_run_manifest
from headgeom.training.loop import seed_everything
from headgeom.training.preemption import EXIT_PREEMPTED, Preempted, on_signals
from headgeom.training.state import Resume

#: [CHOICE] Seconds between resumable states (besides the one a stop signal writes): a
#: toy run (seconds) writes none, a paper run (hours) one every 10 minutes.
SAVE_EVERY_S = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--step0", required=True, type=Path)
    parser.add_argument("--init-manifest", required=True, type=Path)
    parser.add_argument("--corpus-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--resume-dir", type=Path, help="where the resumable state is kept")
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
    resume = None
    if args.resume_dir is not None:
        corpus_hash = manifest_hash(args.corpus_dir / "manifest.json")
        identity = {"config_hash": content_hash(cfg), "corpus_manifest": corpus_hash,
                    "step0_sha256": init["checkpoint_file_sha256"]}  # fmt: skip
        resume = Resume(args.resume_dir / "state.safetensors", identity,
                        {"threads": args.threads}, config=cfg)  # fmt: skip
        if resume.path.exists():
            print(f"resuming from {resume.path}", file=sys.stderr)
    start = time.perf_counter()
    with on_signals() as stop:
        try:
            log = continued_pretraining(
                model,
                tokens,
                cpt,
                cfg["data_seed"],
                resume=resume,
                seq_len=cfg.get("seq_len"),
                stop=stop,
                save_every_s=SAVE_EVERY_S,
            )
        except Preempted as err:
            print(f"preempted: {err}", file=sys.stderr)
            return EXIT_PREEMPTED
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
