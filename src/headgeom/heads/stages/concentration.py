"""Concentration of head-patching effects and its robustness (docs §10.2–10.4, §12).

    python -m headgeom.heads.stages.concentration --effects sva.parquet quote.parquet \\
        --split evaluation \\
        --n-bootstrap 2000 --bootstrap-seed 1204 --n-permutations 5000 --permutation-seed 1004 \\
        --out-summary sva.s.parquet quote.s.parquet --out-heads sva.h.parquet quote.h.parquet \\
        --out-robustness ... --out-conditions ... --out-logo ...

Per effects file (one job per run: every task's file, so the interpreter and its imports
start once), one summary row per split and one heads row per (split, layer, head); with the
three §12 outputs, the analysis split (``--split``) also gets robustness, conditions and
logo (headgeom.heads.analysis.concentration; columns in headgeom.results). Every ``--out-*`` takes
one path per ``--effects``, in order. Checks C10 (e, E and N_eff recomputed from the effects
file by another route) and C11 are logged in every output's metadata; C10 or C11 failing
stops the job before that file's outputs are written.
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import checks, results
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import concentration as conc
from headgeom.io import read_parquet_metadata, read_table

ROBUSTNESS_OUTPUTS = ("robustness", "conditions", "logo")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--effects", nargs="+", required=True, help="effects Parquets (heads/stages/patch_heads.py)"
    )
    parser.add_argument("--split", required=True, help="analysis split of §12")
    parser.add_argument("--n-bootstrap", type=int, required=True)
    parser.add_argument("--bootstrap-seed", type=int, help="needed with the §12 outputs")
    parser.add_argument("--n-permutations", type=int, required=True)
    parser.add_argument("--permutation-seed", type=int, help="needed with the §12 outputs")
    parser.add_argument("--ci", type=float, required=True, help="percentile interval level")
    parser.add_argument("--index-meaningful", choices=["true", "false"], required=True)
    parser.add_argument("--out-summary", nargs="+", required=True, help="per-split summaries")
    parser.add_argument("--out-heads", nargs="+", required=True, help="per-head effects")
    for name in ROBUSTNESS_OUTPUTS:
        parser.add_argument(f"--out-{name}", nargs="+", help=f"§12 {name} (all three or none)")
    args = parser.parse_args(argv)
    given = [n for n in ROBUSTNESS_OUTPUTS if getattr(args, f"out_{n}")]
    for name in ("summary", "heads", *given):
        if len(getattr(args, f"out_{name}")) != len(args.effects):
            parser.error(
                f"{len(args.effects)} --effects files but "
                f"{len(getattr(args, f'out_{name}'))} --out-{name} (one per file)"
            )
    if given and len(given) != len(ROBUSTNESS_OUTPUTS):
        parser.error(f"give all of --out-{{{','.join(ROBUSTNESS_OUTPUTS)}}} or none")
    if given and (args.bootstrap_seed is None or args.permutation_seed is None):
        parser.error("the §12 outputs need --bootstrap-seed and --permutation-seed (from config)")
    for name in ("n_bootstrap", "n_permutations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.0 < args.ci < 1.0:
        parser.error(f"--ci must be in (0, 1), got {args.ci}")
    names = ("n_bootstrap", "bootstrap_seed", "n_permutations", "permutation_seed", "ci")
    args.resampling = None
    if given:
        meaningful = args.index_meaningful == "true"
        settings = {n: getattr(args, n) for n in names}
        args.resampling = conc.Resampling(**settings, index_meaningful=meaningful)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = ("summary", "heads", *ROBUSTNESS_OUTPUTS)
    outs = {name: getattr(args, f"out_{name}") for name in kinds}
    for i, path in enumerate(args.effects):
        concentrate(path, {name: paths[i] for name, paths in outs.items() if paths}, args)
    return 0


def concentrate(path: str, out_paths: dict[str, str], args: argparse.Namespace) -> None:
    """The concentration outputs ``out_paths`` (by name) of one effects file."""
    effects = read_table(path).to_pandas()
    meta = read_parquet_metadata(path)
    shape = [int(json.loads(meta[k])) if k in meta else None for k in ("n_layers", "n_heads")]
    out = conc.concentration_tables(effects, *shape, args.split, args.resampling, path)
    c10 = conc.check_c10(path, out.heads, out.summary, out.n_layers, out.n_heads)

    metadata = {
        **results.file_metadata(
            "concentration", "2", carried=results.carried_provenance(meta, path)
        ),
        **out.identity,
        "effects_sha256": sha256_file(path),
        "n_layers": out.n_layers,
        "n_heads": out.n_heads,
        **checks.enforce(
            "C10",
            c10,
            conc.C10_TOLERANCE,
            where=path,
            what="per-head means of the per-example effects vs e, E, N_eff",
            note="max |Δ| of e, E and N_eff, every split",
        ),
        **checks.record("C11", out.c11, conc.C11_TOLERANCE, "rel"),
    }
    results.HEADS.write(out_paths["heads"], out.heads, metadata)
    results.SUMMARY.write(out_paths["summary"], out.summary, metadata)
    checked = f"C10 {c10:.2g}, C11 {out.c11:.2g}"
    print(f"{out.identity}: {len(out.summary)} splits, {checked}", file=sys.stderr)
    if args.resampling is None:
        return
    metadata = {
        **metadata,
        "analysis_split": args.split,
        **args.resampling.metadata(),
    }
    results.ROBUSTNESS.write(out_paths["robustness"], out.robustness, metadata)
    results.CONDITIONS.write(out_paths["conditions"], out.conditions, metadata)
    results.LOGO.write(out_paths["logo"], out.logo, metadata)
    r = out.robustness.iloc[0]
    ci = f"[{r['N_eff_ci_low']}, {r['N_eff_ci_high']}], N_index p {r['N_index_p_lower']}"
    print(f"{args.split}: N_eff {r['N_eff']} {ci}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
