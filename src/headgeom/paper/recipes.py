"""How the paper-vs-run comparison computes a run's value for each reference number: the
recipes, by name (:data:`RECIPES`).

A reference of ``headgeom/paper/references.yaml`` names its recipe and the recipe's
arguments (``recipe: stat``, ``args: {kind: summaries, geometry: learned, corpus: S, task:
sva, column: N_eff}``); :mod:`headgeom.paper.comparison` calls ``recipe(context, **args)``.
A recipe returns a number, a (min, max) range over the models or tasks the paper's number
covers, or None when the study lacks what it needs. :func:`recipe` registers one with the
input kinds it reads (``"{kind}"``: the kind its ``kind`` argument names); a reference whose
kinds the study does not make is listed as "not in this study".

A model is named by geometry and, where the study names corpora, corpus (``corpus: S``; a
study that does not, like the demo, matches any corpus); ``seed_index`` picks a seed in
config order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headgeom.analysis.stats import spearman as spearman_rho
from headgeom.paper.clamps import path_shares
from headgeom.selections import COORDINATE_GROUPS, geometry_registry, in_tau_range
from headgeom.vocabulary import TASKS

if TYPE_CHECKING:
    from headgeom.paper.comparison import Context, Value


class Recipe:
    """A named way to compute a run's value from the comparison's inputs."""

    def __init__(self, function: Callable[..., Value], kinds: tuple[str, ...]):
        self.function, self.name, self._kinds = function, function.__name__, kinds

    def kinds(self, args: dict) -> tuple[str, ...]:
        """The input kinds the recipe reads with ``args``."""
        return tuple(k.format(**args) for k in self._kinds)

    def __call__(self, c: Context, **args) -> Value:
        return self.function(c, **args)


#: Every recipe by name.
RECIPES: dict[str, Recipe] = {}


def recipe(*kinds: str) -> Callable[[Callable], Recipe]:
    """Register a recipe that reads inputs of ``kinds`` (``"{kind}"``: its ``kind`` argument)."""

    def register(function: Callable) -> Recipe:
        if function.__name__ in RECIPES:
            raise ValueError(f"a recipe is already named {function.__name__!r}")
        RECIPES[function.__name__] = Recipe(function, kinds)
        return RECIPES[function.__name__]

    return register


def _span(values: Sequence[float | None]) -> Value:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return (min(values), max(values)) if len(values) > 1 else values[0]


def _runs_in(frame: pd.DataFrame, runs: set) -> list[bool]:
    return [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]


# ----------------------------------------------------------------------------- §20.1
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


# ----------------------------------------------------------------------------- §20.2
@recipe("exclusivity")
def run_scope(c: Context, *, quantity, geometry, read_types):
    """Per-run exclusivity ``quantity`` over ``read_types``, a range over the runs."""
    frame = c.frame("exclusivity")
    rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
    rows = rows[rows["read_type"].isin(read_types)]
    return _span(rows.loc[_runs_in(rows, set(c.runs_of(geometry))), "value"].tolist())


@recipe("exclusivity")
def run_scope_all(c: Context, *, quantity):
    """Per-run exclusivity ``quantity``, a range over every run and read type."""
    frame = c.frame("exclusivity")
    rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
    return _span(rows["value"].tolist())


@recipe("exclusivity")
def excl(c: Context, *, quantity, read_type=None, scope="all"):
    """One exclusivity summary value."""
    return c.excl(quantity, scope, read_type)


@recipe("exclusivity")
def excl_span(c: Context, *, quantity, scope, read_types):
    """An exclusivity summary value, a range over ``read_types``."""
    return _span([c.excl(quantity, scope, x) for x in read_types])


@recipe("exclusivity")
def matching(c: Context):
    """Share of the discovery-selected top heads that match."""
    frame = c.frame("exclusivity")
    rows = frame[frame["quantity"] == "discovery_heads_matching"]
    return None if rows.empty else float(rows["value"].iloc[0] / rows["n"].iloc[0])


# ----------------------------------------------------------------------------- §20.3
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
        frame = frame[_runs_in(frame, {r for g in geometries for r in c.runs_of(g, "S")})]
    return _span(frame[column].tolist())


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
    return _span([spearman(c, subset=subset, task=t) for t in tasks])


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
    return _span(values)


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
            if geometry_registry().reader_kind(g) == "block"
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
    return _span([c.value("eval", r, "margin", task=task) for r in runs])


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


# ----------------------------------------------------------------------------- §20.4
@recipe("lanes")
def lane(c: Context, *, geometry, corpus, task, column="lambda_score"):
    """``column`` of a run's lane Parquet for ``task``."""
    return c.value("lanes", c.run(geometry, corpus), column, split=None, task=task)


@recipe("lanes")
def lane_span(c: Context, *, geometry, corpus, column="lambda_score"):
    """:func:`lane` over the three tasks, a range."""
    return _span([lane(c, geometry=geometry, corpus=corpus, task=t, column=column) for t in TASKS])


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
    return _span(
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
            geometry_registry().is_baseline(geometry[(m, int(s))])
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
    return _span(rows.loc[mask, column].tolist())


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


# ----------------------------------------------------------------------------- §20.5
@recipe("geometry")
def geometry_span(c: Context, *, column, geometries):
    """``column`` of the weight-geometry summaries of the runs of ``geometries``, a range."""
    frame = c.frame("geometry")
    runs = {r for g in geometries for r in c.runs_of(g)}
    if frame.empty or not runs:
        return None
    return _span(list(frame.loc[_runs_in(frame, runs), column]))


# ----------------------------------------------------------------------------- §20.6
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
    return _span([path_sum(c, geometry=g, column=column) for g in geometries])


@recipe("clamp_paths")
def shares(c: Context, *, geometries, corpus, key):
    """``key`` of ``tables.path_shares`` over the runs of ``geometries`` (on ``corpus``)."""
    frame = c.frame("clamp_paths")
    runs = {r for g in geometries for r in c.runs_of(g, corpus)}
    if frame.empty or not runs:
        return None
    keep = _runs_in(frame, runs)
    return float(path_shares(frame[keep])[key]) if any(keep) else None


@recipe("edge_summary")
def edge_summary(c: Context, *, column, geometry, corpus=None):
    """``column`` of the edge summaries of every run of ``geometry`` (a range over runs)."""
    frame = c.frame("edge_summary")
    if frame.empty:
        return None
    rows = frame[_runs_in(frame, set(c.runs_of(geometry, corpus)))]
    return _span(rows[column].tolist()) if len(rows) else None


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
    return _span(rows["share_evaluation"].tolist()) if len(rows) else None


# ----------------------------------------------------------------------------- dynamics
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
    return _span(_timeline_at(c, fraction)[column].tolist())


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
    return _span([float(frame[column].min()), float(frame[column].max())])


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
