"""Lane score Λ and its within-layer permutation test (METHODS §10.5).

    python src/lanes.py --heads heads.parquet --split discovery \\
        --n-permutations 5000 --seed 5000 --out lanes.parquet

Reads the per-head effects of src/concentration.py and writes one row per
(model, seed, task): Λ of the split's effects (null when undefined: no positive effects in
two different layers), its one-sided upper permutation p-value (1 + #{Λ_perm ≥ Λ})/(1 + n),
and the chance level 1/H.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headgeom.analysis.lanes import lane_permutation_test
from headgeom.analysis.patching import metadata_text
from headgeom.hashing import sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, write_parquet

IDENTITY = ["model", "seed", "task"]
CARRIED_METADATA = ("effects_sha256", "checkpoint_sha256", "task_dataset_sha256")

SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
        ("lambda_score", pa.float64()),
        ("p_value", pa.float64()),
        ("n_permutations", pa.int64()),
        ("permutation_seed", pa.int64()),
        ("chance", pa.float64()),
        ("n_layers", pa.int32()),
        ("n_heads", pa.int32()),
    ]
)
DESCRIPTIONS = {
    "split": "split whose effects e_{l,h} were used",
    "lambda_score": "Λ: share of cross-layer positive-effect pair mass in same-index pairs; "
    "null when undefined",
    "p_value": "one-sided upper permutation p, (1 + #{Λ_perm ≥ Λ}) / (1 + n_permutations), "
    "head labels shuffled within each layer; uncorrected; null when Λ is undefined",
    "n_permutations": "permutations drawn",
    "permutation_seed": "seed of numpy Generator(PCG64) for the permutations",
    "chance": "1 / n_heads",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, help="heads Parquet (src/concentration.py)")
    parser.add_argument("--split", default="discovery", help="split of the effects to use")
    parser.add_argument("--n-permutations", type=int, default=5000)
    parser.add_argument("--seed", type=int, required=True, help="permutation RNG seed")
    parser.add_argument("--out", required=True, help="lanes Parquet")
    args = parser.parse_args(argv)
    if args.n_permutations < 1:
        parser.error(f"--n-permutations must be at least 1, got {args.n_permutations}")
    return args


def effect_matrix(rows: pd.DataFrame, where: str) -> np.ndarray:
    """e (L, H) from one (model, seed, task, split) group of heads rows; must be complete."""
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    if len(rows) != n_layers * n_heads or rows.duplicated(["layer", "head"]).any():
        raise ValueError(
            f"{where}: expected one row per (layer, head) of a {n_layers}×{n_heads} grid"
        )
    e = np.empty((n_layers, n_heads))
    e[rows["layer"].to_numpy(), rows["head"].to_numpy()] = rows["e"].to_numpy(np.float64)
    return e


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    heads = pq.read_table(args.heads).to_pandas()
    available = list(pd.unique(heads["split"]))
    if args.split not in available:
        raise ValueError(f"{args.heads}: split {args.split!r} not present (has {available})")
    heads = heads[heads["split"] == args.split]

    records = []
    for key, rows in heads.groupby(IDENTITY, sort=True):
        e = effect_matrix(rows, f"{args.heads} {dict(zip(IDENTITY, key, strict=True))}")
        lam, p_value, _ = lane_permutation_test(e, args.n_permutations, seed=args.seed)
        records.append(
            {
                **dict(zip(IDENTITY, key, strict=True)),
                "split": args.split,
                "lambda_score": lam,
                "p_value": p_value,
                "n_permutations": args.n_permutations,
                "permutation_seed": args.seed,
                "chance": 1.0 / e.shape[1],
                "n_layers": e.shape[0],
                "n_heads": e.shape[1],
            }
        )

    meta = read_parquet_metadata(args.heads)
    write_parquet(
        args.out,
        pd.DataFrame(records, columns=SCHEMA.names),
        SCHEMA,
        metadata={
            "analysis": "lanes",
            "analysis_version": "1",
            "heads_sha256": sha256_file(args.heads),
            **{k: metadata_text(meta, k, args.heads) for k in CARRIED_METADATA if k in meta},
            "split": args.split,
            "n_permutations": args.n_permutations,
            "permutation_seed": args.seed,
            "p_value_definition": "(1 + #{perm >= obs}) / (1 + n), within-layer shuffles, "
            "no multiple-comparison correction",
            "source": source_freeze(),
        },
        descriptions=DESCRIPTIONS,
    )
    print(f"wrote {len(records)} lane rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
