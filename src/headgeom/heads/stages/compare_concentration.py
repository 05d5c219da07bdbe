"""Paired bootstrap of N_eff differences between models on one task (docs §12.4, §12.6).

    python -m headgeom.heads.stages.compare_concentration --task sva --split evaluation \\
        --pairs '[{"model_a": ..., "seed_a": 42, "model_b": ..., "seed_b": 42, ...}]' \\
        --effects a.parquet b.parquet ... --n-bootstrap 2000 --bootstrap-seed 1204 \\
        --out-paired paired.parquet --out-logo paired_logo.parquet

For each pair (A, B) the two models must have been patched on the same examples (same
example ids and lexical groups; same task dataset hash when both files record one): the same
resampled example indices are applied to both, and N_eff(A) − N_eff(B) gets a percentile
interval. Leaving out each lexical group in turn checks whether the difference changes sign
(headgeom.heads.analysis.concentration.paired_tables).
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import results
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import concentration as conc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--pairs", required=True, help="JSON list of resolved pairs")
    parser.add_argument("--effects", nargs="+", required=True, help="effects Parquets")
    parser.add_argument("--n-bootstrap", type=int, required=True)
    parser.add_argument("--bootstrap-seed", type=int, required=True)
    parser.add_argument("--ci", type=float, required=True)
    parser.add_argument("--out-paired", required=True)
    parser.add_argument("--out-logo", required=True)
    args = parser.parse_args(argv)
    if args.n_bootstrap < 1:
        parser.error("--n-bootstrap must be at least 1")
    if not 0.0 < args.ci < 1.0:
        parser.error(f"--ci must be in (0, 1), got {args.ci}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pairs = json.loads(args.pairs)
    if not pairs:
        raise ValueError("--pairs lists no pairs; nothing to compare")
    drops = conc.read_drops(args.effects, args.task, args.split)
    paired, logo = conc.paired_tables(
        pairs, drops, args.task, args.split, args.n_bootstrap, args.bootstrap_seed, args.ci
    )
    for row in paired.to_dict("records"):
        print(
            f"{args.task} {row['pair_label']}: {row['diff']:+.3f} "
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], "
            f"{row['logo_sign_reversals']} LOGO sign reversals",
            file=sys.stderr,
        )
    metadata = {
        **results.file_metadata("compare_concentration"),
        "task": args.task,
        "analysis_split": args.split,
        "n_bootstrap": args.n_bootstrap,
        "bootstrap_seed": args.bootstrap_seed,
        "bootstrap_rng": f"{conc.BOOTSTRAP_RNG}; the same multiplicities for A and B",
        "ci_level": args.ci,
        "effects_sha256": {
            f"{m} s{s}": sha256_file(one.path) for (m, s), one in sorted(drops.items())
        },
    }
    results.PAIRED.write(args.out_paired, paired, metadata)
    results.PAIRED_LOGO.write(args.out_logo, logo, metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
