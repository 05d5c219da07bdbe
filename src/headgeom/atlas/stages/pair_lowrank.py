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

import sys

import pandas as pd
from tqdm import tqdm

from headgeom.atlas import pair_scoring
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results


def main(argv: list[str] | None = None) -> int:
    args = pair_scoring.parser(__doc__).parse_args(argv)
    pair = pair_scoring.open_pair(args, "atlas_pair_lowrank")
    cfg, scorer, a, b = pair.cfg, pair.scorer, pair.a, pair.b
    lr = cfg["lowrank"]
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
    metadata = pair.metadata("atlas_pair_lowrank", args.threads, lowrank=lr,
                             dtype="partial changes in float64, stored in the model's dtype "
                             "(float32)")  # fmt: skip
    atlas_results.PAIR_LOWRANK.write(args.out, frame, metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
