"""Recipes of METHODS §20.4 (the paper's §5.3): lane scores, SVA index repetition, lane shares
and the clamps."""

from __future__ import annotations

import numpy as np

from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, span_of
from headgeom.model import facts
from headgeom.vocabulary import TASKS


@recipe("lanes")
def lane(c: Context, *, geometry, corpus, task, column="lambda_score"):
    """``column`` of a run's lane Parquet for ``task``."""
    return c.value("lanes", c.run(geometry, corpus), column, split=None, task=task)


@recipe("lanes")
def lane_span(c: Context, *, geometry, corpus, column="lambda_score"):
    """:func:`lane` over the three tasks, a range."""
    return span_of(
        [lane(c, geometry=geometry, corpus=corpus, task=t, column=column) for t in TASKS]
    )


@recipe("heads")
def index_repeats(c: Context, *, geometry, corpus=None, task="sva"):
    """Share of the runs of ``geometry`` whose top-3 discovery heads repeat a head index."""
    heads = c.frame("heads")
    runs = c.runs_of(geometry, corpus)
    if heads.empty or not runs:
        return None
    values = []
    for m, s in runs:
        rows = heads[
            (heads["model"] == m)
            & (heads["seed"] == s)
            & (heads["task"] == task)
            & (heads["split"] == "discovery")
        ]
        top = rows.sort_values(["e", "layer", "head"], ascending=[False, True, True]).head(3)
        values.append(float(top["head"].duplicated().any()))
    return float(np.mean(values))


@recipe("summaries")
def share_span(c: Context, *, geometry, tasks):
    """Top-head share of E of every run of ``geometry``, a range over runs and ``tasks``."""
    return span_of(
        [
            c.value("summaries", r, "top_head_share", task=t)
            for r in c.runs_of(geometry)
            for t in tasks
        ]
    )


@recipe("clamp_pairs")
def clamp_span(c: Context, *, same, learned, column):
    """Pair-clamp reductions ``column``, a range over the pairs (``same``: same-index pairs
    only, or different-index only; ``learned``: learned-write models only, or frozen-write
    only; None: both). ``reduction_mlps`` counts each source head once."""
    pairs = c.frame("clamp_pairs")
    if pairs.empty:
        return None
    geometry = c.runs.set_index(["model", "seed"])["geometry"]
    is_learned = np.array(
        [
            facts.is_baseline(geometry[(m, int(s))])
            for m, s in zip(pairs["model"], pairs["seed"], strict=True)
        ]
    )
    rows = pairs
    if column == "reduction_mlps":
        keys = ["model", "seed", "task", "source_layer", "source_head"]
        keep = ~pairs.duplicated(keys).to_numpy()
        rows, is_learned = pairs[keep], is_learned[keep]
    mask = np.ones(len(rows), bool)
    if same is not None:
        mask &= rows["same_index"].to_numpy() == same
    if learned is not None:
        mask &= is_learned == learned
    return span_of(rows.loc[mask, column].tolist())


@recipe("clamp_lumped")
def lumped(c: Context, *, geometry, corpus, task, same):
    """Mean lumped lane-clamp reduction of a run (same index, or the other indices)."""
    frame = c.frame("clamp_lumped")
    run = c.run(geometry, corpus)
    if frame.empty or run is None:
        return None
    rows = frame[
        (frame["model"] == run[0])
        & (frame["seed"] == run[1])
        & (frame["task"] == task)
        & (frame["same_index"] == same)
    ]
    return float(rows["reduction"].mean()) if len(rows) else None
