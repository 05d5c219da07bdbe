"""The grafts of a pair of checkpoints: each tensor group of B put into A and of A into B,
and each layer's norms or linear weights one layer at a time (config ``pairs[].grafts``),
scored on the pair's windows and probes against both ends (:mod:`headgeom.atlas.pair_views`).

    python -m headgeom.atlas.stages.pair_grafts --config-json '{"name":..,"a":{..},"b":{..},
        ...}' --windows windows.parquet --probes probes.parquet --threads 1 \\
        --out grafts.parquet
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
    run, which = cfg["sweep"], cfg["grafts"]
    set_threads(args.threads)
    try:
        model, a, b, sources = views.load_pair(cfg, pick_device(run["device"]))
        _, scored, windows_meta = artifacts.read_windows(args.windows)
        skills = artifacts.read_skills(args.probes)
        scorer = views.PairScorer(model, a, b, scored, skills, run["batch_size"], run["kl_chunk"],
                                  run["probe_rows"])  # fmt: skip
    except (views.PairError, ValueError) as err:
        sys.exit(f"atlas_pair_grafts: {err}")
    todo = list(views.graft_variants(a, b, which["groups"], which["layers"]))
    rows = []
    for keys, weights in tqdm(todo, desc=f"grafts {cfg['name']}", unit="graft", file=sys.stderr):
        rows += views.scored_rows(scorer.score(weights), scorer.base_correct,
                                  {"pair": cfg["name"], **keys})  # fmt: skip
    scorer.restore()
    columns = atlas_results.PAIR_GRAFTS.names
    metadata = {
        **results.file_metadata("atlas_pair_grafts"),
        "pair": cfg["name"],
        "sources": sources,
        "windows_corpora": windows_meta.get("corpora"),
        "grafts": which,
        "threads": args.threads,
    }
    atlas_results.PAIR_GRAFTS.write(args.out, pd.DataFrame(rows, columns=columns), metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
