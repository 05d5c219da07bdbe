"""The drift of a pair of checkpoints: ‖W_B − W_A‖ / ‖W_A‖ (Frobenius, float64) of every
tensor, with both norms, so a group's drift is √Σ‖ΔW‖² / √Σ‖W_A‖² over its tensors
(:func:`headgeom.atlas.pair_views.drift_rows`). No forward runs.

    python -m headgeom.atlas.stages.pair_drift --config-json '{"name":..,"a":{..},"b":{..}}' \
        --out drift.parquet
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from headgeom import results
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.pair_drift_config(pair)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    try:
        _, a, b, sources = views.load_pair(cfg, torch.device("cpu"))
    except (views.PairError, ValueError) as err:
        sys.exit(f"atlas_pair_drift: {err}")
    frame = views.drift_rows(a, b).assign(pair=cfg["name"])
    metadata = {**results.file_metadata("atlas_pair_drift"), "pair": cfg["name"],
                "sources": sources}  # fmt: skip
    atlas_results.PAIR_DRIFT.write(args.out, frame, metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
