"""One shard of the atlas's sweep: the edits dealt to this shard (every ``shards``-th of the
model's edit list, from ``shard``), each scored on every corpus's scored windows (KL,
Δ top-1) and every skill (retention), the clean prefix reused
(:func:`headgeom.atlas.sweep.sweep`).

    python -m headgeom.atlas.stages.sweep --config-json '{"model":{...},"edits":{...},
        "sweep":{...}}' --windows windows.parquet --probes probes.parquet --shard 0 \\
        --threads 1 --out-effects effects_0.parquet --out-retention retention_0.parquet

Average's means come from the means windows of every corpus (positions t ≥ 1), rows→mean's
from the tables themselves; both are computed here, the same in every shard.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from tqdm import tqdm

from headgeom import results
from headgeom.atlas import artifacts, edits
from headgeom.atlas import results as atlas_results
from headgeom.atlas import sweep as atlas_sweep
from headgeom.runtime import pick_device, set_threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.sweep_config()")
    p.add_argument("--windows", required=True, help="atlas_windows Parquet")
    p.add_argument("--probes", required=True, help="atlas_probes Parquet")
    p.add_argument("--shard", type=int, required=True, help="this job's shard (0-based)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out-effects", required=True)
    p.add_argument("--out-retention", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    run, shards = cfg["sweep"], int(cfg["sweep"]["shards"])
    if not 0 <= args.shard < shards:
        p.error(f"--shard {args.shard} is outside 0..{shards - 1}")
    set_threads(args.threads)
    model, source = artifacts.load_model(cfg["model"], pick_device(run["device"]))
    means_windows, scored, windows_meta = artifacts.read_windows(args.windows)
    skills = artifacts.read_skills(args.probes)
    todo = edits.atlas_edits(model, cfg["edits"]["kinds"], cfg["edits"]["everywhere"])
    mine = todo[args.shard :: shards]
    means = edits.write_means(model, torch.cat(list(means_windows.values())), run["batch_size"])
    tables = edits.needed_tables(model, mine)
    steps = len(mine) * (sum(-(-len(w) // run["batch_size"]) for w in scored.values())
                         + len(skills))  # fmt: skip
    with tqdm(total=steps, desc=f"shard {args.shard}", unit="edit", file=sys.stderr) as bar:
        effects, kept = atlas_sweep.sweep(
            model, mine, scored, skills, means, tables, run["batch_size"], run["kl_chunk"],
            run["probe_rows"], progress=bar.update,
        )  # fmt: skip
    metadata = {
        **results.file_metadata("atlas_sweep"),
        "model_source": source,
        "windows_corpora": windows_meta.get("corpora"),
        "shard": f"{args.shard} of {shards}",
        "edits": [e.label for e in mine],
        "edits_total": len(todo),
        "threads": args.threads,
        "dtype": "float32 forward, float64 KL",
    }
    atlas_results.EFFECTS.write(args.out_effects, effects, metadata)
    atlas_results.RETENTION.write(args.out_retention, kept, metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
