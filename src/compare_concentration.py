"""Paired bootstrap of N_eff differences between models on one task (METHODS §12.4, §12.6).

    python src/compare_concentration.py --task sva --split evaluation \\
        --pairs '[{"model_a": ..., "seed_a": 42, "model_b": ..., "seed_b": 42, ...}]' \\
        --effects a.parquet b.parquet ... --n-bootstrap 2000 --bootstrap-seed 1204 \\
        --out-paired paired.parquet --out-logo paired_logo.parquet

For each pair (A, B) the two models must have been patched on the same examples (same
example ids and lexical groups; same task dataset hash when both files record one): the same
resampled example indices are applied to both, and N_eff(A) − N_eff(B) gets a percentile
interval. Leaving out each lexical group in turn checks whether the difference changes sign.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headgeom.analysis.patching import drops_array, metadata_text
from headgeom.analysis.stats import (
    effects_from_drops,
    group_weights,
    n_eff_batch,
    paired_bootstrap_n_eff_difference,
    percentile_interval,
    weighted_effects,
)
from headgeom.hashing import sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, write_parquet

PAIR_FIELDS = [
    ("task", pa.string()),
    ("split", pa.string()),
    ("model_a", pa.string()),
    ("seed_a", pa.int64()),
    ("model_b", pa.string()),
    ("seed_b", pa.int64()),
    ("pair_label", pa.string()),
]
PAIRED_SCHEMA = pa.schema(
    PAIR_FIELDS
    + [
        ("n_examples", pa.int64()),
        ("N_eff_a", pa.float64()),
        ("N_eff_b", pa.float64()),
        ("diff", pa.float64()),
        ("ratio", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("ci_level", pa.float64()),
        ("n_bootstrap", pa.int64()),
        ("bootstrap_seed", pa.int64()),
        ("resolved", pa.bool_()),
        ("logo_n_groups", pa.int64()),
        ("logo_sign_reversals", pa.int64()),
        ("logo_min_diff", pa.float64()),
        ("logo_max_diff", pa.float64()),
        ("logo_reversal_groups", pa.string()),
    ]
)
_PAIR_DESCRIPTIONS = {
    "split": "analysis split (config concentration.split)",
    "model_a": "model A of the difference N_eff(A) − N_eff(B)",
    "seed_a": "training seed of model A",
    "model_b": "model B",
    "seed_b": "training seed of model B",
    "pair_label": "'<A> s<seed> − <B> s<seed>'",
}
PAIRED_DESCRIPTIONS = {
    **_PAIR_DESCRIPTIONS,
    "n_examples": "examples shared by both models",
    "N_eff_a": "N_eff of A on all shared examples",
    "N_eff_b": "N_eff of B on all shared examples",
    "diff": "N_eff(A) − N_eff(B) on all shared examples",
    "ratio": "N_eff(A) / N_eff(B)",
    "ci_low": "lower end of the paired-bootstrap percentile interval of diff (METHODS §12.4)",
    "ci_high": "upper end of that interval",
    "ci_level": "coverage of the interval (0.95: the 2.5 and 97.5 percentiles)",
    "n_bootstrap": "paired resamples: the same example multiplicities applied to A and B",
    "bootstrap_seed": "seed of numpy Generator(PCG64) for the resamples",
    "resolved": "the interval excludes 0",
    "logo_n_groups": "lexical groups left out in turn (METHODS §12.6)",
    "logo_sign_reversals": "left-out groups whose diff has the opposite sign of diff",
    "logo_min_diff": "smallest diff over left-out groups",
    "logo_max_diff": "largest diff over left-out groups",
    "logo_reversal_groups": "comma-separated groups whose removal reverses the sign ('' if none)",
}
LOGO_SCHEMA = pa.schema(
    PAIR_FIELDS
    + [
        ("lexical_group", pa.string()),
        ("n_kept", pa.int64()),
        ("N_eff_a", pa.float64()),
        ("N_eff_b", pa.float64()),
        ("diff", pa.float64()),
        ("sign_reversed", pa.bool_()),
    ]
)
LOGO_DESCRIPTIONS = {
    **_PAIR_DESCRIPTIONS,
    "lexical_group": "lexical group left out of both models (METHODS §12.6)",
    "n_kept": "examples kept",
    "N_eff_a": "N_eff of A without the group",
    "N_eff_b": "N_eff of B without the group",
    "diff": "N_eff(A) − N_eff(B) without the group",
    "sign_reversed": "diff has the opposite sign of the all-example diff",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--split", default="evaluation")
    parser.add_argument("--pairs", required=True, help="JSON list of resolved pairs")
    parser.add_argument("--effects", nargs="+", required=True, help="effects Parquets")
    parser.add_argument("--n-bootstrap", type=int, default=2000)
    parser.add_argument("--bootstrap-seed", type=int, required=True)
    parser.add_argument("--ci", type=float, default=0.95)
    parser.add_argument("--out-paired", required=True)
    parser.add_argument("--out-logo", required=True)
    args = parser.parse_args(argv)
    if args.n_bootstrap < 1:
        parser.error("--n-bootstrap must be at least 1")
    if not 0.0 < args.ci < 1.0:
        parser.error(f"--ci must be in (0, 1), got {args.ci}")
    return args


class Drops:
    """Per-example drops of one (model, seed) on the analysis split."""

    def __init__(self, path: str, task: str, split: str):
        self.path = path
        columns = ["model", "seed", "task", "split", "example_id", "lexical_group"]
        rows = pq.read_table(path, columns=[*columns, "layer", "head", "effect"]).to_pandas()
        if set(rows["task"]) != {task}:
            raise ValueError(f"{path}: expected task {task!r}, found {sorted(set(rows['task']))}")
        rows = rows[rows["split"] == split]
        if rows.empty:
            raise ValueError(f"{path}: no rows of the analysis split {split!r}")
        models, seeds = pd.unique(rows["model"]), pd.unique(rows["seed"])
        if len(models) != 1 or len(seeds) != 1:
            raise ValueError(f"{path}: expected one model and seed, found {models} {seeds}")
        self.key = (str(models[0]), int(seeds[0]))
        meta = read_parquet_metadata(path)
        self.dataset_sha256 = (
            metadata_text(meta, "task_dataset_sha256", path)
            if "task_dataset_sha256" in meta
            else None
        )
        shape = [int(json.loads(meta[k])) if k in meta else None for k in ("n_layers", "n_heads")]
        self.example_ids, self.d = drops_array(rows, *shape)
        groups = rows.drop_duplicates("example_id").set_index("example_id")["lexical_group"]
        self.groups = groups.loc[self.example_ids].to_numpy().astype(str)


def aligned(a: Drops, b: Drops) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d_a, d_b in A's example order, lexical groups); refuses different example sets."""
    if a.dataset_sha256 and b.dataset_sha256 and a.dataset_sha256 != b.dataset_sha256:
        raise ValueError(
            f"paired bootstrap needs identical datasets: {a.path} has task dataset "
            f"{a.dataset_sha256}, {b.path} has {b.dataset_sha256}"
        )
    ids_a, ids_b = set(a.example_ids.tolist()), set(b.example_ids.tolist())
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
        raise ValueError(
            f"paired bootstrap needs the same examples in both models: {a.path} has "
            f"{len(only_a)} example ids not in {b.path} (e.g. {only_a[:3]}) and the other "
            f"{len(only_b)} not in it (e.g. {only_b[:3]})"
        )
    order = pd.Index(b.example_ids).get_indexer(a.example_ids)
    if not np.array_equal(a.groups, b.groups[order]):
        raise ValueError(f"{a.path} and {b.path} assign different lexical groups to examples")
    return a.d, b.d[order], a.groups


def compare(pair: dict, a: Drops, b: Drops, args) -> tuple[dict, list[dict]]:
    d_a, d_b, groups = aligned(a, b)
    n_eff_a = float(n_eff_batch(effects_from_drops(d_a)))
    n_eff_b = float(n_eff_batch(effects_from_drops(d_b)))
    diff = n_eff_a - n_eff_b
    boot = paired_bootstrap_n_eff_difference(d_a, d_b, args.n_bootstrap, seed=args.bootstrap_seed)
    ci_low, ci_high = percentile_interval(boot, args.ci)
    ident = {"task": args.task, "split": args.split, **pair}
    logo = []
    names, weights = group_weights(groups, "leave_out")
    if len(names) > 1:  # leaving out the only group leaves nothing
        logo_a = n_eff_batch(weighted_effects(weights, d_a))
        logo_b = n_eff_batch(weighted_effects(weights, d_b))
        for g, w, na, nb in zip(names, weights, logo_a, logo_b, strict=True):
            logo.append(
                {
                    **ident,
                    "lexical_group": str(g),
                    "n_kept": int(w.sum()),
                    "N_eff_a": float(na),
                    "N_eff_b": float(nb),
                    "diff": float(na - nb),
                    "sign_reversed": bool(np.sign(na - nb) * np.sign(diff) < 0),
                }
            )
    logo_diffs = [r["diff"] for r in logo]
    row = {
        **ident,
        "n_examples": len(d_a),
        "N_eff_a": n_eff_a,
        "N_eff_b": n_eff_b,
        "diff": diff,
        "ratio": n_eff_a / n_eff_b,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "ci_level": args.ci,
        "n_bootstrap": args.n_bootstrap,
        "bootstrap_seed": args.bootstrap_seed,
        "resolved": bool(ci_low > 0 or ci_high < 0),
        "logo_n_groups": len(logo),
        "logo_sign_reversals": sum(r["sign_reversed"] for r in logo),
        "logo_min_diff": min(logo_diffs) if logo else None,
        "logo_max_diff": max(logo_diffs) if logo else None,
        "logo_reversal_groups": ",".join(r["lexical_group"] for r in logo if r["sign_reversed"]),
    }
    return row, logo


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pairs = json.loads(args.pairs)
    if not pairs:
        raise ValueError("--pairs lists no pairs; nothing to compare")
    drops = {}
    for path in args.effects:
        one = Drops(path, args.task, args.split)
        if one.key in drops:
            raise ValueError(f"{path} and {drops[one.key].path} both hold {one.key}")
        drops[one.key] = one
    rows, logo_rows = [], []
    for pair in pairs:
        keys = (pair["model_a"], int(pair["seed_a"])), (pair["model_b"], int(pair["seed_b"]))
        missing = [k for k in keys if k not in drops]
        if missing:
            raise ValueError(f"pair {pair['pair_label']}: no --effects file holds {missing}")
        row, logo = compare(pair, drops[keys[0]], drops[keys[1]], args)
        rows.append(row)
        logo_rows += logo
        print(
            f"{args.task} {pair['pair_label']}: {row['diff']:+.3f} "
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], "
            f"{row['logo_sign_reversals']} LOGO sign reversals",
            file=sys.stderr,
        )
    metadata = {
        "analysis": "compare_concentration",
        "analysis_version": "1",
        "task": args.task,
        "analysis_split": args.split,
        "n_bootstrap": args.n_bootstrap,
        "bootstrap_seed": args.bootstrap_seed,
        "bootstrap_rng": "numpy Generator(PCG64(seed)).integers(0, N, (n_bootstrap, N)); "
        "the same multiplicities for A and B",
        "ci_level": args.ci,
        "effects_sha256": {
            f"{m} s{s}": sha256_file(one.path) for (m, s), one in sorted(drops.items())
        },
        "source": source_freeze(),
    }
    write_parquet(args.out_paired, pd.DataFrame(rows), PAIRED_SCHEMA, metadata, PAIRED_DESCRIPTIONS)
    write_parquet(
        args.out_logo,
        pd.DataFrame(logo_rows, columns=LOGO_SCHEMA.names),
        LOGO_SCHEMA,
        metadata,
        LOGO_DESCRIPTIONS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
