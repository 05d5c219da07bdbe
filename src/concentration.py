"""Concentration of head-patching effects and its robustness (METHODS §10.2–10.4, §12).

    python src/concentration.py --effects effects.parquet --split evaluation \\
        --n-bootstrap 2000 --bootstrap-seed 1204 --n-permutations 5000 --permutation-seed 1004 \\
        --out-summary s.parquet --out-heads h.parquet --out-robustness r.parquet \\
        --out-conditions c.parquet --out-logo g.parquet

Per split, e_{l,h} is the signed mean drop over examples. The summary has one row per split
(E, N_eff, top-head share and head, N_index × N_layer|index); the heads file one row per
(split, layer, head). With the three §12 outputs, the analysis split (``--split``, the
evaluation split of §12) also gets the index-permutation null, per-example-absolute N_eff,
the bootstrap interval of N_eff and the leave-one-lexical-group-out summary (robustness, one
row), N_eff within each condition (conditions) and per left-out group (logo). Undefined
values (every effect zero) are null.
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
    bootstrap_n_eff,
    concentration,
    effects_abs_from_drops,
    effects_from_drops,
    index_layer_decomposition,
    index_permutation_null,
    leave_one_group_out_n_eff,
    percentile_interval,
)
from headgeom.hashing import sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, write_parquet

#: Check C11 (METHODS §18): N_eff = N_index · N_layer|index to this relative error.
C11_TOLERANCE = 1e-9
#: Check C10 (METHODS §12.4, §18): per-head means from the per-example arrays reproduce the
#: stored per-head effects and N_eff to this absolute error.
C10_TOLERANCE = 1e-5
IDENTITY = ("model", "seed", "task")
ROBUSTNESS_OUTPUTS = ("robustness", "conditions", "logo")
#: Provenance keys of the effects file that the outputs repeat.
CARRIED_METADATA = ("checkpoint_sha256", "manifest_content_hash", "task_dataset_sha256")

_ID_FIELDS = [("model", pa.string()), ("seed", pa.int64()), ("task", pa.string())]
_ID_FIELDS += [("split", pa.string())]

HEADS_SCHEMA = pa.schema(
    _ID_FIELDS
    + [
        ("layer", pa.int32()),
        ("head", pa.int32()),
        ("e", pa.float64()),
        ("p", pa.float64()),
    ]
)
HEADS_DESCRIPTIONS = {
    "e": "signed mean drop e_{l,h} over the split's examples, logit units (METHODS §10.1)",
    "p": "share |e_{l,h}| / E; null when every effect is zero (METHODS §10.2)",
}
SUMMARY_SCHEMA = pa.schema(
    _ID_FIELDS
    + [
        ("n_examples", pa.int64()),
        ("E", pa.float64()),
        ("N_eff", pa.float64()),
        ("top_head_share", pa.float64()),
        ("top_layer", pa.int32()),
        ("top_head", pa.int32()),
        ("N_index", pa.float64()),
        ("N_layer_given_index", pa.float64()),
    ]
)
_STAT_DESCRIPTIONS = {
    "n_examples": "examples averaged into e",
    "E": "Σ|e_{l,h}|, logit units: separate single-head interventions, not a joint one",
    "N_eff": "exp of the Shannon entropy (nats) of p = |e|/E: effective number of heads",
    "top_head_share": "max |e| / E",
    "N_index": "exp H(index marginal q_h = Σ_l p_{l,h}) (METHODS §10.3)",
    "N_layer_given_index": "exp Σ_h q_h H(layer | h); N_eff = N_index · N_layer_given_index",
    "N_eff_abs": "N_eff with p from the per-example-absolute effects E_x|d(x)| (METHODS §12.3)",
    "N_eff_abs_ratio": "N_eff_abs / N_eff",
}
SUMMARY_DESCRIPTIONS = {
    **{k: v for k, v in _STAT_DESCRIPTIONS.items() if k in SUMMARY_SCHEMA.names},
    "top_layer": "layer of the head with the largest |e| (first in row-major order on ties)",
    "top_head": "head index of that head",
}
ROBUSTNESS_SCHEMA = pa.schema(
    _ID_FIELDS
    + [
        ("n_examples", pa.int64()),
        ("n_layers", pa.int32()),
        ("n_heads", pa.int32()),
        ("E", pa.float64()),
        ("N_eff", pa.float64()),
        ("top_head_share", pa.float64()),
        ("N_index", pa.float64()),
        ("N_layer_given_index", pa.float64()),
        ("index_meaningful", pa.bool_()),
        ("N_index_null_median", pa.float64()),
        ("N_index_p_lower", pa.float64()),
        ("n_permutations", pa.int64()),
        ("permutation_seed", pa.int64()),
        ("N_eff_abs", pa.float64()),
        ("N_eff_abs_ratio", pa.float64()),
        ("N_eff_boot_median", pa.float64()),
        ("N_eff_ci_low", pa.float64()),
        ("N_eff_ci_high", pa.float64()),
        ("ci_level", pa.float64()),
        ("n_bootstrap", pa.int64()),
        ("bootstrap_seed", pa.int64()),
        ("n_lexical_groups", pa.int64()),
        ("logo_max_rel_change", pa.float64()),
        ("logo_max_rel_change_group", pa.string()),
        ("check_C10_max_abs_diff", pa.float64()),
    ]
)
ROBUSTNESS_DESCRIPTIONS = {
    **_STAT_DESCRIPTIONS,
    "split": "analysis split (config concentration.split; the evaluation split of METHODS §12)",
    "n_layers": "layers L of the model",
    "n_heads": "heads per layer H of the model",
    "index_meaningful": "the model has the base architecture's heads per layer, so head "
    "indices form the paper's lanes and the index decomposition/null are reported "
    "(METHODS §10.3: 12-head models); false for write-routed and multiscreen models",
    "N_index_null_median": "median N_index over within-layer head-index permutations (§10.4)",
    "N_index_p_lower": "lower one-sided p = (1 + #{N_index_null ≤ N_index}) / (1 + "
    "n_permutations); uncorrected across models",
    "n_permutations": "within-layer permutation draws of the index null",
    "permutation_seed": "seed of numpy Generator(PCG64) for the permutations",
    "N_eff_boot_median": "median N_eff over bootstrap resamples of the examples",
    "N_eff_ci_low": "lower end of the percentile bootstrap interval of N_eff (§12.4)",
    "N_eff_ci_high": "upper end of the percentile bootstrap interval of N_eff (§12.4)",
    "ci_level": "coverage of the percentile interval (0.95: 2.5 and 97.5 percentiles)",
    "n_bootstrap": "bootstrap resamples (examples drawn with replacement)",
    "bootstrap_seed": "seed of numpy Generator(PCG64) for the resamples (same indices as the "
    "paired bootstrap across models)",
    "n_lexical_groups": "lexical groups left out in turn (§12.6)",
    "logo_max_rel_change": "max over left-out lexical groups of |N_eff(without group) − N_eff| "
    "/ N_eff (§12.6)",
    "logo_max_rel_change_group": "lexical group whose removal changes N_eff most",
    "check_C10_max_abs_diff": "check C10: max |difference| between per-head means (and N_eff) "
    "from the per-example arrays and from an independent group-by of the stored rows",
}
CONDITIONS_SCHEMA = pa.schema(
    _ID_FIELDS
    + [
        ("condition", pa.string()),
        ("n_examples", pa.int64()),
        ("E", pa.float64()),
        ("N_eff", pa.float64()),
        ("top_head_share", pa.float64()),
        ("N_eff_abs", pa.float64()),
    ]
)
CONDITIONS_DESCRIPTIONS = {
    **{k: _STAT_DESCRIPTIONS[k] for k in ("E", "N_eff", "top_head_share", "N_eff_abs")},
    "n_examples": "examples of the condition (METHODS §12.5: 60 per condition)",
}
LOGO_SCHEMA = pa.schema(
    _ID_FIELDS
    + [
        ("lexical_group", pa.string()),
        ("n_dropped", pa.int64()),
        ("n_kept", pa.int64()),
        ("N_eff", pa.float64()),
        ("N_eff_all", pa.float64()),
        ("rel_change", pa.float64()),
    ]
)
LOGO_DESCRIPTIONS = {
    "lexical_group": "the lexical group left out (METHODS §12.6)",
    "n_dropped": "examples of the group, dropped",
    "n_kept": "examples kept",
    "N_eff": "N_eff on the kept examples",
    "N_eff_all": "N_eff on all examples of the split",
    "rel_change": "(N_eff − N_eff_all) / N_eff_all, signed",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", required=True, help="effects Parquet (src/patch_heads.py)")
    parser.add_argument("--split", default="evaluation", help="analysis split of §12")
    parser.add_argument("--n-bootstrap", type=int, default=2000)
    parser.add_argument("--bootstrap-seed", type=int, help="needed with the §12 outputs")
    parser.add_argument("--n-permutations", type=int, default=5000)
    parser.add_argument("--permutation-seed", type=int, help="needed with the §12 outputs")
    parser.add_argument("--ci", type=float, default=0.95, help="percentile interval level")
    parser.add_argument(
        "--index-meaningful",
        choices=["true", "false"],
        default="true",
        help="whether head indices form lanes (base head count; METHODS §10.3)",
    )
    parser.add_argument("--out-summary", required=True, help="per-split summary Parquet")
    parser.add_argument("--out-heads", required=True, help="per-head effects Parquet")
    for name in ROBUSTNESS_OUTPUTS:
        parser.add_argument(f"--out-{name}", help=f"§12 {name} Parquet (all three or none)")
    args = parser.parse_args(argv)
    given = [n for n in ROBUSTNESS_OUTPUTS if getattr(args, f"out_{n}")]
    if given and len(given) != len(ROBUSTNESS_OUTPUTS):
        parser.error(f"give all of --out-{{{','.join(ROBUSTNESS_OUTPUTS)}}} or none")
    args.robustness = bool(given)
    if args.robustness and (args.bootstrap_seed is None or args.permutation_seed is None):
        parser.error("the §12 outputs need --bootstrap-seed and --permutation-seed (from config)")
    for name in ("n_bootstrap", "n_permutations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.0 < args.ci < 1.0:
        parser.error(f"--ci must be in (0, 1), got {args.ci}")
    return args


def single_identity(frame: pd.DataFrame, path: str) -> dict:
    identity = {}
    for column in IDENTITY:
        values = pd.unique(frame[column])
        if len(values) != 1:
            raise ValueError(f"{path}: expected one {column}, found {list(values)}")
        identity[column] = values[0].item() if hasattr(values[0], "item") else values[0]
    return identity


def example_labels(rows: pd.DataFrame, example_ids: np.ndarray, path: str) -> pd.DataFrame:
    """condition and lexical_group of each example, in the order of ``example_ids``."""
    labels = rows.drop_duplicates(["example_id", "condition", "lexical_group"])
    if labels["example_id"].duplicated().any():
        bad = labels.loc[labels["example_id"].duplicated(), "example_id"].iloc[0]
        raise ValueError(f"{path}: example {bad!r} has more than one condition or lexical group")
    return labels.set_index("example_id").loc[example_ids, ["condition", "lexical_group"]]


def _or_none(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def split_statistics(e: np.ndarray, e_abs: np.ndarray) -> dict:
    """The per-split summary numbers of an effect matrix and its per-example-absolute twin."""
    stats = concentration(e)
    n_index, n_layer_given_index = index_layer_decomposition(e)
    n_eff_abs = concentration(e_abs)["N_eff"]
    top = stats["top_head"]
    return {
        "E": stats["E"],
        "N_eff": _or_none(stats["N_eff"]),
        "top_head_share": _or_none(stats["top_head_share"]),
        "top_layer": None if top is None else top[0],
        "top_head": None if top is None else top[1],
        "N_index": _or_none(n_index),
        "N_layer_given_index": _or_none(n_layer_given_index),
        "N_eff_abs": _or_none(n_eff_abs),
        "N_eff_abs_ratio": _or_none(n_eff_abs / stats["N_eff"]),
        "_p": stats["p"],
    }


def check_c10(rows: pd.DataFrame, e: np.ndarray, n_eff: float | None) -> float:
    """Max |Δ| between e (and N_eff) from the (N, L, H) array and a group-by of the rows."""
    means = rows.groupby(["layer", "head"])["effect"].mean()
    e_ref = np.zeros_like(e)
    e_ref[means.index.get_level_values(0), means.index.get_level_values(1)] = means.to_numpy()
    diff = float(np.max(np.abs(e_ref - e)))
    n_eff_ref = concentration(e_ref)["N_eff"]
    if n_eff is not None and np.isfinite(n_eff_ref):
        diff = max(diff, abs(n_eff_ref - n_eff))
    return diff


def robustness(
    rows: pd.DataFrame, example_ids: np.ndarray, d: np.ndarray, base: dict, args, path: str
) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The analysis-split row and the within-condition and leave-one-group-out tables."""
    labels = example_labels(rows, example_ids, path)
    e = effects_from_drops(d)
    null, p_lower = index_permutation_null(e, args.n_permutations, seed=args.permutation_seed)
    boot = bootstrap_n_eff(d, args.n_bootstrap, seed=args.bootstrap_seed)
    ci_low, ci_high = percentile_interval(boot, args.ci)

    cond_rows = []
    for condition in pd.unique(labels["condition"]):
        mask = (labels["condition"] == condition).to_numpy()
        stats = split_statistics(effects_from_drops(d[mask]), effects_abs_from_drops(d[mask]))
        cond_rows.append(
            {
                "condition": str(condition),
                "n_examples": int(mask.sum()),
                **{k: stats[k] for k in ("E", "N_eff", "top_head_share", "N_eff_abs")},
            }
        )

    groups, n_eff_logo = [], np.array([])
    lexical = labels["lexical_group"].to_numpy()
    if len(pd.unique(lexical)) > 1:  # leaving out the only group leaves nothing
        groups, n_eff_logo = leave_one_group_out_n_eff(d, lexical)
    n_eff_all = base["N_eff"]
    rel = np.full(len(groups), np.nan)
    if n_eff_all is not None:
        rel = (n_eff_logo - n_eff_all) / n_eff_all
    logo_rows = [
        {
            "lexical_group": str(g),
            "n_dropped": int((lexical == g).sum()),
            "n_kept": int((lexical != g).sum()),
            "N_eff": _or_none(n),
            "N_eff_all": n_eff_all,
            "rel_change": _or_none(r),
        }
        for g, n, r in zip(groups, n_eff_logo, rel, strict=True)
    ]
    finite = np.isfinite(rel)
    worst = int(np.argmax(np.where(finite, np.abs(rel), -1.0))) if finite.any() else None

    c10 = check_c10(rows, e, base["N_eff"])
    if c10 > C10_TOLERANCE:
        raise ArithmeticError(
            f"{path}: check C10 failed: per-head means from the per-example arrays differ from "
            f"a group-by of the stored rows by {c10:.3g} > {C10_TOLERANCE}"
        )
    row = {
        **{
            k: v
            for k, v in base.items()
            if not k.startswith("_") and k not in ("top_layer", "top_head")
        },
        "n_layers": d.shape[1],
        "n_heads": d.shape[2],
        "index_meaningful": args.index_meaningful == "true",
        "N_index_null_median": _or_none(float(np.median(null))),
        "N_index_p_lower": _or_none(p_lower),
        "n_permutations": args.n_permutations,
        "permutation_seed": args.permutation_seed,
        "N_eff_boot_median": _or_none(float(np.median(boot))),
        "N_eff_ci_low": _or_none(ci_low),
        "N_eff_ci_high": _or_none(ci_high),
        "ci_level": args.ci,
        "n_bootstrap": args.n_bootstrap,
        "bootstrap_seed": args.bootstrap_seed,
        "n_lexical_groups": len(pd.unique(lexical)),
        "logo_max_rel_change": None if worst is None else float(abs(rel[worst])),
        "logo_max_rel_change_group": None if worst is None else str(groups[worst]),
        "check_C10_max_abs_diff": c10,
    }
    return row, pd.DataFrame(cond_rows), pd.DataFrame(logo_rows, columns=LOGO_SCHEMA.names[4:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    effects = pq.read_table(args.effects).to_pandas()
    if effects.empty:
        raise ValueError(f"{args.effects}: no rows")
    meta = read_parquet_metadata(args.effects)
    carried = {k: metadata_text(meta, k, args.effects) for k in CARRIED_METADATA if k in meta}
    shape = {k: int(json.loads(meta[k])) for k in ("n_layers", "n_heads") if k in meta}
    identity = single_identity(effects, args.effects)
    splits = list(pd.unique(effects["split"]))
    if args.robustness and args.split not in splits:
        raise ValueError(
            f"{args.effects}: analysis split {args.split!r} (config concentration.split) was "
            f"not patched; the file has splits {splits}"
        )

    heads, summary, c11 = [], [], 0.0
    for split in splits:
        rows = effects[effects["split"] == split]
        example_ids, d = drops_array(rows, shape.get("n_layers"), shape.get("n_heads"))
        e, e_abs = effects_from_drops(d), effects_abs_from_drops(d)
        stats = split_statistics(e, e_abs)
        if stats["N_eff"] is not None:
            product = stats["N_index"] * stats["N_layer_given_index"]
            c11 = max(c11, abs(stats["N_eff"] - product) / stats["N_eff"])
        n_layers, n_heads = e.shape
        heads.append(
            pd.DataFrame(
                {
                    **identity,
                    "split": split,
                    "layer": np.repeat(np.arange(n_layers), n_heads),
                    "head": np.tile(np.arange(n_heads), n_layers),
                    "e": e.reshape(-1),
                    "p": stats["_p"].reshape(-1),
                }
            )
        )
        base = {**identity, "split": split, "n_examples": d.shape[0], **stats}
        summary.append({k: v for k, v in base.items() if k in SUMMARY_SCHEMA.names})
        if split == args.split and args.robustness:
            robust, conditions, logo = robustness(rows, example_ids, d, base, args, args.effects)
    if c11 > C11_TOLERANCE:
        raise ArithmeticError(
            f"check C11 failed: N_eff differs from N_index·N_layer|index by {c11:.3g} "
            f"(relative) > {C11_TOLERANCE}"
        )

    metadata = {
        "analysis": "concentration",
        "analysis_version": "2",
        **identity,
        "effects_sha256": sha256_file(args.effects),
        **carried,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "check_C11_max_rel_residual": c11,
        "check_C11_tolerance": C11_TOLERANCE,
        "source": source_freeze(),
    }
    summary_frame = pd.DataFrame(summary)
    for column in ("top_layer", "top_head"):
        summary_frame[column] = summary_frame[column].astype("Int32")
    heads_frame = pd.concat(heads, ignore_index=True)
    write_parquet(args.out_heads, heads_frame, HEADS_SCHEMA, metadata, HEADS_DESCRIPTIONS)
    write_parquet(args.out_summary, summary_frame, SUMMARY_SCHEMA, metadata, SUMMARY_DESCRIPTIONS)
    if args.robustness:
        write_robustness(args, metadata, robust, conditions, logo)
    print(f"{identity}: {len(summary)} splits, C11 {c11:.2g}", file=sys.stderr)
    return 0


def write_robustness(args, metadata: dict, robust: dict, conditions, logo) -> None:
    """The three §12 outputs, with the resampling seeds and check C10 in their metadata."""
    metadata = {
        **metadata,
        "analysis_split": args.split,
        "n_bootstrap": args.n_bootstrap,
        "bootstrap_seed": args.bootstrap_seed,
        "bootstrap_rng": "numpy Generator(PCG64(seed)).integers(0, N, (n_bootstrap, N))",
        "n_permutations": args.n_permutations,
        "permutation_seed": args.permutation_seed,
        "permutation_rng": "numpy Generator(PCG64(seed)); argsort of uniform keys per layer",
        "ci_level": args.ci,
        "check_C10_max_abs_diff": robust["check_C10_max_abs_diff"],
        "check_C10_tolerance": C10_TOLERANCE,
    }
    split_id = {k: robust[k] for k in (*IDENTITY, "split")}
    write_parquet(
        args.out_robustness,
        pd.DataFrame([robust]),
        ROBUSTNESS_SCHEMA,
        metadata,
        ROBUSTNESS_DESCRIPTIONS,
    )
    write_parquet(
        args.out_conditions,
        conditions.assign(**split_id),
        CONDITIONS_SCHEMA,
        metadata,
        CONDITIONS_DESCRIPTIONS,
    )
    write_parquet(args.out_logo, logo.assign(**split_id), LOGO_SCHEMA, metadata, LOGO_DESCRIPTIONS)
    print(
        f"{args.split}: N_eff {robust['N_eff']} [{robust['N_eff_ci_low']}, "
        f"{robust['N_eff_ci_high']}], N_index p {robust['N_index_p_lower']}, "
        f"C10 {robust['check_C10_max_abs_diff']:.2g}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
