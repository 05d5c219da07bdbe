"""The study as a document (docs §17): the paper tables not in ``headgeom.paper.tables``
(Table 1, the paper's ten-row Table 2, Table 4), the §12.1/§12.5 counts, seed-level
statistics, the paper-vs-run comparison (``headgeom.paper.comparison``) and the table of
numerical acceptance checks (docs §18), each a pure
function of result Parquets taken by kind, like every paper table (docs §17).

Rule ``make_document`` builds the tables of ``selections.DOCUMENT_TABLES`` in one job;
``make_table`` the others. Builders here take ``(inputs, context)``: ``context`` is what the
config says and no Parquet records (per model its geometry, corpus, seeds and the paper
sections whose outputs read it: ``headgeom.study.Study.document_context``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from headgeom import results
from headgeom.paper import tables
from headgeom.paper.selections import geometry_registry
from headgeom.paper.tables import (
    TASK_ORDER,
    TASK_TITLES,
    Block,
    Inputs,
    Table,
    _fmt,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)

Context = Mapping[str, Any]

#: How each geometry writes and reads, as the paper's Tables 2 and 4 print it (docs §6.1);
#: the reader kind itself comes from the registry.
GEOMETRY_TEXT: dict[str, tuple[str, str]] = {
    "learned": ("learned", ""),
    "write-common-axis": ("g E_h (all layers)", ""),
    "write-common": ("g B_0 E_h (all layers)", ""),
    "write-rotated": ("g B_l E_h (member l per layer)", ""),
    "read-common": ("learned", "E_h"),
    "all-common-axis": ("g E_h", "E_h"),
    "all-rotated": ("g B_l E_h", "h of B_(L+l) (other basis)"),
    "all-rotated-self": ("g B_l E_h", "h of B_l (own basis)"),
    "fixeddiag": ("g √(d/w) E_h diag(m)", ""),
    "identity-original": ("E_h (scale 1)", ""),
    "value384": ("g E_h + value adapter", ""),
    "mlp3456": ("g E_h, wider MLP", ""),
    "write-routed-a": ("routed (frozen, sum-hub)", "more heads"),
    "write-routed-b": ("routed (frozen, split-cycle)", "more heads"),
    "write-routed-c": ("routed (frozen, angle-split)", "more heads"),
    "multiscreen-learned": ("learned", "softmax-free tiles"),
    "multiscreen-identity": ("g_ms E_h", "softmax-free tiles"),
}
NOT_IN_STUDY = "not in this study"


def write_text(geometry: str) -> str:
    return GEOMETRY_TEXT.get(geometry, (geometry, ""))[0]


def readers_text(geometry: str) -> str:
    """``free`` or ``block …`` (the registry's reader kind) with the paper's detail."""
    kind = geometry_registry().reader_kind(geometry)
    detail = GEOMETRY_TEXT.get(geometry, ("", ""))[1]
    return f"{kind} {detail}".strip() if detail else kind


def _optional(inputs: Inputs, kind: str, columns: Sequence[str]) -> pd.DataFrame | None:
    """The Parquets of ``kind``, or None when the study gives none (an output of an analysis
    the study does not run)."""
    paths = list(inputs.get(kind, []))
    return read_kind(paths, columns, kind) if paths else None


def _learned_reference(frame: pd.DataFrame, value: str, keys: Sequence[str]) -> pd.Series:
    """Per row, ``value`` of the learned (baseline) run it is compared with: same corpus and
    ``keys`` (e.g. task) and the same seed when one exists, else the mean over that corpus's
    learned seeds (the rule of Table 2's Δ)."""
    learned = frame[frame["geometry"].map(geometry_registry().is_baseline)]
    keys = ["corpus", *keys]
    same_seed = learned.set_index([*keys, "seed"])[value]
    mean = learned.groupby(keys)[value].mean()
    ref = same_seed.reindex(pd.MultiIndex.from_frame(frame[[*keys, "seed"]])).to_numpy()
    fallback = mean.reindex(pd.MultiIndex.from_frame(frame[keys])).to_numpy()
    return pd.Series(np.where(np.isnan(ref), fallback, ref), index=frame.index)


# ----------------------------------------------------------------------------- Table 2
def table2_paper(inputs: Inputs, context: Context | None = None) -> Table:
    """Paper Table 2: the ten main-text models (selection ``table2``: first seed each), with
    Write, Readers, Corpus, Params, Val loss and Δ vs learned on the same corpus from unrounded
    losses; the footnote states reader kinds, g and the seeds of every configuration (input
    kind ``all_runs``: every run)."""
    runs = read_runs(need_kind(inputs, "runs", "table2"))
    everything = read_runs(inputs.get("all_runs") or need_kind(inputs, "runs", "table2"))
    frame = runs[["model", "display_name", "geometry", "seed", "corpus", "n_params", "val_loss"]]
    frame = frame.copy()
    frame["delta_vs_learned"] = frame["val_loss"] - _learned_reference(frame, "val_loss", [])
    frame.loc[frame["geometry"].map(geometry_registry().is_baseline), "delta_vs_learned"] = np.nan
    frame["write"] = frame["geometry"].map(write_text)
    frame["readers"] = frame["geometry"].map(readers_text)
    rank = frame["corpus"].map({"R": 0, "S": 1}).fillna(2)
    frame = frame.assign(_r=rank).sort_values("_r", kind="stable").drop(columns="_r")
    cells = tables._cells(
        frame,
        {
            "display_name": ("Model", str),
            "write": ("Write W_O", str),
            "readers": ("Readers", str),
            "corpus": ("Corpus", str),
            "n_params": ("Params", lambda v: f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v:,}"),
            "val_loss": ("Val loss", lambda v: f"{v:.3f}"),
            "delta_vs_learned": ("Δ vs learned", _fmt("{:+.3f}")),
        },
    )
    seeds = everything.groupby(["model", "display_name", "corpus"], sort=False)["seed"].nunique()
    several = [
        f"{name}{'' if corpus == '—' else f' (corpus {corpus})'}"
        for (_, name, corpus), n in seeds.items()
        if n > 1
    ]
    shown = sorted(set(runs["seed"]))
    seed_text = (
        "each configuration has 1 seed"
        + (f", except {', '.join(several)}, which have 2 or more" if several else "")
        + f" (seed {', '.join(map(str, shown))} shown)"
    )
    caption = (
        "Table 2. Main-text models: write map W_O, readers, corpus, parameters, validation "
        "loss (nats) and Δ vs the learned model on the same corpus (from unrounded losses). "
        "Free readers: learned W_Q, W_K, W_V after the shared LayerNorm; block readers: head h "
        "reads one fixed d-dimensional block (docs §4.3.1). Frozen writes are scaled by "
        f"g = 0.02·sqrt(D/2L), matched to the initial output RMS of a learned W_O; {seed_text}."
    )
    return Table("table2", frame.reset_index(drop=True), [Block(cells)], caption)


def table2_all_runs(inputs: Inputs, context: Context | None = None) -> Table:
    """The older Table 2 view: every run, with its designed weight-space geometry."""
    table = tables.table2(inputs)
    table.name = "table2_all_runs"
    table.caption = table.caption.replace("Table 2.", "Table 2 (every run, extra view).")
    return table


def table6_all_runs(inputs: Inputs, context: Context | None = None) -> Table:
    """Table 6 for every run (the paper's rows are ``tables.table6``), corpus R first."""
    table = tables.table6(inputs, every_run=True)
    table.name = "table6_all_runs"
    table.caption = table.caption.replace("Table 6.", "Table 6 (every run, extra view).")
    return table


# ----------------------------------------------------------------------------- Table 4
def table4(inputs: Inputs, context: Context) -> Table:
    """Paper Table 4: every configuration (run) of the study: repository name, write /
    readers, corpus, parameters, validation loss, and the paper sections that use it (the
    sections whose outputs read the run in this study)."""
    runs = read_runs(need_kind(inputs, "runs", "table4"))
    models = context["models"]
    frame = runs[["model", "seed", "repository_name", "geometry", "corpus", "n_params"]].copy()
    frame["val_loss"] = runs["val_loss"]
    frame["name"] = [
        repo if isinstance(repo, str) else f"{m} s{s}"
        for repo, m, s in zip(frame["repository_name"], frame["model"], frame["seed"], strict=True)
    ]
    frame["write_readers"] = [f"{write_text(g)} / {readers_text(g)}" for g in frame["geometry"]]
    frame["sections"] = [", ".join(models[m]["sections"]) or "—" for m in frame["model"]]
    cells = tables._cells(
        frame,
        {
            "name": ("Model", str),
            "write_readers": ("Write / Readers", str),
            "corpus": ("Corpus", str),
            "n_params": ("Params", lambda v: f"{v:,}"),
            "val_loss": ("Val loss", _fmt("{:.3f}", missing="---")),
            "sections": ("Sections used", str),
        },
    )
    caption = (
        f"Table 4. All {len(frame)} configurations of the study (model and seed): write map / "
        "readers, corpus, exact parameter count, validation loss (nats, final checkpoint) and "
        "the paper sections whose tables and figures use it in this study."
    )
    return Table("table4", frame.drop(columns="write_readers"), [Block(cells)], caption)


# ----------------------------------------------------------------------------- counts
SUMMARY_COLUMNS = results.SUMMARY.columns("model", "seed", "task", "split", "N_eff", "E")
CONDITION_COLUMNS = results.CONDITIONS.columns("model", "seed", "task", "split", "condition")
CONDITION_COLUMNS += results.CONDITIONS.columns("N_eff")
PAIRED_COLUMNS = results.PAIRED.columns("task", "model_a", "seed_a", "model_b", "seed_b")


def evaluation_summaries(inputs: Inputs, what: str) -> pd.DataFrame:
    """Evaluation-split N_eff and E per (model, seed, task) with run info and geometry."""
    runs = read_runs(need_kind(inputs, "runs", what))
    frame = read_kind(need_kind(inputs, "summaries", what), SUMMARY_COLUMNS, what)
    frame = frame.loc[frame["split"] == "evaluation", SUMMARY_COLUMNS]
    frame = with_runs(frame, runs, what)
    return frame.merge(runs[["model", "seed", "geometry"]], on=["model", "seed"])


def vs_learned(summary: pd.DataFrame, value: str = "N_eff") -> pd.DataFrame:
    """The model–task cases §12.1 compares with learned: every non-baseline run with a
    learned reference on its corpus (same seed when it exists, else the mean over learned
    seeds), with ``ref`` (the reference's ``value``) and ``below`` (``value`` < ``ref``)."""
    frame = summary.copy()
    frame["ref"] = _learned_reference(frame, value, ["task"])
    frame = frame[~frame["geometry"].map(geometry_registry().is_baseline) & frame["ref"].notna()]
    frame["below"] = frame[value] < frame["ref"]
    return frame


def below_learned(summary: pd.DataFrame) -> pd.DataFrame:
    """§12.1 counts: per corpus, how many model–task N_eff of each non-baseline geometry and
    of all block-reader models lie below the learned model's (same corpus, same seed when
    it exists, else the mean over learned seeds). Rows: group, corpus, k, n."""
    frame = vs_learned(summary)
    frame["block"] = frame["geometry"].map(geometry_registry().reader_kind) == "block"
    rows = []
    for corpus, by_corpus in frame.groupby("corpus", sort=False):
        groups = [("block-reader models", by_corpus[by_corpus["block"]])]
        groups += list(by_corpus.groupby("display_name", sort=False))
        for group, rows_ in groups:
            if len(rows_):
                rows.append(
                    {
                        "group": group,
                        "corpus": corpus,
                        "k": int(rows_["below"].sum()),
                        "n": len(rows_),
                        "models": rows_["model"].nunique(),
                    }
                )
    return pd.DataFrame(rows, columns=["group", "corpus", "k", "n", "models"])


def capacity_covariation(
    summary: pd.DataFrame, runs: pd.DataFrame, margins: pd.DataFrame | None
) -> pd.DataFrame:
    """The capacity covariation of §12.1/§20.7 ("concentration that appears with reader
    restriction covaries with lower capacity, higher loss and weaker margins"): the §12.1
    model–task cases (:func:`vs_learned`), each with its run's parameter count, Δ loss =
    val loss − learned's and, given the clean evaluation margins, Δ margin = clean margin −
    learned's on the task (the same reference run as N_eff's)."""
    frame = summary.merge(runs[["model", "seed", "n_params", "val_loss"]], on=["model", "seed"])
    frame["loss_ref"] = _learned_reference(frame, "val_loss", ["task"])
    if margins is not None:
        frame = frame.merge(margins, on=["model", "seed", "task"], how="left")
        frame["margin_ref"] = _learned_reference(frame, "margin", ["task"])
    cases = vs_learned(frame)
    cases["delta_loss"] = cases["val_loss"] - cases["loss_ref"]
    if margins is not None:
        cases["delta_margin"] = cases["margin"] - cases["margin_ref"]
    return cases


def _params_text(values: pd.Series) -> str:
    big = values.max() >= 1e6
    return _range_text(values / 1e6 if big else values, "{:.2f}M" if big else "{:,.0f}")


def _to_text(values: pd.Series, spec: str) -> str:
    """'+0.102 to +0.246' (one value when all are equal at that precision)."""
    lo, hi = spec.format(values.min()), spec.format(values.max())
    return lo if lo == hi else f"{lo} to {hi}"


def _capacity_finding(summary: pd.DataFrame, inputs: Inputs) -> list[str]:
    """Per corpus with a case below learned: parameters and Δ loss of the cases below
    learned against the others, and the median Δ clean margin of each."""
    runs = read_runs(need_kind(inputs, "runs", "table1"))
    margins = _optional(inputs, "eval", EVAL_MARGIN_COLUMNS)
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
            f"{_to_text(below['delta_loss'], '{:+.3f}')}"
        )
        if len(other):
            text += (
                f" (the {len(other)} others: {_params_text(other['n_params'])}, "
                f"{_to_text(other['delta_loss'], '{:+.3f}')})"
            )
        if "delta_margin" in below and below["delta_margin"].notna().any():
            text += f", median Δ clean margin vs learned {below['delta_margin'].median():+.2f}"
            if other["delta_margin"].notna().any():
                text += f" (others {other['delta_margin'].median():+.2f})"
        parts.append(text)
    return parts


def conditions_won(conditions: pd.DataFrame, paired: pd.DataFrame) -> pd.DataFrame:
    """§12.5 counts: per paired comparison (A, B, task), in how many conditions N_eff(A) <
    N_eff(B) (A more concentrated)."""
    cond = (
        conditions[conditions["split"] == "evaluation"]
        .set_index(["model", "seed", "task", "condition"])["N_eff"]
        .sort_index()
    )
    rows = []
    pairs = paired[PAIRED_COLUMNS].drop_duplicates()
    for task, a, seed_a, b, seed_b in pairs.itertuples(index=False):
        try:
            n_a, n_b = cond.loc[(a, seed_a, task)], cond.loc[(b, seed_b, task)]
        except KeyError:
            continue
        both = pd.concat([n_a.rename("a"), n_b.rename("b")], axis=1, join="inner")
        rows.append(
            {
                "task": task,
                "model_a": a,
                "seed_a": int(seed_a),
                "model_b": b,
                "seed_b": int(seed_b),
                "k": int((both["a"] < both["b"]).sum()),
                "n": len(both),
            }
        )
    return pd.DataFrame(rows, columns=["task", "model_a", "seed_a", "model_b", "seed_b", "k", "n"])


def counts(inputs: Inputs, context: Context | None = None) -> Table:
    """The counts §12.1 and §12.5 state: "reader-restricted below learned in k of n
    model–task comparisons" and "A more concentrated than B in k of 4 conditions"."""
    summary = evaluation_summaries(inputs, "counts")
    rows = []
    for r in below_learned(summary).itertuples(index=False):
        corpus = "" if r.corpus == "—" else f" (corpus {r.corpus})"
        rows.append(
            {
                "section": "§12.1",
                "comparison": f"{r.group}{corpus}: N_eff below learned",
                "task": "all",
                "k": r.k,
                "n": r.n,
                "unit": "model–task comparisons",
            }
        )
    conditions = _optional(inputs, "conditions", CONDITION_COLUMNS)
    paired = _optional(inputs, "paired", PAIRED_COLUMNS)
    if conditions is not None and paired is not None:
        for r in conditions_won(conditions, paired).itertuples(index=False):
            rows.append(
                {
                    "section": "§12.5",
                    "comparison": f"{r.model_a} s{r.seed_a} more concentrated than "
                    f"{r.model_b} s{r.seed_b}",
                    "task": r.task,
                    "k": r.k,
                    "n": r.n,
                    "unit": "conditions",
                }
            )
    frame = pd.DataFrame(rows, columns=["section", "comparison", "task", "k", "n", "unit"])
    cells = pd.DataFrame(
        {
            "Section": frame["section"],
            "Comparison": frame["comparison"],
            "Task": [TASK_TITLES.get(t, t) for t in frame["task"]],
            "Count": [
                f"{k} of {n} {u}" for k, n, u in zip(frame.k, frame.n, frame.unit, strict=True)
            ],
        }
    )
    caption = (
        "Counts of docs §12.1 and §12.5 (evaluation split): model–task N_eff below the learned "
        "model's on the same corpus (paper: reader-restricted 10 of 12, write-rotated 0 of 3), "
        "and conditions in which model A has the lower N_eff (paper: all-common-axis vs "
        "all-rotated 3/4, 2/4, 1/4)."
    )
    return Table("counts", frame, [Block(cells)], caption)


# ----------------------------------------------------------------------------- seeds
LANE_COLUMNS = results.LANES.columns("model", "seed", "task", "split", "lambda_score")
EVAL_COLUMNS = results.EVAL.columns("model", "seed", "task", "split", "accuracy")
SEED_METRICS = ("N_eff", "E", "lambda_score", "accuracy")
METRIC_TITLES = {"N_eff": "N_eff", "E": "E", "lambda_score": "Λ", "accuracy": "accuracy"}


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval mean ± t_{(1+level)/2, n−1} · s/√n
    (scipy.stats.t); NaN ends with fewer than two values."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else float("nan")
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = scipy_stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return mean, mean - half, mean + half


def seed_values(inputs: Inputs, what: str) -> pd.DataFrame:
    """Long frame (model, seed, task, metric, value): evaluation N_eff, E and accuracy, Λ on
    the lanes' split, for every run."""
    summary = evaluation_summaries(inputs, what)
    long = [summary.melt(["model", "seed", "task"], ["N_eff", "E"], "metric")]
    lanes = _optional(inputs, "lanes", LANE_COLUMNS)
    if lanes is not None:
        long.append(lanes.melt(["model", "seed", "task"], ["lambda_score"], "metric"))
    ev = _optional(inputs, "eval", EVAL_COLUMNS)
    if ev is not None:
        ev = ev[ev["split"] == "evaluation"]
        long.append(ev.melt(["model", "seed", "task"], ["accuracy"], "metric"))
    frame = pd.concat(long, ignore_index=True)
    runs = summary[["model", "seed", "display_name", "corpus", "order"]].drop_duplicates()
    return frame.merge(runs, on=["model", "seed"])


def seed_statistics(values: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per model with ≥ 2 seeds, task and metric: seed mean and its Student-t interval; per
    pair of such models on one corpus sharing ≥ 2 seeds: the paired seed contrast A − B
    (difference per shared seed, then its mean and t interval)."""
    rows = []
    n_seeds = values.groupby("model")["seed"].nunique()
    multi = values[values["model"].map(n_seeds) >= 2]
    for (model, task, metric), g in multi.groupby(["model", "task", "metric"], sort=False):
        g = g.sort_values("seed")
        mean, low, high = t_interval(g["value"], level)
        rows.append(
            {
                "kind": "seed mean",
                "model": model,
                "model_b": None,
                "task": task,
                "metric": metric,
                "n_seeds": len(g),
                "mean": mean,
                "ci_low": low,
                "ci_high": high,
                "sd": float(g["value"].std(ddof=1)),
                "values": "; ".join(f"s{s}: {v:.3g}" for s, v in zip(g.seed, g.value, strict=True)),
                "order": int(g["order"].min()),
            }
        )
    models = list(dict.fromkeys(multi.sort_values("order")["model"]))
    corpus = multi.groupby("model")["corpus"].first()
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            if corpus[a] != corpus[b]:
                continue
            wide = (
                multi[multi["model"].isin([a, b])]
                .pivot_table(index=["task", "metric", "seed"], columns="model", values="value")
                .dropna()
            )
            for (task, metric), g in wide.groupby(level=["task", "metric"], sort=False):
                if len(g) < 2:
                    continue
                diff = g[a] - g[b]
                mean, low, high = t_interval(diff, level)
                seeds = g.index.get_level_values("seed")
                rows.append(
                    {
                        "kind": "paired seed contrast",
                        "model": a,
                        "model_b": b,
                        "task": task,
                        "metric": metric,
                        "n_seeds": len(g),
                        "mean": mean,
                        "ci_low": low,
                        "ci_high": high,
                        "sd": float(diff.std(ddof=1)),
                        "values": "; ".join(
                            f"s{s}: {v:+.3g}" for s, v in zip(seeds, diff, strict=True)
                        ),
                        "order": 10_000,
                    }
                )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    rank_t = frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    rank_m = frame["metric"].map({m: i for i, m in enumerate(SEED_METRICS)})
    frame = frame.assign(_t=rank_t, _m=rank_m).sort_values(["order", "model_b", "_m", "_t"])
    return frame.drop(columns=["_t", "_m", "order"]).reset_index(drop=True)


def seeds(inputs: Inputs, context: Context | None = None, level: float = 0.95) -> Table:
    """Seed-level statistics where a configuration has ≥ 2 seeds (the companion study's
    practice): seed means with Student-t intervals and paired seed contrasts."""
    frame = seed_statistics(seed_values(inputs, "seeds"), level)
    if frame.empty:
        frame = pd.DataFrame(
            columns=[
                "kind",
                "model",
                "model_b",
                "task",
                "metric",
                "n_seeds",
                "mean",
                "ci_low",
                "ci_high",
                "sd",
                "values",
            ]
        )
    digits = {"N_eff": 2, "E": 2, "lambda_score": 3, "accuracy": 3}

    def fmt(metric, v):
        return "—" if pd.isna(v) else f"{v:.{digits.get(metric, 3)}f}"

    cells = pd.DataFrame(
        {
            "What": frame["kind"],
            "Model": [
                a if b is None or pd.isna(b) else f"{a} − {b}"
                for a, b in zip(frame["model"], frame["model_b"], strict=True)
            ],
            "Task": [TASK_TITLES.get(t, t) for t in frame["task"]],
            "Metric": [METRIC_TITLES.get(m, m) for m in frame["metric"]],
            "Seeds": frame["n_seeds"].astype(str),
            "Mean": [fmt(m, v) for m, v in zip(frame["metric"], frame["mean"], strict=True)],
            f"{100 * level:.0f}% t interval": [
                f"[{fmt(m, lo)}, {fmt(m, hi)}]"
                for m, lo, hi in zip(
                    frame["metric"], frame["ci_low"], frame["ci_high"], strict=True
                )
            ],
            "Per seed": frame["values"],
        }
    )
    caption = (
        f"Seed-level statistics (evaluation split; Λ on the lanes' split) for every "
        f"configuration with ≥ 2 seeds: seed mean with its {100 * level:.0f}% Student-t "
        "interval (n − 1 degrees of freedom: with 2 seeds the interval is ±12.7 s/√2), and "
        "paired seed contrasts A − B over the seeds both models share. Bootstrap intervals "
        "over examples (Figure 3) do not include this seed variance."
    )
    return Table("seeds", frame, [Block(cells)], caption)


# ----------------------------------------------------------------------------- Table 1
EXCLUSIVITY_COLUMNS = results.EXCLUSIVITY.columns("quantity", "scope", "read_type", "value")
EVAL_MARGIN_COLUMNS = results.EVAL.columns("model", "seed", "task", "split", "margin")
LAMBDA_COLUMNS = results.LANES.columns("model", "seed", "task", "split", "lambda_score", "p_value")
LUMPED_COLUMNS = results.CLAMP_LUMPED.columns("model", "seed", "task", "same_index", "reduction")
PAIR_REDUCTION_COLUMNS = results.CLAMP_PAIRS.columns("same_index", "reduction_head")
ROBUSTNESS_COLUMNS = results.ROBUSTNESS.columns(
    "model", "seed", "task", "split", "N_index", "index_meaningful", "N_index_p_lower"
)
#: Table 1's rows: property, meaning and measure, the input kinds its finding needs, and the
#: function that writes the finding from them. A row whose kinds the study lacks says so.
TABLE1_ROWS: list[tuple[str, str, tuple[str, ...], Callable[[Inputs], str] | None]] = []


def _range_text(values: pd.Series, spec: str = "{:.2f}") -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    lo, hi = values.min(), values.max()
    return spec.format(lo) if np.isclose(lo, hi) else f"{spec.format(lo)}–{spec.format(hi)}"


def _exclusivity_finding(inputs: Inputs) -> str:
    ex = read_kind(inputs["exclusivity"], EXCLUSIVITY_COLUMNS, "table1")
    run = ex[ex["scope"] == "run"]
    ratio = run[run["quantity"] == "median_leakage_over_rho"]
    by_x = {x: _range_text(g["value"]) for x, g in ratio.groupby("read_type")}
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
    parts = [f"N_eff {_range_text(summary['N_eff'], '{:.1f}')} over runs × tasks"]
    block = counts_[counts_["group"] == "block-reader models"]
    for r in block.itertuples(index=False):
        parts.append(f"block readers below learned in {r.k} of {r.n} model–task comparisons")
    free = counts_[(counts_["group"] != "block-reader models")]
    for r in free.itertuples(index=False):
        if (
            geometry_registry().reader_kind(
                summary.loc[summary["display_name"] == r.group, "geometry"].iloc[0]
            )
            == "free"
        ):
            parts.append(f"{r.group} below learned in {r.k} of {r.n}")
    rob = _optional(inputs, "robustness", ROBUSTNESS_COLUMNS)
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
            f"p {tables.format_p(r.p_value)})"
            for r in best.itertuples(index=False)
            if pd.notna(r.lambda_score)
        ]
        parts.append("largest Λ per model: " + ", ".join(shown))
    if inputs.get("clamp_pairs"):
        pairs = read_kind(inputs["clamp_pairs"], PAIR_REDUCTION_COLUMNS, "table1")
        same, diff = pairs[pairs["same_index"]], pairs[~pairs["same_index"]]
        parts.append(
            "single-head clamps: same-index reduction "
            f"{_range_text(100 * same['reduction_head'], '{:.0f}%')}, different-index "
            f"{_range_text(100 * diff['reduction_head'], '{:.0f}%')}"
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
    from headgeom.paper.selections import COORDINATE_GROUPS

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
            f"{g} {_range_text(100 * r['share_evaluation'], '{:.0f}%')}"
            for g, r in rows.groupby("group", sort=False)
        ]
        if shown:
            parts.append(f"{title}: " + ", ".join(shown))
    return ("SVA top-10 coordinate share (evaluation, selected on validation): "
            + "; ".join(parts)) if parts else "—"  # fmt: skip


TABLE1_ROWS += [
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


# ----------------------------------------------------------------------------- checks (§18)
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


def _comparison(inputs: Inputs, context: Context | None = None) -> Table:
    from headgeom.paper.comparison import comparison_table

    return comparison_table(inputs)


#: Every builder of a document table: (inputs, context) -> Table.
BUILDERS: dict[str, Callable[..., Table]] = {
    "table1": table1,
    "table2_all_runs": table2_all_runs,
    "table6_all_runs": table6_all_runs,
    "table4": table4,
    "counts": counts,
    "seeds": seeds,
    "comparison": _comparison,
    "checks": checks,
}
#: Every paper table, for src/make_table.py (Table 2: the paper's ten rows).
TABLE_BUILDERS: dict[str, Callable[[Inputs], Table]] = {**tables.BUILDERS, "table2": table2_paper}
