"""Recipes of METHODS §20.1 (the paper's §4): parameter counts, validation losses, clean
accuracy and the weight-space geometry of each run."""

from __future__ import annotations

import numpy as np

from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe


@recipe("runs")
def run_column(c: Context, *, geometry, corpus, column, seed_index=0):
    """``column`` of a run's training log (n_params, val_loss)."""
    run = c.run(geometry, corpus, seed_index)
    if run is None:
        return None
    row = c.runs[(c.runs["model"] == run[0]) & (c.runs["seed"] == run[1])]
    return float(row[column].iloc[0])


@recipe("runs")
def millions(c: Context, *, geometry):
    """The parameter count of the first run of ``geometry``, in millions."""
    count = run_column(c, geometry=geometry, corpus=None, column="n_params")
    return None if count is None else count / 1e6


@recipe("runs")
def delta(c: Context, *, geometry, corpus):
    """Validation loss minus the learned run's of the same seed (else the learned mean)."""
    run, learned = c.run(geometry, corpus), c.runs_of("learned", corpus)
    if run is None or not learned:
        return None
    loss = c.runs.set_index(["model", "seed"])["val_loss"]
    same = [r for r in learned if r[1] == run[1]]
    ref = loss[same[0]] if same else float(np.mean([loss[r] for r in learned]))
    return float(loss[run] - ref)


@recipe("eval")
def accuracy_range(c: Context):
    """Clean accuracy over every run and task, evaluation split."""
    ev = c.frame("eval")
    ev = ev[ev["split"] == "evaluation"]
    return (float(ev["accuracy"].min()), float(ev["accuracy"].max())) if len(ev) else None


@recipe("geometry")
def geometry_value(c: Context, *, geometry, column, corpus=None):
    """``column`` of the first run's weight-geometry summary."""
    return c.value("geometry", c.run(geometry, corpus), column, None)
