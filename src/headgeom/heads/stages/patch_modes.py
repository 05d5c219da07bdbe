"""Head patching of one run in the extra ablation modes, every task in one job (docs §10.1, §10.6).

    python -m headgeom.heads.stages.patch_modes --checkpoint CKPT --manifest MANIFEST \\
        --means means.safetensors \\
        --splits discovery,evaluation --batch-size 128 --max-rows 4096 --model-name learned \\
        --seed 42 --threads 1 --out sva mean sva.mean.parquet --out sva zero sva.zero.parquet \\
        --task sva tasks/sva.parquet ...

The same effects rows as heads/stages/patch_heads.py
(headgeom.heads.analysis.patch_effects.patch_task),
one Parquet per (task, mode), for the splits the mode comparison reads; one job per run so
the checkpoint, the means and torch load once.
"""

from __future__ import annotations

import argparse
import sys

from headgeom import results
from headgeom.data.task_files import read_task
from headgeom.heads.analysis.ablation import read_means
from headgeom.heads.analysis.patch_effects import ENGINES, EffectsRun, effects_metadata, patch_task
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads
from headgeom.vocabulary import MODES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    p.add_argument("--manifest", required=True, help="its JSON manifest")
    p.add_argument("--means", required=True, help="the run's means artifact")
    p.add_argument("--task", nargs=2, action="append", required=True, metavar=("NAME", "PATH"))
    p.add_argument("--out", nargs=3, action="append", required=True,
                   metavar=("TASK", "MODE", "PATH"), help="one effects Parquet")  # fmt: skip
    p.add_argument("--splits", required=True, help="comma-separated")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--max-rows", type=int, required=True)
    p.add_argument("--engine", choices=ENGINES, default="fast")
    p.add_argument("--model-name", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    args.splits = [s for s in args.splits.split(",") if s]
    tasks = dict(args.task)
    for task, mode, _ in args.out:
        if task not in tasks:
            p.error(f"--out names task {task!r} but no --task gives its file ({sorted(tasks)})")
        if mode not in MODES:
            p.error(f"--out names mode {mode!r}; allowed: {', '.join(MODES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device)
    means = read_means(args.means, manifest["checkpoint_file_sha256"])
    task_files = dict(args.task)
    for name, mode, out in args.out:
        task = read_task(task_files[name], args.splits)
        effects = patch_task(model, vocab, task, args.splits, args.batch_size, args.max_rows,
                             args.engine, mode, means.z)  # fmt: skip
        effects = effects.assign(model=args.model_name, seed=args.seed, task=name)
        table = results.EFFECTS.with_type("example_id", task.schema.field("example_id").type)
        run = EffectsRun(args.model_name, args.seed, name, args.splits, args.batch_size,
                         args.max_rows, args.engine, args.threads)  # fmt: skip
        used = means if mode == "mean" else None
        table.write(out, effects, effects_metadata(model, manifest, task, run, device, mode, used))
        print(f"{name} {mode}: wrote {len(effects)} rows to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
