"""§5.2 Concentration, counted: the §12.1/§12.5 counts (which models concentrate below
the learned model, which conditions each pair wins) and seed-level statistics with
t intervals (docs §12.1, §12.5, §17).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from headgeom import results
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Context,
    Inputs,
    learned_reference,
    need_kind,
    optional_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.model import facts
from headgeom.render import Block, Table

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
    frame["ref"] = learned_reference(frame, value, ["task"])
    frame = frame[~frame["geometry"].map(facts.is_baseline) & frame["ref"].notna()]
    frame["below"] = frame[value] < frame["ref"]
    return frame


def below_learned(summary: pd.DataFrame) -> pd.DataFrame:
    """§12.1 counts: per corpus, how many model–task N_eff of each non-baseline geometry and
    of all block-reader models lie below the learned model's (same corpus, same seed when
    it exists, else the mean over learned seeds). Rows: group, corpus, k, n."""
    frame = vs_learned(summary)
    frame["block"] = frame["geometry"].map(facts.reader_kind) == facts.BLOCK
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
    frame["loss_ref"] = learned_reference(frame, "val_loss", ["task"])
    if margins is not None:
        frame = frame.merge(margins, on=["model", "seed", "task"], how="left")
        frame["margin_ref"] = learned_reference(frame, "margin", ["task"])
    cases = vs_learned(frame)
    cases["delta_loss"] = cases["val_loss"] - cases["loss_ref"]
    if margins is not None:
        cases["delta_margin"] = cases["margin"] - cases["margin_ref"]
    return cases


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
    conditions = optional_kind(inputs, "conditions", CONDITION_COLUMNS)
    paired = optional_kind(inputs, "paired", PAIRED_COLUMNS)
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


LANE_COLUMNS = results.LANES.columns("model", "seed", "task", "split", "lambda_score")


EVAL_COLUMNS = results.EVAL.columns("model", "seed", "task", "split", "accuracy")


SEED_METRICS = ("N_eff", "E", "lambda_score", "accuracy")


METRIC_TITLES = {"N_eff": "N_eff", "E": "E", "lambda_score": "Λ", "accuracy": "accuracy"}


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval mean ± t_{(1+level)/2, n−1} · s/√n
    (scipy.stats.t); NaN ends with fewer than two values."""
    from scipy import stats as scipy_stats  # here: scipy.stats costs ~0.7 s of a job's start

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
    lanes = optional_kind(inputs, "lanes", LANE_COLUMNS)
    if lanes is not None:
        long.append(lanes.melt(["model", "seed", "task"], ["lambda_score"], "metric"))
    ev = optional_kind(inputs, "eval", EVAL_COLUMNS)
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
