"""Recipes of METHODS training dynamics (§13.2, §13.4, §14.4–14.5): the timelines, τ,
V-gradient fractions and the scalar-part ablation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes.recipe import recipe, span_of
from headgeom.heads.selections import in_tau_range


# The paper's steps as fractions of its 65,536 training steps, matched to the run's nearest
# checkpoint on a log scale: 4,096 = 1/16 of training, 256 = 1/256.
def _timeline_at(c: Context, fraction: float | None) -> pd.DataFrame:
    """Timeline rows (every timeline run) at the checkpoint nearest ``fraction`` of training
    on a log scale (None: the final checkpoint)."""
    frame = c.frame("timeline")
    if frame.empty:
        return frame
    rows = []
    for _, run in frame.groupby(["model", "seed"]):
        if fraction is None:
            rows.append(run[run["is_final"]])
            continue
        final = int(run["step"].max())
        steps = run.loc[run["step"] > 0, "step"]
        target = fraction * final
        nearest = steps.iloc[int(np.argmin(np.abs(np.log(steps / target))))]
        rows.append(run[run["step"] == nearest])
    return pd.concat(rows)


@recipe("timeline")
def timeline(c: Context, *, column, fraction):
    """``column`` of every timeline run at ``fraction`` of training (None: final), a range."""
    return span_of(_timeline_at(c, fraction)[column].tolist())


@recipe("tau")
def tau(c: Context, *, column):
    """The range over the paper's τ steps (selections.in_tau_range: its 1,024–65,536, not
    the timelines' 256) of every timeline run."""
    frame = c.frame("tau")
    if frame.empty:
        return None
    final = frame.groupby(["model", "seed"])["step"].transform("max")
    frame = frame[[in_tau_range(s, f) for s, f in zip(frame["step"], final, strict=True)]]
    if frame.empty:
        return None
    return span_of([float(frame[column].min()), float(frame[column].max())])


@recipe("value_gradients")
def own_largest(c: Context, *, first_step):
    """Share of heads whose own V-gradient trace is the largest, at step 0 (``first_step``)
    or at the first traced step after it (the paper's step 256 = 1/256 of training)."""
    frame = c.frame("value_gradients")
    if frame.empty:
        return None
    traced = sorted(frame.loc[~frame["is_final"], "step"].unique())
    later = [s for s in traced if s > 0]
    step = 0 if first_step else (later[0] if later else None)
    rows = frame[frame["step"] == step]
    return float(rows["own_largest"].mean()) if len(rows) else None


@recipe("scalar_ablation")
def scalar_hurts_more(c: Context):
    """Share of (run, task) cases where removing the scalar part drops the margin more than
    the mean of its equal-norm random controls."""
    frame = c.frame("scalar_ablation")
    if frame.empty:
        return None
    cases = frame.groupby(["model", "seed", "task"])
    more = [
        float(g.loc[g["kind"] == "scalar", "drop"].mean())
        > float(g.loc[g["kind"] == "random", "drop"].mean())
        for _, g in cases
    ]
    return float(np.mean(more))
