"""Single-head activation patching of every head on every example (docs §10.1).

    python -m headgeom.heads.stages.patch_heads --checkpoint CKPT --manifest MANIFEST \\
        --task tasks/sva.parquet tasks/quote.parquet --splits discovery,validation,evaluation \\
        --batch-size 128 --max-rows 4096 --model-name learned --seed 42 --threads 1 \\
        --out sva.parquet quote.parquet [--mode mean --means means.safetensors]

Writes, per task file, one Parquet with a row per (split, example, layer, head): the clean
and patched logit differences and the drop ``effect = clean_ld − patched_ld``
(headgeom.heads.analysis.patch_effects.patch_task). One job per run: the checkpoint is verified
against its manifest and loaded once for every task (a job's start-up, mostly torch, costs
as much as patching a demo task); each file's metadata carries the provenance keys.
``--mode`` (ablation mode, docs §10.1): resample (the reference prompt's z, the default),
mean (the head's mean z from ``--means``, the artifact of heads/stages/ablation_atlas.py, whose hash
is recorded) or zero.
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument(
        "--task", nargs="+", required=True, help="task Parquets (heads/stages/make_tasks.py)"
    )
    parser.add_argument("--splits", required=True, help="comma-separated")
    parser.add_argument("--batch-size", type=int, required=True, help="examples per batch")
    parser.add_argument(
        "--max-rows",
        type=int,
        required=True,
        help="fast engine: head patches × examples per forward (bounds memory)",
    )
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's training seed")
    parser.add_argument(
        "--task-name", nargs="+", help="one per --task (default: each file's own task name)"
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="fast",
        help="patching engine: fast (layer resumption, clean-prefix reuse, stacked heads, "
        "answer logits only; equal within 1e-5) or plain (one full forward per head)",
    )
    parser.add_argument("--mode", choices=MODES, required=True, help="ablation mode")
    parser.add_argument("--means", help="means artifact (needed with --mode mean)")
    parser.add_argument("--out", nargs="+", required=True, help="effects Parquet per --task")
    args = parser.parse_args(argv)
    if len(args.out) != len(args.task):
        parser.error(f"{len(args.task)} --task files but {len(args.out)} --out (one per task)")
    if args.task_name is not None and len(args.task_name) != len(args.task):
        parser.error(f"{len(args.task)} --task files but {len(args.task_name)} --task-name")
    if args.mode == "mean" and not args.means:
        parser.error("--mode mean needs --means (the run's means.safetensors)")
    args.splits = [s for s in args.splits.split(",") if s]
    for name, value in (("batch-size", args.batch_size), ("max-rows", args.max_rows)):
        if value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device)  # analyses run in float32 (docs §0)
    means = None
    if args.mode == "mean":
        means = read_means(args.means, manifest["checkpoint_file_sha256"])
    names = args.task_name or [None] * len(args.task)
    for path, name, out in zip(args.task, names, args.out, strict=True):
        patch_one_task(model, vocab, manifest, device, means, path, name, out, args)
    return 0


def patch_one_task(model, vocab, manifest, device, means, task_path, name, out, args) -> None:
    """Patch every head on every example of one task file and write its effects Parquet."""
    task = read_task(task_path, args.splits)
    name = name or task.name
    effects = patch_task(
        model, vocab, task, args.splits, args.batch_size, args.max_rows, args.engine,
        args.mode, None if means is None else means.z,
    )  # fmt: skip
    effects = effects.assign(model=args.model_name, seed=args.seed, task=name)
    table = results.EFFECTS.with_type("example_id", task.schema.field("example_id").type)
    run = EffectsRun(args.model_name, args.seed, name, args.splits, args.batch_size,
                     args.max_rows, args.engine, args.threads)  # fmt: skip
    metadata = effects_metadata(model, manifest, task, run, device, args.mode, means)
    table.write(out, effects, metadata)
    print(f"wrote {len(effects)} rows to {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
