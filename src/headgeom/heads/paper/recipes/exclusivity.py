"""Recipes of METHODS §20.2 (the paper's §5.1): leakage and exclusivity summaries."""

from __future__ import annotations

from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, runs_in, span_of


@recipe("exclusivity")
def run_scope(c: Context, *, quantity, geometry, read_types):
    """Per-run exclusivity ``quantity`` over ``read_types``, a range over the runs."""
    frame = c.frame("exclusivity")
    rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
    rows = rows[rows["read_type"].isin(read_types)]
    return span_of(rows.loc[runs_in(rows, set(c.runs_of(geometry))), "value"].tolist())


@recipe("exclusivity")
def run_scope_all(c: Context, *, quantity):
    """Per-run exclusivity ``quantity``, a range over every run and read type."""
    frame = c.frame("exclusivity")
    rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
    return span_of(rows["value"].tolist())


@recipe("exclusivity")
def excl(c: Context, *, quantity, read_type=None, scope="all"):
    """One exclusivity summary value."""
    return c.excl(quantity, scope, read_type)


@recipe("exclusivity")
def excl_span(c: Context, *, quantity, scope, read_types):
    """An exclusivity summary value, a range over ``read_types``."""
    return span_of([c.excl(quantity, scope, x) for x in read_types])


@recipe("exclusivity")
def matching(c: Context):
    """Share of the discovery-selected top heads that match."""
    frame = c.frame("exclusivity")
    rows = frame[frame["quantity"] == "discovery_heads_matching"]
    return None if rows.empty else float(rows["value"].iloc[0] / rows["n"].iloc[0])
