"""The summaries of paper §5.1 from the leakage rows (docs §11.3–11.6, §16.1).

    python -m headgeom.heads.stages.exclusivity --leakage L.parquet... --heads H.parquet... \\
        --runs LOG.parquet... \\
        --out-summary exclusivity.parquet --out-pairs pairs.parquet --out-heads heads.parquet

Top-3 heads per model–task (evaluation signed e; |e| logged; discovery re-selection), their
ordered pairs with the mid-rank and layer-matched percentiles of L, the direct/total response
medians and the attention-TV summaries, and per-task and pooled leakage summaries; all read
from the leakage stage's rows (no forward pass here). headgeom.heads.analysis.exclusivity.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.heads.analysis.exclusivity import exclusivity_tables
from headgeom.heads.paper.inputs import read_runs
from headgeom.io import read_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leakage", nargs="+", required=True, help="leakage Parquets")
    parser.add_argument("--heads", nargs="+", required=True, help="concentration heads Parquets")
    parser.add_argument("--runs", nargs="+", required=True, help="train logs (geometry)")
    parser.add_argument("--out-summary", required=True)
    parser.add_argument("--out-pairs", required=True)
    parser.add_argument("--out-heads", required=True)
    return parser.parse_args(argv)


def _read(paths: list[str], table: results.ResultTable, columns: list[str]) -> pd.DataFrame:
    wanted = table.columns(*columns)
    frames = []
    for path in paths:  # read_table names a missing column and the file
        frames.append(read_table(path, columns=wanted).to_pandas())
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    leak = _read(args.leakage, results.LEAKAGE, results.LEAKAGE.schema.names)
    splits = sorted(set(leak["split"]))
    if len(splits) != 1:
        raise ValueError(f"--leakage: the files mix splits {splits}; give one split")
    heads = _read(
        args.heads, results.HEADS, ["model", "seed", "task", "split", "layer", "head", "e"]
    )
    runs = read_runs(args.runs)
    geometry = {(m, int(s)): g for m, s, g in runs[["model", "seed", "geometry"]].values}
    missing = sorted({(m, int(s)) for m, s in leak[["model", "seed"]].values} - set(geometry))
    if missing:
        raise ValueError(f"--runs: no training log for {missing}")
    out = exclusivity_tables(leak, heads, geometry, splits[0])
    metadata = {**results.file_metadata("exclusivity"), "split": splits[0]}
    results.EXCLUSIVITY.write(args.out_summary, out.summary, metadata)
    results.EXCLUSIVITY_PAIRS.write(args.out_pairs, out.pairs, metadata)
    results.EXCLUSIVITY_HEADS.write(args.out_heads, out.heads, metadata)
    print(f"{len(out.summary)} numbers, {len(out.pairs)} top-pair rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
