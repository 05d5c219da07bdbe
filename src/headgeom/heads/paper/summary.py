"""The study in one page (docs §17, §18): Table 1 (each property of the paper, its
measure and this study's finding), the paper-vs-run comparison
(:mod:`headgeom.heads.paper.comparison`) and the numerical acceptance checks.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from headgeom import results
from headgeom.heads.paper.comparison import comparison_table
from headgeom.heads.paper.inputs import (
    TASK_TITLES,
    Context,
    Inputs,
    need_kind,
    optional_kind,
    read_kind,
    read_runs,
)
from headgeom.heads.paper.seeds import below_learned, capacity_covariation, evaluation_summaries
from headgeom.heads.selections import COORDINATE_GROUPS
from headgeom.model import facts
from headgeom.render import Block, Table, format_p, value_range

NOT_IN_STUDY = "not in this study"


def _params_text(values: pd.Series) -> str:
    big = values.max() >= 1e6
    return value_range(values / 1e6 if big else values, "{:.2f}M" if big else "{:,.0f}")


def _capacity_finding(summary: pd.DataFrame, inputs: Inputs) -> list[str]:
    """Per corpus with a case below learned: parameters and Δ loss of the cases below
    learned against the others, and the median Δ clean margin of each."""
    runs = read_runs(need_kind(inputs, "runs", "table1"))
    margins = optional_kind(inputs, "eval", EVAL_MARGIN_COLUMNS)
    if margins is not None:
        margins = margins.loc[margins["split"] == "evaluation", ["model", "seed", "task", "margin"]]
    cases = capacity_covariation(summary, runs, margins)
    parts = []
    for corpus, by_corpus in cases.groupby("corpus", sort=False):
        below, other = by_corpus[by_corpus["below"]], by_corpus[~by_corpus["below"]]
        if below.empty:
            continue
        where = "" if corpus == "—" else f" (corpus {corpus})"
        text = (
            f"capacity covariation{where}: the {len(below)} model–task cases below learned "
            f"have {_params_text(below['n_params'])} parameters and Δ loss "
            f"{value_range(below['delta_loss'], '{:+.3f}', ' to ')}"
        )
        if len(other):
            text += (
                f" (the {len(other)} others: {_params_text(other['n_params'])}, "
                f"{value_range(other['delta_loss'], '{:+.3f}', ' to ')})"
            )
        if "delta_margin" in below and below["delta_margin"].notna().any():
            text += f", median Δ clean margin vs learned {below['delta_margin'].median():+.2f}"
            if other["delta_margin"].notna().any():
                text += f" (others {other['delta_margin'].median():+.2f})"
        parts.append(text)
    return parts


EXCLUSIVITY_COLUMNS = results.EXCLUSIVITY.columns("quantity", "scope", "read_type", "value")


EVAL_MARGIN_COLUMNS = results.EVAL.columns("model", "seed", "task", "split", "margin")


LAMBDA_COLUMNS = results.LANES.columns("model", "seed", "task", "split", "lambda_score", "p_value")


LUMPED_COLUMNS = results.CLAMP_LUMPED.columns("model", "seed", "task", "same_index", "reduction")


PAIR_REDUCTION_COLUMNS = results.CLAMP_PAIRS.columns("same_index", "reduction_head")


ROBUSTNESS_COLUMNS = results.ROBUSTNESS.columns(
    "model", "seed", "task", "split", "N_index", "index_meaningful", "N_index_p_lower"
)


def _exclusivity_finding(inputs: Inputs) -> str:
    ex = read_kind(inputs["exclusivity"], EXCLUSIVITY_COLUMNS, "table1")
    run = ex[ex["scope"] == "run"]
    ratio = run[run["quantity"] == "median_leakage_over_rho"]
    by_x = {x: value_range(g["value"]) for x, g in ratio.groupby("read_type")}
    top = ex[(ex["scope"] == "all") & (ex["read_type"] == "Q")].set_index("quantity")["value"]
    parts = [
        "median L/ρ per run: " + ", ".join(f"{x} {v}" for x, v in sorted(by_x.items())),
    ]
    if "top_pair_percentile_median" in top:
        parts.append(
            f"top-pair Q leakage: median percentile {top['top_pair_percentile_median']:.1f} "
            f"among all later readers, {100 * top['top_pair_share_above_90']:.0f}% above the "
            f"90th, {top['top_pair_leakage_over_rho_median']:.2f}× isotropic"
        )
    return "; ".join(parts)


def _concentration_finding(inputs: Inputs) -> str:
    summary = evaluation_summaries(inputs, "table1")
    counts_ = below_learned(summary)
    parts = [f"N_eff {value_range(summary['N_eff'], '{:.1f}')} over runs × tasks"]
    block = counts_[counts_["group"] == "block-reader models"]
    for r in block.itertuples(index=False):
        parts.append(f"block readers below learned in {r.k} of {r.n} model–task comparisons")
    free = counts_[(counts_["group"] != "block-reader models")]
    for r in free.itertuples(index=False):
        if (
            facts.reader_kind(summary.loc[summary["display_name"] == r.group, "geometry"].iloc[0])
            == facts.FREE
        ):
            parts.append(f"{r.group} below learned in {r.k} of {r.n}")
    rob = optional_kind(inputs, "robustness", ROBUSTNESS_COLUMNS)
    if rob is not None:
        rob = rob[(rob["split"] == "evaluation") & rob["index_meaningful"].astype(bool)]
        sig = rob[rob["N_index_p_lower"] <= 0.05]
        parts.append(
            f"index-level concentration (N_index null p ≤ 0.05) in {len(sig)} of {len(rob)} "
            "run–task cases"
        )
    parts += _capacity_finding(summary, inputs)
    return "; ".join(parts)


def _alignment_finding(inputs: Inputs) -> str:
    parts = []
    if inputs.get("lanes"):
        runs = read_runs(need_kind(inputs, "runs", "table1"))
        lanes = read_kind(inputs["lanes"], LAMBDA_COLUMNS, "table1")
        lanes = lanes.merge(runs[["model", "seed", "display_name"]], on=["model", "seed"])
        best = (
            lanes.sort_values("lambda_score", ascending=False)
            .groupby("display_name", sort=False)
            .head(1)
        )
        shown = [
            f"{r.display_name} {r.lambda_score:.2f} ({TASK_TITLES.get(r.task, r.task)}, "
            f"p {format_p(r.p_value)})"
            for r in best.itertuples(index=False)
            if pd.notna(r.lambda_score)
        ]
        parts.append("largest Λ per model: " + ", ".join(shown))
    if inputs.get("clamp_pairs"):
        pairs = read_kind(inputs["clamp_pairs"], PAIR_REDUCTION_COLUMNS, "table1")
        same, diff = pairs[pairs["same_index"]], pairs[~pairs["same_index"]]
        parts.append(
            "single-head clamps: same-index reduction "
            f"{value_range(100 * same['reduction_head'], '{:.0f}%')}, different-index "
            f"{value_range(100 * diff['reduction_head'], '{:.0f}%')}"
        )
    if inputs.get("clamp_lumped"):
        lumped = read_kind(inputs["clamp_lumped"], LUMPED_COLUMNS, "table1")
        sva = lumped[lumped["task"] == "sva"]
        if len(sva):
            own = sva.loc[sva["same_index"], "reduction"].mean()
            other = sva.loc[~sva["same_index"], "reduction"].mean()
            parts.append(
                f"lumped lane clamp (SVA): same index {100 * own:.1f}%, other indices "
                f"{100 * other:.1f}%"
            )
    return "; ".join(parts) or "—"


def _coordinate_finding(inputs: Inputs) -> str:  # coordinate concentration (docs §15.2)

    cols = results.COORDINATES.columns("model", "seed", "task", "site", "share_evaluation")
    frame = read_kind(inputs["coordinates"], cols, "table1")
    runs = read_runs(need_kind(inputs, "runs", "table1"))
    frame = frame.merge(runs[["model", "seed", "geometry"]], on=["model", "seed"])
    frame["group"] = frame["geometry"].map(COORDINATE_GROUPS).fillna(frame["geometry"])
    sva = frame[frame["task"] == "sva"]
    parts = []
    for site, title in (("after_wo", "after W_O"), ("before_wo", "before W_O"),
                        ("before_wo_rotated", "before W_O rotated")):  # fmt: skip
        rows = sva[sva["site"] == site]
        shown = [
            f"{g} {value_range(100 * r['share_evaluation'], '{:.0f}%')}"
            for g, r in rows.groupby("group", sort=False)
        ]
        if shown:
            parts.append(f"{title}: " + ", ".join(shown))
    return ("SVA top-10 coordinate share (evaluation, selected on validation): "
            + "; ".join(parts)) if parts else "—"  # fmt: skip


#: Table 1's rows: property, meaning and measure, the input kinds its finding needs, and the
#: function that writes the finding from them. A row whose kinds the study lacks says so.
TABLE1_ROWS: list[tuple[str, str, tuple[str, ...], Callable[[Inputs], str] | None]] = [
    (
        "Intervention site",
        "which head is manipulated: one head's output z before W_O, "
        "patched from a reference example (fixed by the implementation)",
        (),
        None,
    ),
    (
        "Geometric exclusivity",
        "leakage L of a head's patch perturbation into later heads' "
        "folded read spaces, against the isotropic expectation ρ = PK/dim U (docs §11.3–11.4)",
        ("exclusivity",),
        _exclusivity_finding,
    ),
    (
        "Functional concentration",
        "effective number of heads N_eff = exp(entropy of |e|/E) and "
        "total effect E of single-head patches (docs §10.2, §12); its covariation with "
        "capacity: parameters, Δ loss and clean margin vs learned (§12.1)",
        ("runs", "summaries"),
        _concentration_finding,
    ),
    (
        "Basis concentration",
        "top-10 coordinate share of a head's output after vs before W_O (docs §15.2)",
        ("coordinates",),
        _coordinate_finding,
    ),
    (
        "Organisational alignment",
        "lane score Λ: share of cross-layer positive effect mass in "
        "same-index head pairs (docs §10.5, §13.1), and clamp tests (§13.3)",
        ("runs", "lanes"),
        _alignment_finding,
    ),
]


def table1(inputs: Inputs, context: Context | None = None) -> Table:
    """Paper Table 1: property, operational definition, and the finding of this study, each
    finding written from the result Parquets; a property whose inputs the study does not
    make (an analysis it does not run) is marked "not in this study"."""
    rows = []
    for prop, measure, kinds, finding in TABLE1_ROWS:
        missing = [k for k in kinds if not inputs.get(k)]
        if finding is None:
            text = "—"
        elif missing:
            text = f"{NOT_IN_STUDY} (no {', '.join(missing)} input)"
        else:
            text = finding(inputs)
        rows.append(
            {
                "property": prop,
                "measure": measure,
                "finding": text,
                "in_study": finding is None or not missing,
            }
        )
    frame = pd.DataFrame(rows)
    cells = pd.DataFrame(
        {
            "Property": frame["property"],
            "Meaning and measure": frame["measure"],
            "Finding": frame["finding"],
        }
    )
    caption = (
        "Table 1. Properties studied, their operational definitions and this study's findings "
        "(evaluation split; written from the result Parquets)."
    )
    return Table("table1", frame, [Block(cells)], caption)


CHECK_COLUMNS = results.CHECKS.names


def _residual_text(value: float, kind: str) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{int(value)}" if kind == "count" else f"{value:.2e}"


def _passed_text(group: pd.DataFrame) -> str:
    applies = group[group["passed"].notna()]
    text = f"{int(applies['passed'].astype(bool).sum())}/{len(applies)}" if len(applies) else "—"
    failed_reported = applies[~applies["passed"].astype(bool) & ~applies["enforced"]]
    if len(failed_reported):
        text += f" ({len(failed_reported)} failed, reported only)"
    skipped = len(group) - len(applies)
    return text + (f"; {skipped} n/a" if skipped else "")


def checks(inputs: Inputs, context: Context | None = None) -> Table:
    """The numerical acceptance checks (docs §18; ``checks.parquet``): one line per check
    (and part) and the rule that runs it: how many artifacts log it, the largest residual,
    the tolerance and how many pass; the CSV keeps every logged check."""
    frame = read_kind(need_kind(inputs, "checks", "checks"), CHECK_COLUMNS, "checks")
    rows = []
    keys = ["check", "part", "rule"]
    for (check, part, rule), group in frame.groupby(keys, sort=False, dropna=False):
        kind = group["kind"].dropna().iloc[0] if group["kind"].notna().any() else "abs"
        tol = group["tolerance"].dropna()
        tolerance = "—" if tol.empty else _residual_text(tol.min(), kind)
        if len(tol) and tol.max() > tol.min():
            tolerance += f"–{_residual_text(tol.max(), kind)}"
        name = check if part is None or pd.isna(part) else f"{check}.{part}"
        rows.append(
            {
                "Check": name,
                "Compares": group["title"].iloc[0],
                "Rule": rule,
                "Artifacts": str(len(group)),
                "Largest residual": _residual_text(group["residual"].max(), kind),
                "Tolerance": tolerance,
                "Passed": _passed_text(group),
            }
        )
    n_fail = int((frame["passed"].eq(False)).sum())
    caption = (
        "Numerical acceptance checks (docs §18): per check and the rule that runs it, the "
        "artifacts that log it, the largest residual (count checks: mismatching items), its "
        "tolerance and how many pass (n/a: the check does not apply there, e.g. C14 where "
        "the writes do not decompose R^D). Every enforced check stopped its job had it failed; "
        "designed-pk (§9.4) and loss-order (§7.3) are only reported below the paper's size"
        + (f"; {n_fail} reported check(s) failed." if n_fail else ".")
    )
    return Table("checks", frame, [Block(pd.DataFrame(rows))], caption)


def comparison(inputs: Inputs, context: Context | None = None) -> Table:
    """The paper's numbers beside this study's (headgeom.heads.paper.comparison)."""
    return comparison_table(inputs)
