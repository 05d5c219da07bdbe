"""Is the change between a pair of checkpoints low-rank? A plus the top-k singular directions
of ΔW = W_B − W_A on every linear layer, against a random k-dimensional slice of ΔW, a
fraction f of ΔW, and B minus its top-k directions (config ``pairs[].lowrank``; every other
tensor B's), scored on the pair's windows and probes against both ends
(:mod:`headgeom.atlas.pair_views`).

    python -m headgeom.atlas.stages.pair_lowrank --config-json '{"name":..,"a":{..},"b":{..},
        ...}' --windows windows.parquet --probes probes.parquet --threads 1 \\
        --out lowrank.parquet
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd
from tqdm import tqdm

from headgeom import results
from headgeom.atlas import artifacts
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results
from headgeom.runtime import pick_device, set_threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.pair_config(pair)")
    p.add_argument("--windows", required=True, help="the pair's atlas_windows Parquet")
    p.add_argument("--probes", required=True, help="the pair's atlas_probes Parquet")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    run, lr = cfg["sweep"], cfg["lowrank"]
    set_threads(args.threads)
    try:
        model, a, b, sources = views.load_pair(cfg, pick_device(run["device"]))
        _, scored, windows_meta = artifacts.read_windows(args.windows)
        skills = artifacts.read_skills(args.probes)
        scorer = views.PairScorer(model, a, b, scored, skills, run["batch_size"], run["kl_chunk"],
                                  run["probe_rows"])  # fmt: skip
    except (views.PairError, ValueError) as err:
        sys.exit(f"atlas_pair_lowrank: {err}")
    variants = views.lowrank_variants(a, b, lr["ks"], lr["fractions"], lr["minus_top"], lr["seed"])
    n = 2 * len(lr["ks"]) + len(lr["fractions"]) + (len(lr["ks"]) if lr["minus_top"] else 0)
    rows = []
    for keys, weights in tqdm(variants, total=n, desc=f"low rank {cfg['name']}", unit="variant",
                              file=sys.stderr):  # fmt: skip
        rows += views.scored_rows(scorer.score(weights), scorer.base_correct,
                                  {"pair": cfg["name"], **keys})  # fmt: skip
    scorer.restore()
    frame = pd.DataFrame(rows, columns=atlas_results.PAIR_LOWRANK.names)
    frame["k"] = frame["k"].astype("Int64")  # null for the fractions
    metadata = {
        **results.file_metadata("atlas_pair_lowrank"),
        "pair": cfg["name"],
        "sources": sources,
        "windows_corpora": windows_meta.get("corpora"),
        "lowrank": lr,
        "threads": args.threads,
        "dtype": "partial changes in float64, stored in the model's dtype (float32)",
    }
    atlas_results.PAIR_LOWRANK.write(args.out, frame, metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
