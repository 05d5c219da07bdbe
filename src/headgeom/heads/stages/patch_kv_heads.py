"""Key/value-head patching of a grouped-query model on every example (docs §10.1).

    python -m headgeom.heads.stages.patch_kv_heads --checkpoint CKPT --manifest MANIFEST \\
        --task tasks/sva.parquet tasks/quote.parquet --splits discovery,validation,evaluation \\
        --batch-size 128 --max-rows 4096 --model-name smollm2 --seed 0 --threads 1 \\
        --out sva.parquet quote.parquet

Writes, per task file, one Parquet with a row per (split, example, layer, key/value head):
the clean and patched logit differences, the drop ``effect = clean_ld − patched_ld`` and the
query heads that read the head (headgeom.heads.analysis.patch_effects.patch_kv_task). Key/value head
j of layer l is patched at its k and v projection outputs, every position, reference values
(headgeom.heads.analysis.kv_patching). The workflow runs it on the imported causal LMs whose query
heads share key/value heads (rule patch_kv_heads); one job per run, as patch_heads.
"""

from __future__ import annotations

import argparse
import sys

from headgeom import results
from headgeom.data.task_files import read_task
from headgeom.heads.analysis.kv_patching import has_kv_heads
from headgeom.heads.analysis.patch_effects import (
    ENGINES,
    EffectsRun,
    kv_effects_metadata,
    patch_kv_task,
)
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--task", nargs="+", required=True, help="task Parquets (stage make_tasks)")
    parser.add_argument("--splits", required=True, help="comma-separated")
    parser.add_argument("--batch-size", type=int, required=True, help="examples per batch")
    parser.add_argument(
        "--max-rows", type=int, required=True, help="fast engine: patches × examples per forward"
    )
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's seed")
    parser.add_argument(
        "--task-name", nargs="+", help="one per --task (default: each file's own task name)"
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="fast",
        help="fast (layer resumption, clean-prefix reuse, stacked heads, answer logits only) "
        "or plain (one full forward per key/value head)",
    )
    parser.add_argument("--out", nargs="+", required=True, help="Parquet per --task")
    args = parser.parse_args(argv)
    if len(args.out) != len(args.task):
        parser.error(f"{len(args.task)} --task files but {len(args.out)} --out (one per task)")
    if args.task_name is not None and len(args.task_name) != len(args.task):
        parser.error(f"{len(args.task)} --task files but {len(args.task_name)} --task-name")
    args.splits = [s for s in args.splits.split(",") if s]
    for name, value in (("batch-size", args.batch_size), ("max-rows", args.max_rows)):
        if value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    if not has_kv_heads(model):
        raise SystemExit(
            f"{args.checkpoint}: a {type(model).__name__} has no key/value heads of its own; "
            "key/value-head patching needs an imported causal LM (hf-causal-lm, gguf, hub)"
        )
    device = pick_device(args.device)
    model = model.to(device)  # analyses run in float32 (docs §0)
    names = args.task_name or [None] * len(args.task)
    for path, name, out in zip(args.task, names, args.out, strict=True):
        task = read_task(path, args.splits)
        name = name or task.name
        rows = patch_kv_task(
            model, vocab, task, args.splits, args.batch_size, args.max_rows, args.engine
        )
        rows = rows.assign(model=args.model_name, seed=args.seed, task=name)
        table = results.KV_EFFECTS.with_type("example_id", task.schema.field("example_id").type)
        run = EffectsRun(args.model_name, args.seed, name, args.splits, args.batch_size,
                         args.max_rows, args.engine, args.threads)  # fmt: skip
        table.write(out, rows, kv_effects_metadata(model, manifest, task, run, device))
        print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
