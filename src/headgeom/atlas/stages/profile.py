"""The atlas's per-layer profile: for every block, its write size, constant part and volume
knob, and per layer the old state carried (:func:`headgeom.atlas.measures.profile`), on the
means windows of every corpus (positions t ≥ 1).

    python -m headgeom.atlas.stages.profile --config-json '{"model":{...},"sweep":{...}}' \\
        --windows windows.parquet --threads 1 --out profile.parquet
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd
import torch

from headgeom import results
from headgeom.atlas import artifacts, measures
from headgeom.atlas import results as atlas_results
from headgeom.runtime import pick_device, set_threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.profile_config()")
    p.add_argument("--windows", required=True, help="atlas_windows Parquet")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    set_threads(args.threads)
    model, source = artifacts.load_model(cfg["model"], pick_device(cfg["sweep"]["device"]))
    means_windows, _, windows_meta = artifacts.read_windows(args.windows)
    windows = torch.cat(list(means_windows.values()))
    rows = measures.profile(model, windows, cfg["sweep"]["batch_size"])
    atlas_results.PROFILE.write(args.out, pd.DataFrame(rows), {
        **results.file_metadata("atlas_profile"), "model_source": source,
        "windows_corpora": windows_meta.get("corpora"), "positions": measures.PROFILE_POSITIONS,
        "n_windows": len(windows)})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
