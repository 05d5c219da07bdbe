"""Train one (model, seed) on the tokenized corpus: final and intermediate checkpoints (each
with its manifest) and the per-step training log; survives being killed at any point.

    python -m headgeom.heads.stages.train \\
        --config-json '{"model_name": "learned", "seed": 42, ...}' \\
        --train-tokens train_tokens.parquet --val-tokens val_tokens.parquet \\
        --vocab vocab.parquet --corpus-manifest manifest.json --threads 1 \\
        --checkpoint s42/model.safetensors --log s42/train_log.parquet

The token and vocabulary files are verified against the corpus manifest before training.
Intermediate checkpoints go to ``--checkpoint-dir``, the resumable state to ``--resume-dir``
(deleted once every output is written); ``headgeom.training.job`` says how a killed job
resumes and which outputs are the same bytes with or without interruptions. SIGTERM or
SIGUSR1 (a cluster's preemption warning) stops training after the current update with the
state written and exits with status 75 (EX_TEMPFAIL); a rerun continues from that update.
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom.run_config import parse_run_config
from headgeom.runtime import set_threads
from headgeom.training.job import CorpusFiles, JobOutputs, train_job
from headgeom.training.preemption import EXIT_PREEMPTED, Preempted, on_signals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="run config as a JSON object")
    p.add_argument("--train-tokens", required=True, help="train_tokens.parquet (GPT-2 ids)")
    p.add_argument("--val-tokens", required=True, help="val_tokens.parquet (GPT-2 ids)")
    p.add_argument("--vocab", required=True, help="vocab.parquet (model_id ↔ gpt2_id)")
    p.add_argument("--corpus-manifest", required=True, help="corpus manifest.json")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--checkpoint", required=True, help="output .safetensors (final step)")
    p.add_argument("--log", required=True, help="output training log .parquet")
    p.add_argument(
        "--checkpoint-dir",
        help="folder of the intermediate checkpoints (default: checkpoints/ beside --checkpoint)",
    )
    p.add_argument(
        "--resume-dir",
        help="folder of the resumable state (default: resume/ beside --checkpoint)",
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    run = parse_run_config(json.loads(args.config_json))
    with on_signals() as stop:  # SIGTERM / SIGUSR1: stop at a step boundary, state written
        try:
            train_job(
                run,
                CorpusFiles(args.train_tokens, args.val_tokens, args.vocab, args.corpus_manifest),
                JobOutputs.beside(args.checkpoint, args.log, args.checkpoint_dir, args.resume_dir),
                threads=args.threads,
                device=args.device,
                progress=not args.no_progress,
                stop=stop,
            )
        except Preempted as err:
            # stderr is the rule's log (rewritten by the retry); stdout is the Slurm job's log
            for stream in (sys.stderr, sys.stdout):
                print(f"preempted: {err}", file=stream, flush=True)
            return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
