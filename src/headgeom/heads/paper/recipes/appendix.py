"""Recipes of METHODS §20.6 (the paper's Appendix B): path decomposition, edges and the ACDC
circuit, coordinate concentration."""

from __future__ import annotations

from headgeom.heads.paper.clamps import path_shares
from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, runs_in, span_of
from headgeom.heads.selections import COORDINATE_GROUPS


@recipe("clamp_paths")
def path_sum(c: Context, *, geometry, column, corpus="S"):
    """Σ ``column`` of a run's SVA path decomposition (its top heads)."""
    frame = c.frame("clamp_paths")
    run = c.run(geometry, corpus)
    if frame.empty or run is None:
        return None
    rows = frame[(frame["model"] == run[0]) & (frame["seed"] == run[1]) & (frame["task"] == "sva")]
    return float(rows[column].sum()) if len(rows) else None


@recipe("clamp_paths")
def path_sum_span(c: Context, *, geometries, column):
    """:func:`path_sum` (corpus S) of ``geometries``, a range."""
    return span_of([path_sum(c, geometry=g, column=column) for g in geometries])


@recipe("clamp_paths")
def shares(c: Context, *, geometries, corpus, key):
    """``key`` of ``tables.path_shares`` over the runs of ``geometries`` (on ``corpus``)."""
    frame = c.frame("clamp_paths")
    runs = {r for g in geometries for r in c.runs_of(g, corpus)}
    if frame.empty or not runs:
        return None
    keep = runs_in(frame, runs)
    return float(path_shares(frame[keep])[key]) if any(keep) else None


@recipe("edge_summary")
def edge_summary(c: Context, *, column, geometry, corpus=None):
    """``column`` of the edge summaries of every run of ``geometry`` (a range over runs)."""
    frame = c.frame("edge_summary")
    if frame.empty:
        return None
    rows = frame[runs_in(frame, set(c.runs_of(geometry, corpus)))]
    return span_of(rows[column].tolist()) if len(rows) else None


@recipe("edge_summary")
def edges_per_model(c: Context):
    """The edges one model's summary counts (3·H²·L(L−1)/2; the paper's 12×12 shape)."""
    frame = c.frame("edge_summary")
    return float(frame["n_edges"].max()) if not frame.empty else None


@recipe("acdc")
def acdc_into_attention(c: Context, *, source_kind):
    """ACDC edges into attention-head inputs (q, k, v), all (None) or from ``source_kind``."""
    frame = c.frame("acdc")
    if frame.empty:
        return None
    into = frame[frame["target_kind"].isin(["q", "k", "v"])]
    if source_kind is not None:
        into = into[into["source_kind"] == source_kind]
    return float(len(into))


@recipe("coordinates")
def coordinate_share(c: Context, *, groups, site, task="sva"):
    """Top-10 share (evaluation split, directions selected on validation) at ``site`` of the
    best layer, a range over the runs of the model ``groups`` (selections.COORDINATE_GROUPS)."""
    frame = c.frame("coordinates")
    if frame.empty:
        return None
    geometries = [g for g, group in COORDINATE_GROUPS.items() if group in groups]
    runs = {r for g in geometries for r in c.runs_of(g)}
    keep = [
        (m, int(s)) in runs and t == task and x == site
        for m, s, t, x in zip(
            frame["model"], frame["seed"], frame["task"], frame["site"], strict=True
        )
    ]
    rows = frame[keep]
    return span_of(rows["share_evaluation"].tolist()) if len(rows) else None
