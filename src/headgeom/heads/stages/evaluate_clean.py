"""Clean task performance (docs §8.6, paper Table 5): accuracy and mean logit margin.

    python -m headgeom.heads.stages.evaluate_clean --checkpoint model.safetensors \\
        --manifest manifest.json \\
        --task tasks/sva.parquet tasks/quote.parquet --threads 1 \\
        --out eval/sva.parquet eval/quote.parquet

The checkpoint is verified against its manifest first and loaded once for every task (one
job per run: the per-job start-up, mostly torch, costs more than evaluating a task). One
output Parquet per task, in the order given, with one row per split in the task file; the
paper reports the evaluation split (Table 5) and the discovery split (the "base" LD of
Figure 5).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.data.task_files import model_inputs, read_task
from headgeom.heads.analysis.evaluation import evaluate_splits
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint .safetensors")
    p.add_argument("--manifest", required=True, help="its checkpoint manifest.json")
    p.add_argument("--task", nargs="+", required=True, help="task datasets tasks/<task>.parquet")
    p.add_argument("--out", nargs="+", required=True, help="output .parquet per --task")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per forward pass")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    if len(args.task) != len(args.out):
        p.error(f"{len(args.task)} --task files but {len(args.out)} --out files (one per task)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    for task_path, out in zip(args.task, args.out, strict=True):
        evaluate_task(model, vocab, manifest, task_path, out, args)
    return 0


def evaluate_task(model, vocab, manifest, task_path, out, args) -> None:
    """Evaluate one task file on every split and write its Parquet."""
    task = read_task(task_path)  # every example, in file order
    inputs = model_inputs(task.frame, vocab)
    splits = task.frame["split"].astype(str).to_numpy()
    per_split = evaluate_splits(
        model, inputs.clean_ids, inputs.correct, inputs.incorrect, splits, args.batch_size
    )
    identity = {"model": manifest["model_name"], "seed": manifest["init_seed"], "task": task.name}
    rows = [{**identity, **perf} for perf in per_split]
    for r in rows:
        print(
            f"{task.name}/{r['split']}: n={r['n']} acc={r['accuracy']:.3f} "
            f"margin={r['margin']:+.3f}",
            file=sys.stderr,
        )
    metadata = {
        "task": task.name,
        **results.provenance(
            manifest, task_dataset_sha256=task.dataset_sha256, task_file_sha256=task.file_sha256
        ),
        "threads": args.threads,
    }
    results.EVAL.write(out, pd.DataFrame(rows), metadata)


if __name__ == "__main__":
    sys.exit(main())
