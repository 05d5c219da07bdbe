"""Clamp analyses of one run on every task (docs §13.3, §15.3): pair clamps, the two-order
path decomposition and the lumped lane clamp, with checks C12 and C13.

    python -m headgeom.heads.stages.clamps --checkpoint CKPT --manifest MANIFEST \\
        --tasks sva.parquet quote.parquet plural.parquet \\
        --heads sva.heads.parquet quote.heads.parquet plural.heads.parquet \\
        --split evaluation --threads 1 \\
        --out-pairs pairs.parquet --out-paths paths.parquet --out-lumped lumped.parquet

Top heads come from the stored per-head effects of the split (heads/stages/concentration.py); a
violated check (C12, C13, or Δ(∅) differing from the stored effect) stops the run before
anything is written (headgeom.heads.analysis.clamp_analyses.clamp_tables).
"""

from __future__ import annotations

import argparse
import sys

from headgeom import checks, results
from headgeom.data.task_files import model_inputs, read_task
from headgeom.hashing import sha256_file
from headgeom.heads.analysis.clamp_analyses import clamp_tables
from headgeom.heads.analysis.effects import effect_matrix
from headgeom.io import read_table
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--tasks", nargs="+", required=True, help="task Parquets")
    parser.add_argument("--heads", nargs="+", required=True, help="heads Parquets, same order")
    parser.add_argument("--split", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-rows", type=int, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    for name in ("pairs", "paths", "lumped"):
        parser.add_argument(f"--out-{name}", required=True)
    args = parser.parse_args(argv)
    if len(args.tasks) != len(args.heads):
        parser.error(f"{len(args.tasks)} --tasks but {len(args.heads)} --heads")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device)
    tasks, sources = [], {}
    for task_path, heads_path in zip(args.tasks, args.heads, strict=True):
        task = read_task(task_path, [args.split])
        results.require_same_run(heads_path, manifest, task.dataset_sha256)
        heads = read_table(heads_path).to_pandas()
        rows = heads[heads["split"] == args.split]
        if rows.empty:
            raise ValueError(f"{heads_path}: no per-head effects of split {args.split!r}")
        identity = {k: rows[k].iloc[0].item() if k == "seed" else rows[k].iloc[0]
                    for k in ("model", "seed", "task")}  # fmt: skip
        e = effect_matrix(rows, "e", heads_path)
        tasks.append((identity, model_inputs(task.frame, vocab), e))
        sources[f"{identity['task']}_heads_sha256"] = sha256_file(heads_path)
    out = clamp_tables(model, tasks, args.split, True, args.batch_size, args.max_rows)
    metadata = {
        **results.file_metadata("clamps", manifest=manifest),
        **sources,
        "split": args.split,
        **checks.record("C12", out.c12.value, out.c12.tolerance, note="max |logit residual|"),
        **checks.record("C13", out.c13.value, out.c13.tolerance, note="max |direct residual|"),
        "check_effects_max_abs_residual": out.effects.value,
        "check_effects_tolerance": out.effects.tolerance,
        "device": str(device),
        "threads": args.threads,
    }
    results.CLAMP_PAIRS.write(args.out_pairs, out.pairs, metadata)
    results.CLAMP_PATHS.write(args.out_paths, out.paths, metadata)
    results.CLAMP_LUMPED.write(args.out_lumped, out.lumped, metadata)
    checked = ", ".join(
        f"{name} {r.value:.2g} ≤ {r.tolerance:.2g}"
        for name, r in (("C12", out.c12), ("C13", out.c13), ("Δ(∅)", out.effects))
    )
    print(f"wrote {len(out.pairs)} pairs, {len(out.paths)} paths, {len(out.lumped)} "
          f"lumped rows ({checked})", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
