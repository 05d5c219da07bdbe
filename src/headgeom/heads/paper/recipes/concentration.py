"""Recipes of METHODS §20.3 (the paper's §5.2): N_eff and E, ratios, paired bootstraps,
conditions won, robustness, Spearman correlations, seed ratios and the loss correlation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headgeom.heads.analysis.stats import spearman as spearman_rho
from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, runs_in, span_of
from headgeom.model import facts
from headgeom.vocabulary import TASKS


@recipe("{kind}")
def stat(c: Context, *, kind, geometry, corpus, task, column, seed_index=0):
    """``column`` of a run's ``kind`` Parquet for ``task`` (evaluation split)."""
    return c.value(kind, c.run(geometry, corpus, seed_index), column, task=task)


@recipe("summaries")
def ratio(c: Context, *, a, b, corpus, task):
    """N_eff(a) / N_eff(b) for ``task``."""
    x = stat(c, kind="summaries", geometry=a, corpus=corpus, task=task, column="N_eff")
    y = stat(c, kind="summaries", geometry=b, corpus=corpus, task=task, column="N_eff")
    return None if x is None or y is None else x / y


@recipe("paired")
def paired(c: Context, *, a, b, task, column="diff"):
    """The paired bootstrap of N_eff(a) − N_eff(b) on corpus S (its ``column``)."""
    frame = c.frame("paired")
    ra, rb = c.run(a, "S"), c.run(b, "S")
    if ra is None or rb is None or frame.empty:
        return None
    rows = frame[
        (frame["task"] == task)
        & (frame["model_a"] == ra[0])
        & (frame["seed_a"] == ra[1])
        & (frame["model_b"] == rb[0])
        & (frame["seed_b"] == rb[1])
    ]
    return float(rows[column].iloc[0]) if len(rows) else None


@recipe("conditions")
def conditions_won(c: Context, *, a, b, task):
    """In how many conditions N_eff(a) < N_eff(b) on corpus S (evaluation split)."""
    frame = c.frame("conditions")
    ra, rb = c.run(a, "S"), c.run(b, "S")
    if ra is None or rb is None or frame.empty:
        return None
    frame = frame[(frame["task"] == task) & (frame["split"] == "evaluation")]

    def of(run):
        rows = frame[(frame["model"] == run[0]) & (frame["seed"] == run[1])]
        return rows.set_index("condition")["N_eff"]

    both = pd.concat([of(ra).rename("a"), of(rb).rename("b")], axis=1, join="inner")
    return float((both["a"] < both["b"]).sum()) if len(both) else None


@recipe("robustness")
def robustness_span(c: Context, *, column, geometries=None, tasks=TASKS):
    """``column`` of the robustness Parquets (evaluation split), a range over the runs of
    ``geometries`` on corpus S (None: every run) and ``tasks``."""
    frame = c.frame("robustness")
    if frame.empty:
        return None
    frame = frame[(frame["split"] == "evaluation") & frame["task"].isin(tasks)]
    if geometries is not None:
        frame = frame[runs_in(frame, {r for g in geometries for r in c.runs_of(g, "S")})]
    return span_of(frame[column].tolist())


@recipe("robustness")
def robustness_max(c: Context, *, column):
    """The largest ``column`` of every run and task (evaluation split)."""
    value = robustness_span(c, column=column)
    return value[1] if isinstance(value, tuple) else value


@recipe("spearman")
def spearman(c: Context, *, subset, task=None):
    """Spearman(N_eff, per-example-abs N_eff) over ``subset`` (None: pooled over tasks)."""
    frame = c.frame("spearman")
    if frame.empty:
        return None
    rows = frame[(frame["analysis"] == "N_eff_vs_N_eff_abs") & (frame["subset"] == subset)]
    rows = rows[rows["task"].isna()] if task is None else rows[rows["task"] == task]
    return float(rows["rho"].iloc[0]) if len(rows) and pd.notna(rows["rho"].iloc[0]) else None


@recipe("spearman")
def spearman_span(c: Context, *, subset, tasks=TASKS):
    """:func:`spearman` within each of ``tasks``, a range."""
    return span_of([spearman(c, subset=subset, task=t) for t in tasks])


@recipe("summaries")
def seed_ratio(c: Context, *, task):
    """Larger / smaller N_eff of the two learned seeds on corpus R."""
    runs = c.runs_of("learned", "R")
    if len(runs) < 2:
        return None
    a = c.value("summaries", runs[0], "N_eff", task=task)
    b = c.value("summaries", runs[1], "N_eff", task=task)
    return max(a, b) / min(a, b)


@recipe("summaries")
def routed_ratios(c: Context, *, geometries):
    """N_eff(geometry) / N_eff(learned) on corpus S, a range over ``geometries`` and tasks."""
    learned = c.run("learned", "S")
    if learned is None:
        return None
    values = []
    for g in geometries:
        for t in TASKS:
            x = stat(c, kind="summaries", geometry=g, corpus="S", task=t, column="N_eff")
            y = c.value("summaries", learned, "N_eff", task=t)
            if x is not None and y:
                values.append(x / y)
    return span_of(values)


@recipe("summaries")
def below_learned(c: Context, *, geometry=None):
    """Share of (run, task) N_eff below learned's on corpus S: the runs of ``geometry``
    (None: of every block-reader geometry)."""
    learned = c.run("learned", "S")
    if learned is None:
        return None
    runs = (
        c.runs_of(geometry, "S")
        if geometry
        else [
            r
            for g in set(c.runs["geometry"])
            if facts.reader_kind(g) == facts.BLOCK
            for r in c.runs_of(g, "S")
        ]
    )
    if not runs:
        return None
    k = sum(
        c.value("summaries", r, "N_eff", task=t) < c.value("summaries", learned, "N_eff", task=t)
        for r in runs
        for t in TASKS
    )
    return float(k) / (3 * len(runs))


@recipe("eval")
def margin_span(c: Context, *, geometries, task="plural"):
    """Clean margin of the runs of ``geometries`` on corpus S, a range."""
    runs = [r for g in geometries for r in c.runs_of(g, "S")]
    return span_of([c.value("eval", r, "margin", task=task) for r in runs])


@recipe("loss")
def loss_spearman(c: Context, *, base_heads):
    """Spearman(validation loss, geometric-mean N_eff) over the included models (with
    ``base_heads``: those with the base architecture's heads per layer)."""
    frame = c.frame("loss")
    if frame.empty:
        return None
    frame = frame[frame["included"]]
    if base_heads:
        frame = frame[frame["index_meaningful"]]
    rho, _ = spearman_rho(frame["val_loss"].to_numpy(), frame["N_eff_geomean"].to_numpy())
    return float(rho) if np.isfinite(rho) else None
