"""Coordinate concentration of one run on every task (docs §15.2): single-direction patches
after and before W_O at the best head's layer, the top-10 shares, the matched null and the
within-head Haar-rotation control.

    python -m headgeom.heads.stages.coordinates --checkpoint CKPT --manifest MANIFEST \\
        --tasks sva.parquet quote.parquet plural.parquet \\
        --heads sva.heads.parquet quote.heads.parquet plural.heads.parquet \\
        --n-random-sets 1000 --null-seed 1502 --rotation-seed 1503 --threads 1 \\
        --out coords.parquet --out-directions directions.parquet

The best head of each task is the top head by evaluation effect (the stored per-head effects
of heads/stages/concentration.py); directions are selected on validation, reported on evaluation.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.data.task_files import model_inputs, read_task
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import coordinates
from headgeom.heads.analysis.effects import effect_matrix
from headgeom.io import read_table
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--tasks", nargs="+", required=True, help="task Parquets")
    parser.add_argument("--heads", nargs="+", required=True, help="heads Parquets, same order")
    parser.add_argument("--n-random-sets", type=int, required=True)
    parser.add_argument("--null-seed", type=int, required=True)
    parser.add_argument("--rotation-seed", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-rows", type=int, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--out-directions", required=True, help="one row per direction")
    args = parser.parse_args(argv)
    if len(args.tasks) != len(args.heads):
        parser.error(f"{len(args.tasks)} --tasks but {len(args.heads)} --heads")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device).eval()
    rows, directions, sources = [], [], {}
    for task_path, heads_path in zip(args.tasks, args.heads, strict=True):
        task = read_task(task_path, ["validation", "evaluation"])
        results.require_same_run(heads_path, manifest, task.dataset_sha256)
        heads = read_table(heads_path).to_pandas()
        heads = heads[heads["split"] == "evaluation"]
        if heads.empty:
            raise ValueError(f"{heads_path}: no per-head effects of split 'evaluation'")
        e = effect_matrix(heads, "e", heads_path)
        split = task.frame["split"]
        val, ev = (
            model_inputs(task.frame[split == s], vocab) for s in ("validation", "evaluation")
        )
        identity = {"model": manifest["model_name"], "seed": int(manifest["init_seed"]),
                    "task": task.name}  # fmt: skip
        summary, per_direction = coordinates.coordinate_rows(
            model, e, val, ev, args.n_random_sets, args.null_seed, args.rotation_seed,
            args.batch_size, args.max_rows,
        )  # fmt: skip
        rows += [{**identity, **row} for row in summary]
        directions += [{**identity, **row} for row in per_direction]
        sources[f"{task.name}_heads_sha256"] = sha256_file(heads_path)
    metadata = {
        # version 2: the null draws without the selected directions
        **results.file_metadata("coordinates", "2", manifest),
        **sources,
        "selection_split": "validation",
        "report_split": "evaluation",
        "null_draw": "per magnitude decile (validation), the selected directions excluded; "
        "short deciles merged (null_strata)",
        "p_value_definition": "(1 + #{random share >= selected share}) / (1 + n_random_sets)",
        "device": str(device),
        "threads": args.threads,
    }
    frame = pd.DataFrame(rows, columns=results.COORDINATES.names)
    results.COORDINATES.write(args.out, frame, metadata)
    per_direction = pd.DataFrame(directions, columns=results.COORDINATE_DIRECTIONS.names)
    results.COORDINATE_DIRECTIONS.write(args.out_directions, per_direction, metadata)
    sva = frame[(frame["task"] == "sva")].set_index("site")["share_evaluation"].round(3)
    print(f"wrote {len(frame)} rows; SVA shares {sva.to_dict()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
