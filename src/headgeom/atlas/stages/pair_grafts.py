"""The grafts of a pair of checkpoints: each tensor group of B put into A and of A into B,
and each layer's norms or linear weights one layer at a time (config ``pairs[].grafts``),
scored on the pair's windows and probes against both ends (:mod:`headgeom.atlas.pair_views`).

    python -m headgeom.atlas.stages.pair_grafts --config-json '{"name":..,"a":{..},"b":{..},
        ...}' --windows windows.parquet --probes probes.parquet --threads 1 \\
        --out grafts.parquet
"""

from __future__ import annotations

import sys

import pandas as pd
from tqdm import tqdm

from headgeom.atlas import pair_scoring
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results


def main(argv: list[str] | None = None) -> int:
    args = pair_scoring.parser(__doc__).parse_args(argv)
    pair = pair_scoring.open_pair(args, "atlas_pair_grafts")
    cfg, scorer, a, b = pair.cfg, pair.scorer, pair.a, pair.b
    which = cfg["grafts"]
    todo = list(views.graft_variants(a, b, which["groups"], which["layers"]))
    rows = []
    for keys, weights in tqdm(todo, desc=f"grafts {cfg['name']}", unit="graft", file=sys.stderr):
        rows += views.scored_rows(scorer.score(weights), scorer.base_correct,
                                  {"pair": cfg["name"], **keys})  # fmt: skip
    scorer.restore()
    columns = atlas_results.PAIR_GRAFTS.names
    metadata = pair.metadata("atlas_pair_grafts", args.threads, grafts=which)
    atlas_results.PAIR_GRAFTS.write(args.out, pd.DataFrame(rows, columns=columns), metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
