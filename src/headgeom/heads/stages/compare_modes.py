"""Concentration per head-patching ablation mode, side by side (docs §10.6).

    python -m headgeom.heads.stages.compare_modes --split evaluation --base-mode resample \\
        --input resample SUMMARY HEADS LANES --input mean SUMMARY HEADS LANES ... \
        --out modes.parquet

Each ``--input`` gives one (run, task)'s concentration summary, heads and lanes Parquets of
one mode (heads/stages/concentration.py and heads/stages/lanes.py on that mode's effects).
Writes one row per
(model, seed, task, mode): N_eff, E, top-head share, N_index × N_layer|index, Λ, and against
the base mode the Spearman ρ of per-head effects and the N_eff and E ratios
(headgeom.heads.analysis.ablation_modes.mode_comparison).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.hashing import sha256_file
from headgeom.heads.analysis.ablation_modes import mode_comparison
from headgeom.io import metadata_text, read_parquet_metadata, read_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs=4, action="append", required=True,
                   metavar=("MODE", "SUMMARY", "HEADS", "LANES"))  # fmt: skip
    p.add_argument("--split", required=True, help="split of N_eff, E and ρ")
    p.add_argument("--base-mode", required=True, help="the study's patching.mode")
    p.add_argument("--out", required=True, help="mode-comparison Parquet")
    return p.parse_args(argv)


def read(path: str, mode: str) -> pd.DataFrame:
    """A Parquet with a ``mode`` column; refuse one whose recorded mode is another."""
    meta = read_parquet_metadata(path)
    found = metadata_text(meta, results.PATCH_MODE, path) if results.PATCH_MODE in meta else None
    if found is not None and found != mode:
        raise SystemExit(f"{path}: computed from {found} effects, given as {mode}")
    return read_table(path).to_pandas().assign(mode=mode)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    frames = {k: [] for k in ("summary", "heads", "lanes")}
    sources = {}
    for mode, *paths in args.input:
        for kind, path in zip(frames, paths, strict=True):
            frames[kind].append(read(path, mode))
            sources[path] = sha256_file(path)
    table = mode_comparison(*(pd.concat(f, ignore_index=True) for f in frames.values()),
                            args.split, args.base_mode)  # fmt: skip
    metadata = {
        **results.file_metadata("compare_modes"),
        "split": args.split,
        "base_mode": args.base_mode,
        "inputs_sha256": sources,
    }
    results.ABLATION_MODES.write(args.out, table, metadata)
    print(table[["model", "task", "mode", "N_eff", "N_eff_ratio", "spearman_vs_base"]]
          .to_string(index=False), file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
