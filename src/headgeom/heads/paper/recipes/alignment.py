"""Recipes of METHODS §20.5 (the paper's §5.4): V self-alignment of the geometry summaries."""

from __future__ import annotations

from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, runs_in, span_of


@recipe("geometry")
def geometry_span(c: Context, *, column, geometries):
    """``column`` of the weight-geometry summaries of the runs of ``geometries``, a range."""
    frame = c.frame("geometry")
    runs = {r for g in geometries for r in c.runs_of(g)}
    if frame.empty or not runs:
        return None
    return span_of(list(frame.loc[runs_in(frame, runs), column]))
