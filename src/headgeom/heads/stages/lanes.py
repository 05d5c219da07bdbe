"""Lane score Λ and its within-layer permutation test (docs §10.5).

    python -m headgeom.heads.stages.lanes --heads sva.heads.parquet quote.heads.parquet \\
        --split discovery \\
        --n-permutations 5000 --seed 5000 --out sva.parquet quote.parquet

Reads the per-head effects of heads/stages/concentration.py and writes, per heads file (one job per
run: every task's file), one row per (model, seed, task): Λ of the split's effects (null
when undefined: no positive effects in two different layers), its one-sided upper
permutation p-value (1 + #{Λ_perm ≥ Λ})/(1 + n), and the chance level 1/H
(headgeom.heads.analysis.lanes.lane_rows).
"""

from __future__ import annotations

import argparse
import sys

from headgeom import results
from headgeom.hashing import sha256_file
from headgeom.heads.analysis.lanes import lane_rows
from headgeom.io import read_parquet_metadata, read_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--heads", nargs="+", required=True, help="heads Parquets (heads/stages/concentration.py)"
    )
    parser.add_argument("--split", required=True, help="split of the effects to use")
    parser.add_argument("--n-permutations", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True, help="permutation RNG seed")
    parser.add_argument("--out", nargs="+", required=True, help="lanes Parquet per --heads")
    args = parser.parse_args(argv)
    if len(args.out) != len(args.heads):
        parser.error(f"{len(args.heads)} --heads files but {len(args.out)} --out (one per file)")
    if args.n_permutations < 1:
        parser.error(f"--n-permutations must be at least 1, got {args.n_permutations}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path, out in zip(args.heads, args.out, strict=True):
        lanes_of(path, out, args)
    return 0


def lanes_of(path: str, out: str, args: argparse.Namespace) -> None:
    """Λ and its permutation test of one heads file, written to ``out``."""
    heads = read_table(path).to_pandas()
    lanes = lane_rows(heads, args.split, args.n_permutations, args.seed, path)
    meta = read_parquet_metadata(path)
    metadata = {
        **results.file_metadata("lanes", carried=results.carried_provenance(meta, path)),
        "heads_sha256": sha256_file(path),
        **({"effects_sha256": meta["effects_sha256"]} if "effects_sha256" in meta else {}),
        "split": args.split,
        "n_permutations": args.n_permutations,
        "permutation_seed": args.seed,
        "p_value_definition": "(1 + #{perm >= obs}) / (1 + n), within-layer shuffles, "
        "no multiple-comparison correction",
    }
    results.LANES.write(out, lanes, metadata)
    print(f"wrote {len(lanes)} lane rows to {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
