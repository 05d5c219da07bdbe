"""The paper-vs-run comparison (issue 14): every reference number of METHODS §20 beside this
run's value, computed from the result Parquets.

The comparison is a registry, :data:`REFERENCES`: one :class:`Reference` per number (metric,
model, split, the paper's value or range, and how to compute the run's value from Parquets
of given input kinds). Another analysis adds its numbers with :func:`register` (and its
input kinds to ``PAPER_INPUTS["comparison"]``); a reference whose inputs the study does not
make, or whose model it lacks, is listed with "not in this study".

A model is named by geometry (and corpus, where the study names corpora; a study that does
not, like the demo, matches any corpus). Values are computed from unrounded numbers; a value
"lies within" the paper's range when it does after rounding to the paper's printed
precision (half a unit of the last printed digit of slack).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from headgeom.paper.selections import geometry_registry, in_tau_range
from headgeom.paper.tables import COORDINATES_PAPER, Block, Inputs, Table, read_runs

Value = float | tuple[float, float] | None


class Context:
    """Lazy access to the comparison's inputs by kind, and the runs by geometry."""

    def __init__(self, inputs: Inputs):
        self.inputs = inputs
        self._frames: dict[str, pd.DataFrame] = {}

    def has(self, kind: str) -> bool:
        return bool(self.inputs.get(kind))

    def frame(self, kind: str) -> pd.DataFrame:
        if kind not in self._frames:
            paths = list(self.inputs.get(kind, []))
            frames = [pq.read_table(p).to_pandas() for p in paths]
            self._frames[kind] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._frames[kind]

    @cached_property
    def runs(self) -> pd.DataFrame:
        return read_runs(self.inputs["runs"])

    @cached_property
    def with_corpora(self) -> bool:
        return bool((self.runs["corpus"] != "—").any())

    def runs_of(self, geometry: str, corpus: str | None = None) -> list[tuple[str, int]]:
        """(model, seed) of every run of ``geometry`` (on ``corpus`` when the study names
        corpora), in config order."""
        rows = self.runs[self.runs["geometry"] == geometry]
        if corpus is not None and self.with_corpora:
            rows = rows[rows["corpus"] == corpus]
        return list(zip(rows["model"], rows["seed"].astype(int), strict=True))

    def run(self, geometry: str, corpus: str | None = None, seed_index: int = 0):
        runs = self.runs_of(geometry, corpus)
        return runs[seed_index] if len(runs) > seed_index else None

    def value(self, kind: str, run, column: str, split: str | None = "evaluation", **where):
        """The one value of ``column`` in ``kind`` for ``run`` (and ``where`` filters)."""
        frame = self.frame(kind)
        if run is None or frame.empty:
            return None
        mask = (frame["model"] == run[0]) & (frame["seed"] == run[1])
        if split is not None and "split" in frame:
            mask &= frame["split"] == split
        for key, want in where.items():
            mask &= frame[key] == want
        rows = frame.loc[mask, column]
        return float(rows.iloc[0]) if len(rows) else None

    def excl(self, quantity: str, scope: str = "all", read_type: str | None = None):
        frame = self.frame("exclusivity")
        if frame.empty:
            return None
        mask = (frame["quantity"] == quantity) & (frame["scope"] == scope)
        if read_type is not None:
            mask &= frame["read_type"] == read_type
        rows = frame.loc[mask, "value"]
        return float(rows.iloc[0]) if len(rows) else None


@dataclass(frozen=True, kw_only=True)
class Reference:
    """One reference number: ``paper`` as printed, its range [low, high] (a point value has
    low = high; a bound has one end infinite), the printed decimals, and ``compute`` from the
    inputs of ``kinds`` (returns a number, a (min, max) range over models, or None when the
    study lacks the model)."""

    section: str
    metric: str
    model: str
    paper: str
    low: float
    high: float
    decimals: int
    compute: Callable[[Context], Value]
    kinds: tuple[str, ...]
    split: str = "evaluation"
    percent: bool = False

    def within(self, value: Value) -> bool | None:
        if value is None:
            return None
        values = value if isinstance(value, tuple) else (value,)
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        scale = 100.0 if self.percent else 1.0
        slack = 0.5 * 10.0 ** (-self.decimals)
        return all(
            self.low * scale - slack - 1e-12 <= v * scale <= self.high * scale + slack + 1e-12
            for v in values
        )

    def show(self, value: Value) -> str:
        if value is None:
            return "—"
        scale, suffix = (100.0, "%") if self.percent else (1.0, "")
        digits = self.decimals + 1 if abs(self.decimals) < 4 else self.decimals

        def one(v: float) -> str:
            return "—" if v is None or not math.isfinite(v) else f"{v * scale:.{digits}f}{suffix}"

        if isinstance(value, tuple):
            return f"{one(value[0])} – {one(value[1])}"
        return one(value)


REFERENCES: list[Reference] = []


def register(
    section: str,
    metric: str,
    model: str,
    paper: str,
    low: float,
    high: float | None = None,
    *,
    compute: Callable[[Context], Value],
    kinds: Sequence[str],
    decimals: int | None = None,
    split: str = "evaluation",
    percent: bool = False,
) -> Reference:
    """Add one reference number (``high`` defaults to ``low``: a point value; ``decimals``
    to those of ``paper``'s first number)."""
    if decimals is None:
        first = paper.replace("−", "-").lstrip("≤≥<>+- ").split()[0].rstrip("%,;")
        decimals = len(first.split(".")[1]) if "." in first else 0
    ref = Reference(
        section=section,
        metric=metric,
        model=model,
        paper=paper,
        low=low,
        high=low if high is None else high,
        decimals=decimals,
        compute=compute,
        kinds=tuple(kinds),
        split=split,
        percent=percent,
    )
    REFERENCES.append(ref)
    return ref


def _span(values: Sequence[float | None]) -> Value:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return (min(values), max(values)) if len(values) > 1 else values[0]


INF = math.inf
TASKS = ("sva", "quote", "plural")
TASK_NAME = {"sva": "SVA", "quote": "Quote", "plural": "Plural"}
CORPUS_LABEL = {"R": "corpus R", "S": "corpus S"}


def _label(geometry: str, corpus: str | None, seed: str = "") -> str:
    return f"{geometry}{f' ({corpus}{seed})' if corpus else ''}"


# ----------------------------------------------------------------------------- §20.1
def _run_column(geometry, corpus, column, seed_index=0):
    def compute(c: Context):
        run = c.run(geometry, corpus, seed_index)
        if run is None:
            return None
        row = c.runs[(c.runs["model"] == run[0]) & (c.runs["seed"] == run[1])]
        return float(row[column].iloc[0])

    return compute


def _millions(geometry):
    def compute(c: Context):
        count = _run_column(geometry, None, "n_params")(c)
        return None if count is None else count / 1e6

    return compute


def _delta(geometry, corpus):
    def compute(c: Context):
        run, learned = c.run(geometry, corpus), c.runs_of("learned", corpus)
        if run is None or not learned:
            return None
        loss = c.runs.set_index(["model", "seed"])["val_loss"]
        same = [r for r in learned if r[1] == run[1]]
        ref = loss[same[0]] if same else float(np.mean([loss[r] for r in learned]))
        return float(loss[run] - ref)

    return compute


for _g, _c, _text, _v in (
    ("learned", None, "124.05M", 124.05),
    ("write-common-axis", None, "116.97M", 116.97),
    ("read-common", None, "104.58M", 104.58),
    ("all-common-axis", None, "97.50M", 97.50),
    ("multiscreen-identity", None, "106.51M", 106.51),
    ("multiscreen-learned", None, "128.53M", 128.53),
):
    register(
        "§20.1",
        "parameters (millions)",
        _label(_g, _c),
        _text,
        _v,
        kinds=["runs"],
        compute=_millions(_g),
        split="—",
    )
for _g, _c, _seed, _v in (
    ("learned", "R", 0, 3.604),
    ("learned", "R", 1, 3.595),
    ("write-common-axis", "R", 0, 3.643),
    ("write-common-axis", "R", 1, 3.643),
    ("write-common", "R", 0, 3.648),
    ("write-rotated", "R", 0, 3.654),
    ("learned", "S", 0, 3.508),
    ("write-rotated", "S", 0, 3.563),
    ("read-common", "S", 0, 3.610),
    ("all-common-axis", "S", 0, 3.698),
    ("all-rotated", "S", 0, 3.751),
    ("all-rotated-self", "S", 0, 3.753),
    ("write-routed-a", "S", 0, 3.542),
    ("write-routed-b", "S", 0, 3.543),
    ("write-routed-c", "S", 0, 3.553),
):
    register(
        "§20.1",
        "validation loss (nats)",
        _label(_g, _c, f", seed #{_seed + 1}"),
        f"{_v:.3f}",
        _v,
        kinds=["runs"],
        compute=_run_column(_g, _c, "val_loss", _seed),
        split="validation file",
    )
for _g, _c, _v in (
    ("write-common-axis", "R", 0.039),
    ("write-common", "R", 0.044),
    ("write-rotated", "R", 0.050),
    ("write-rotated", "S", 0.056),
    ("read-common", "S", 0.102),
    ("all-common-axis", "S", 0.190),
    ("all-rotated", "S", 0.243),
    ("all-rotated-self", "S", 0.246),
):
    register(
        "§20.1",
        "Δ validation loss vs learned",
        _label(_g, _c),
        f"+{_v:.3f}",
        _v,
        kinds=["runs"],
        compute=_delta(_g, _c),
        split="validation file",
    )


def _accuracy_range(c: Context):
    ev = c.frame("eval")
    ev = ev[ev["split"] == "evaluation"]
    return (float(ev["accuracy"].min()), float(ev["accuracy"].max())) if len(ev) else None


register(
    "§20.1",
    "clean accuracy, all models and tasks",
    "all",
    "85.8–100%",
    0.858,
    1.0,
    kinds=["eval"],
    compute=_accuracy_range,
    percent=True,
    decimals=1,
)


def _geometry_value(geometry, column, corpus=None):
    return lambda c: c.value("geometry", c.run(geometry, corpus), column, None)


register(
    "§20.1",
    "cross-member head-block PK (d²/D)",
    "write-rotated",
    "5.3320–5.3359",
    5.3320,
    5.3359,
    kinds=["geometry"],
    split="weights",
    compute=_geometry_value("write-rotated", "write_write_pk_other_index_mean"),
)


# ----------------------------------------------------------------------------- §20.2
def _run_scope(quantity, geometry, read_types):
    def compute(c: Context):
        frame = c.frame("exclusivity")
        runs = set(c.runs_of(geometry))
        rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
        rows = rows[rows["read_type"].isin(read_types)]
        keep = [(m, int(s)) in runs for m, s in zip(rows["model"], rows["seed"], strict=True)]
        return _span(rows.loc[keep, "value"].tolist())

    return compute


for _g, _xs, _text, _lo, _hi in (
    ("learned", ("Q", "K"), "1.09–1.13", 1.09, 1.13),
    ("learned", ("V",), "0.95–0.97", 0.95, 0.97),
    ("write-common-axis", ("Q", "K"), "1.02–1.05", 1.02, 1.05),
    ("write-common-axis", ("V",), "0.97", 0.97, 0.97),
):
    register(
        "§20.2",
        f"median L/ρ ({', '.join(_xs)})",
        _g,
        _text,
        _lo,
        _hi,
        kinds=["exclusivity"],
        compute=_run_scope("median_leakage_over_rho", _g, _xs),
    )
for _g, _text, _lo, _hi in (
    ("learned", "0.73–0.81", 0.73, 0.81),
    ("write-common-axis", "0.46–0.72", 0.46, 0.72),
):
    register(
        "§20.2",
        "Spearman(L, ρ) across pairs",
        _g,
        _text,
        _lo,
        _hi,
        kinds=["exclusivity"],
        compute=_run_scope("spearman_leakage_rho", _g, ("Q", "K", "V")),
    )
register(
    "§20.2",
    "median energy L of a source–reader pair",
    "leakage models",
    "8–12%",
    0.08,
    0.12,
    kinds=["exclusivity"],
    percent=True,
    compute=lambda c: _run_scope_all("median_leakage")(c),
)


def _run_scope_all(quantity):
    def compute(c: Context):
        frame = c.frame("exclusivity")
        rows = frame[(frame["quantity"] == quantity) & (frame["scope"] == "run")]
        return _span(rows["value"].tolist())

    return compute


def _excl(quantity, read_type=None, scope="all", scale=1.0):
    def compute(c: Context):
        v = c.excl(quantity, scope, read_type)
        return None if v is None else v * scale

    return compute


for _q, _x, _metric, _text, _lo, _hi, _pct in (
    ("top_pairs", "Q", "top-3 pairs: number of ordered pairs", "40", 40, 40, False),
    (
        "top_pair_percentile_median",
        "Q",
        "top pairs, Q leakage percentile (median)",
        "97.6",
        97.6,
        97.6,
        False,
    ),
    (
        "top_pair_share_above_90",
        "Q",
        "top pairs, Q above the 90th percentile",
        "85%",
        0.85,
        0.85,
        True,
    ),
    (
        "top_pair_leakage_over_rho_median",
        "Q",
        "top pairs, Q L/ρ (median)",
        "1.77×",
        1.77,
        1.77,
        False,
    ),
    (
        "top_pair_leakage_over_rho_median",
        "V",
        "top pairs, V L/ρ (median)",
        "1.26×",
        1.26,
        1.26,
        False,
    ),
    ("top_pair_percentile_median", "V", "top pairs, V percentile (median)", "90", 90, 90, False),
    (
        "top_pair_leakage_over_rho_median",
        "K",
        "top pairs, K L/ρ (median)",
        "1.19×",
        1.19,
        1.19,
        False,
    ),
    ("top_pair_percentile_median", "K", "top pairs, K percentile (median)", "77", 77, 77, False),
    (
        "layer_matched_percentile_median",
        "Q",
        "layer-matched Q percentile (median)",
        "97",
        97,
        97,
        False,
    ),
    (
        "layer_matched_share_above_90",
        "Q",
        "layer-matched Q above the 90th",
        "78%",
        0.78,
        0.78,
        True,
    ),
    (
        "discovery_top_pair_percentile_median",
        "Q",
        "discovery-selected: Q percentile (median)",
        "97",
        97,
        97,
        False,
    ),
    (
        "discovery_top_pair_share_above_90",
        "Q",
        "discovery-selected: Q above the 90th",
        "78%",
        0.78,
        0.78,
        True,
    ),
    (
        "discovery_top_pair_leakage_over_rho_median",
        "Q",
        "discovery-selected: Q L/ρ (median)",
        "1.80×",
        1.80,
        1.80,
        False,
    ),
):
    register(
        "§20.2",
        _metric,
        "leakage models",
        _text,
        _lo,
        _hi,
        kinds=["exclusivity"],
        compute=_excl(_q, _x),
        percent=_pct,
    )
for _g, _x, _text, _v in (
    ("learned", "Q", "97", 97),
    ("write-common-axis", "Q", "96", 96),
    ("learned", "V", "95", 95),
    ("write-common-axis", "V", "63", 63),
):
    register(
        "§20.2",
        f"layer-matched {_x} percentile (median)",
        _g,
        _text,
        _v,
        kinds=["exclusivity"],
        compute=_excl("layer_matched_percentile_median", _x, f"geometry:{_g}"),
    )
for _q, _name, _vals in (
    ("response_cosine_median", "cosine", (0.86, 0.81, 0.83)),
    ("response_norm_ratio_median", "norm ratio", (0.98, 0.94, 0.88)),
    ("response_projection_median", "projection coefficient", (0.84, 0.81, 0.70)),
):
    for _x, _v in zip(("Q", "K", "V"), _vals, strict=True):
        register(
            "§20.2",
            f"direct vs total, top pairs, {_x}: {_name}",
            "leakage models",
            f"{_v:.2f}",
            _v,
            kinds=["exclusivity"],
            compute=_excl(_q, _x, "top_pairs"),
        )
for _q, _name, _lo, _hi in (
    ("response_cosine_median", "cosine", 0.50, 0.53),
    ("response_norm_ratio_median", "norm ratio", 0.72, 0.80),
    ("response_projection_median", "projection coefficient", 0.34, 0.49),
):
    register(
        "§20.2",
        f"direct vs total, all pairs (Q, K, V): {_name}",
        "leakage models",
        f"{_lo:.2f}–{_hi:.2f}",
        _lo,
        _hi,
        kinds=["exclusivity"],
        compute=(lambda q: lambda c: _span([c.excl(q, "all_pairs", x) for x in "QKV"]))(_q),
    )


def _matching(c: Context):
    frame = c.frame("exclusivity")
    rows = frame[frame["quantity"] == "discovery_heads_matching"]
    return None if rows.empty else float(rows["value"].iloc[0] / rows["n"].iloc[0])


register(
    "§20.2",
    "discovery-selected top heads matching",
    "leakage models",
    "41/45 (91%)",
    41 / 45,
    kinds=["exclusivity"],
    compute=_matching,
    percent=True,
    decimals=0,
)
for _q, _scope, _metric, _text, _v, _pct in (
    (
        "tv_query_exceeds_keys_share",
        "top_pairs",
        "attention TV: query-only > keys-only",
        "90%",
        0.90,
        True,
    ),
    ("tv_query_median", "top_pairs", "attention TV, query-only (median)", "0.029", 0.029, False),
    ("tv_keys_median", "top_pairs", "attention TV, keys-only (median)", "0.014", 0.014, False),
    (
        "tv_query_median",
        "all_later_heads",
        "attention TV, query-only, all later heads",
        "0.015",
        0.015,
        False,
    ),
    (
        "tv_query_percentile_median",
        "top_pairs",
        "attention TV, query-only percentile",
        "91",
        91,
        False,
    ),
    (
        "spearman_q_leakage_tv_query_median",
        "top3_sources",
        "Spearman(Q leakage, query-only TV), median over sources",
        "0.41",
        0.41,
        False,
    ),
    ("tv_total_median", "top_pairs", "attention TV total, top later heads", "0.035", 0.035, False),
    (
        "tv_direct_median",
        "top_pairs",
        "attention TV direct, top later heads",
        "0.033",
        0.033,
        False,
    ),
    (
        "tv_total_median",
        "other_later_heads",
        "attention TV total, other later heads",
        "0.032",
        0.032,
        False,
    ),
    (
        "tv_direct_median",
        "other_later_heads",
        "attention TV direct, other later heads",
        "0.019",
        0.019,
        False,
    ),
    (
        "tv_total_percentile_median",
        "top_pairs",
        "attention TV total, top-pair percentile",
        "66",
        66,
        False,
    ),
):
    register(
        "§20.2",
        _metric,
        "leakage models",
        _text,
        _v,
        kinds=["exclusivity"],
        compute=_excl(_q, None, _scope),
        percent=_pct,
    )


# ----------------------------------------------------------------------------- §20.3
def _stat(kind, geometry, corpus, task, column, seed_index=0):
    return lambda c: c.value(kind, c.run(geometry, corpus, seed_index), column, task=task)


_NEFF = {
    ("all-common-axis", "S"): (8.1, 12.7, 3.9),
    ("all-rotated", "S"): (9.1, 11.4, 3.6),
    ("all-rotated-self", "S"): (8.8, 7.9, 3.9),
    ("learned", "S"): (10.4, 12.0, 9.2),
    ("write-rotated", "S"): (16.2, 22.2, 22.2),
}
for (_g, _c), _vals in _NEFF.items():
    for _t, _v in zip(TASKS, _vals, strict=True):
        register(
            "§20.3",
            f"N_eff {TASK_NAME[_t]}",
            _label(_g, _c),
            f"{_v:.1f}",
            _v,
            kinds=["summaries"],
            compute=_stat("summaries", _g, _c, _t, "N_eff"),
        )


def _ratio(a, b, corpus, task):
    def compute(c: Context):
        x = _stat("summaries", a, corpus, task, "N_eff")(c)
        y = _stat("summaries", b, corpus, task, "N_eff")(c)
        return None if x is None or y is None else x / y

    return compute


for _t, _v in zip(TASKS, (1.6, 1.9, 2.4), strict=True):
    register(
        "§20.3",
        f"N_eff ratio write-rotated / learned, {TASK_NAME[_t]}",
        "write-rotated (S)",
        f"{_v:.1f}",
        _v,
        kinds=["summaries"],
        compute=_ratio("write-rotated", "learned", "S", _t),
    )


def _paired(a, b, task, column="diff"):
    def compute(c: Context):
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

    return compute


for (_a, _b, _dec), _vals in {
    ("write-rotated", "learned", 1): ((5.8, 5.2, 6.2), (10.2, 9.6, 11.0), (13.0, 12.1, 13.7)),
    ("all-common-axis", "all-rotated", 2): (
        (-1.06, -1.34, -0.80),
        (1.30, 0.24, 2.23),
        (0.29, -0.01, 0.64),
    ),
    ("all-common-axis", "all-rotated-self", 2): (
        (-0.71, -0.98, -0.45),
        (4.79, 4.19, 5.28),
        (-0.06, -0.38, 0.28),
    ),
}.items():
    for _t, (_d, _lo, _hi) in zip(TASKS, _vals, strict=True):
        _txt = f"{_d:+.{_dec}f} [{_lo:+.{_dec}f}, {_hi:+.{_dec}f}]".replace("-", "−")
        register(
            "§20.3",
            f"paired bootstrap N_eff(A) − N_eff(B), {TASK_NAME[_t]}",
            f"{_a} − {_b} (S)",
            _txt,
            _lo,
            _hi,
            kinds=["paired"],
            decimals=_dec,
            compute=_paired(_a, _b, _t),
        )


def _conditions_won(task):
    def compute(c: Context):
        frame = c.frame("conditions")
        a, b = c.run("all-common-axis", "S"), c.run("all-rotated", "S")
        if a is None or b is None or frame.empty:
            return None
        frame = frame[(frame["task"] == task) & (frame["split"] == "evaluation")]

        def of(run):
            rows = frame[(frame["model"] == run[0]) & (frame["seed"] == run[1])]
            return rows.set_index("condition")["N_eff"]

        both = pd.concat([of(a).rename("a"), of(b).rename("b")], axis=1, join="inner")
        return float((both["a"] < both["b"]).sum()) if len(both) else None

    return compute


for _t, _k in zip(TASKS, (3, 2, 1), strict=True):
    register(
        "§20.3",
        f"conditions where all-common-axis is more concentrated, {TASK_NAME[_t]}",
        "all-common-axis vs all-rotated (S)",
        f"{_k}/4",
        _k,
        kinds=["conditions"],
        compute=_conditions_won(_t),
        decimals=0,
    )


def _robustness_span(column, geometries=None, tasks=TASKS):
    def compute(c: Context):
        frame = c.frame("robustness")
        if frame.empty:
            return None
        frame = frame[(frame["split"] == "evaluation") & frame["task"].isin(tasks)]
        if geometries is not None:
            runs = {r for g in geometries for r in c.runs_of(g, "S")}
            keep = [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]
            frame = frame[keep]
        return _span(frame[column].tolist())

    return compute


register(
    "§20.3",
    "leave-one-group-out: max relative N_eff change",
    "all",
    "≤ 9%",
    0.0,
    0.09,
    kinds=["robustness"],
    percent=True,
    decimals=0,
    compute=lambda c: (lambda v: None if v is None else (v[1] if isinstance(v, tuple) else v))(
        _robustness_span("logo_max_rel_change")(c)
    ),
)
register(
    "§20.3",
    "per-example-abs N_eff / N_eff",
    "all",
    "1.4–3.0×",
    1.4,
    3.0,
    kinds=["robustness"],
    compute=_robustness_span("N_eff_abs_ratio"),
)


def _spearman(subset, task=None):
    def compute(c: Context):
        frame = c.frame("spearman")
        if frame.empty:
            return None
        rows = frame[(frame["analysis"] == "N_eff_vs_N_eff_abs") & (frame["subset"] == subset)]
        rows = rows[rows["task"].isna()] if task is None else rows[rows["task"] == task]
        return float(rows["rho"].iloc[0]) if len(rows) and pd.notna(rows["rho"].iloc[0]) else None

    return compute


register(
    "§20.3",
    "Spearman(N_eff, per-example-abs N_eff), paper pairs",
    "19 configurations",
    "0.95",
    0.95,
    kinds=["spearman"],
    compute=_spearman("paper_pairs"),
)
register(
    "§20.3",
    "Spearman(N_eff, per-example-abs N_eff) within a task, Figure 3 models",
    "Figure 3 models (S)",
    "0.83–0.94",
    0.83,
    0.94,
    kinds=["spearman"],
    compute=lambda c: _span([_spearman("figure3", t)(c) for t in TASKS]),
)


def _seed_ratio(task):
    def compute(c: Context):
        runs = c.runs_of("learned", "R")
        if len(runs) < 2:
            return None
        a = c.value("summaries", runs[0], "N_eff", task=task)
        b = c.value("summaries", runs[1], "N_eff", task=task)
        return max(a, b) / min(a, b)

    return compute


for _t, _v in zip(TASKS, (1.3, 1.3, 2.2), strict=True):
    register(
        "§20.3",
        f"learned seed ratio (larger/smaller N_eff), {TASK_NAME[_t]}",
        "learned (R), 2 seeds",
        f"{_v:.1f}",
        _v,
        kinds=["summaries"],
        compute=_seed_ratio(_t),
    )
for _g, _seed, _v in (
    ("write-common-axis", 0, 27.0),
    ("write-common-axis", 1, 26.6),
    ("learned", 0, 12.8),
    ("learned", 1, 16.9),
):
    register(
        "§20.3",
        "N_eff Quote",
        _label(_g, "R", f", seed #{_seed + 1}"),
        f"{_v:.1f}",
        _v,
        kinds=["summaries"],
        compute=_stat("summaries", _g, "R", "quote", "N_eff", _seed),
    )


def _routed_ratios(c: Context):
    learned = c.run("learned", "S")
    if learned is None:
        return None
    values = []
    for g in ("write-routed-a", "write-routed-b", "write-routed-c"):
        for t in TASKS:
            x = _stat("summaries", g, "S", t, "N_eff")(c)
            y = c.value("summaries", learned, "N_eff", task=t)
            if x is not None and y:
                values.append(x / y)
    return _span(values)


register(
    "§20.3",
    "routed / learned N_eff ratios (all 9)",
    "write-routed A/B/C (S)",
    "1.7–3.3",
    1.7,
    3.3,
    kinds=["summaries"],
    compute=_routed_ratios,
)


def _below_learned(block: bool | None, geometry: str | None = None):
    def compute(c: Context):
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
            c.value("summaries", r, "N_eff", task=t)
            < c.value("summaries", learned, "N_eff", task=t)
            for r in runs
            for t in TASKS
        )
        return float(k) / (3 * len(runs))

    return compute


register(
    "§20.3",
    "reader-restricted (block) below learned: share of model–task comparisons",
    "block-reader models (S)",
    "10 of 12 (83%)",
    10 / 12,
    kinds=["summaries"],
    compute=_below_learned(True),
    percent=True,
    decimals=0,
)
register(
    "§20.3",
    "write-rotated below learned: share of model–task comparisons",
    "write-rotated (S)",
    "0 of 3 (0%)",
    0.0,
    kinds=["summaries"],
    compute=_below_learned(None, "write-rotated"),
    percent=True,
    decimals=0,
)
for _g, _t, _col, _text, _lo, _hi in (
    ("all-common-axis", "sva", "N_index", "2.0", 2.0, 2.0),
    ("all-common-axis", "sva", "N_layer_given_index", "4.0", 4.0, 4.0),
    ("all-common-axis", "quote", "N_index", "3.8", 3.8, 3.8),
    ("all-common-axis", "quote", "N_layer_given_index", "3.3", 3.3, 3.3),
    ("all-common-axis", "sva", "N_index_null_median", "5.0", 5.0, 5.0),
    ("all-common-axis", "quote", "N_index_null_median", "5.6", 5.6, 5.6),
    ("all-common-axis", "sva", "N_index_p_lower", "≤ 0.005", 0.0, 0.005),
    ("all-common-axis", "quote", "N_index_p_lower", "≤ 0.005", 0.0, 0.005),
    ("all-common-axis", "plural", "N_index", "2.3", 2.3, 2.3),
    ("all-common-axis", "plural", "N_index_null_median", "2.7", 2.7, 2.7),
    ("mlp3456", "sva", "N_index", "3.3", 3.3, 3.3),
    ("mlp3456", "sva", "N_layer_given_index", "3.6", 3.6, 3.6),
    ("mlp3456", "quote", "N_index", "4.9", 4.9, 4.9),
    ("mlp3456", "quote", "N_layer_given_index", "4.3", 4.3, 4.3),
    ("mlp3456", "sva", "N_index_p_lower", "≤ 0.0004", 0.0, 0.0004),
    ("mlp3456", "quote", "N_index_p_lower", "≤ 0.0004", 0.0, 0.0004),
    ("value384", "quote", "N_index_p_lower", "0.09", 0.09, 0.09),
    ("read-common", "sva", "N_index", "3.6", 3.6, 3.6),
    ("read-common", "sva", "N_index_p_lower", "0.03", 0.03, 0.03),
    ("write-rotated", "quote", "N_index_p_lower", "0.02", 0.02, 0.02),
):
    register(
        "§20.3",
        f"{_col} {TASK_NAME[_t]}",
        _label(_g, "S"),
        _text,
        _lo,
        _hi,
        kinds=["robustness"],
        compute=_stat("robustness", _g, "S", _t, _col),
    )
register(
    "§20.3",
    "N_layer|index, all tasks",
    "write-rotated (S)",
    "2.6–3.3",
    2.6,
    3.3,
    kinds=["robustness"],
    compute=_robustness_span("N_layer_given_index", ["write-rotated"]),
)
for _g in ("all-rotated", "all-rotated-self"):
    register(
        "§20.3",
        "index-level p, all tasks",
        _label(_g, "S"),
        "≥ 0.17",
        0.17,
        1.0,
        kinds=["robustness"],
        compute=_robustness_span("N_index_p_lower", [_g]),
    )
register(
    "§20.3",
    "N_layer|index, all tasks",
    "all-rotated, all-rotated-self, learned (S)",
    "1.7–2.1",
    1.7,
    2.1,
    kinds=["robustness"],
    compute=_robustness_span("N_layer_given_index", ["all-rotated", "all-rotated-self", "learned"]),
)
register(
    "§20.3",
    "top-head share of E, Plural",
    "97.5M models (S)",
    "77–78%",
    0.77,
    0.78,
    kinds=["robustness"],
    percent=True,
    compute=_robustness_span(
        "top_head_share", ["all-common-axis", "all-rotated", "all-rotated-self"], ("plural",)
    ),
)
register(
    "§20.3",
    "top-head share of E, Plural",
    "read-common (S)",
    "28%",
    0.28,
    kinds=["summaries"],
    percent=True,
    compute=_stat("summaries", "read-common", "S", "plural", "top_head_share"),
)


def _margin_span(geometries, task="plural"):
    def compute(c: Context):
        runs = [r for g in geometries for r in c.runs_of(g, "S")]
        return _span([c.value("eval", r, "margin", task=task) for r in runs])

    return compute


register(
    "§20.3",
    "clean Plural margin",
    "97.5M models (S)",
    "2.30–2.54",
    2.30,
    2.54,
    kinds=["eval"],
    compute=_margin_span(["all-common-axis", "all-rotated", "all-rotated-self"]),
)
register(
    "§20.3",
    "clean Plural margin",
    "learned (S)",
    "3.10",
    3.10,
    kinds=["eval"],
    compute=_margin_span(["learned"]),
)
register(
    "§20.3",
    "clean Plural margin",
    "read-common (S)",
    "3.14",
    3.14,
    kinds=["eval"],
    compute=_margin_span(["read-common"]),
)


def _loss_spearman(base_heads: bool):
    def compute(c: Context):
        from headgeom.analysis.stats import spearman

        frame = c.frame("loss")
        if frame.empty:
            return None
        frame = frame[frame["included"]]
        if base_heads:
            frame = frame[frame["index_meaningful"]]
        rho, _ = spearman(frame["val_loss"].to_numpy(), frame["N_eff_geomean"].to_numpy())
        return float(rho) if np.isfinite(rho) else None

    return compute


register(
    "§20.3",
    "Spearman(loss, geometric-mean N_eff)",
    "Figure 4 models (S)",
    "−0.77",
    -0.77,
    kinds=["loss"],
    compute=_loss_spearman(False),
)
register(
    "§20.3",
    "Spearman(loss, geometric-mean N_eff), base heads/layer",
    "Figure 4 12-head models (S)",
    "−0.94",
    -0.94,
    kinds=["loss"],
    compute=_loss_spearman(True),
)


# ----------------------------------------------------------------------------- §20.4
def _lane(geometry, corpus, task, column="lambda_score"):
    return lambda c: c.value("lanes", c.run(geometry, corpus), column, split=None, task=task)


def _lane_span(geometry, corpus, column="lambda_score"):
    return lambda c: _span([_lane(geometry, corpus, t, column)(c) for t in TASKS])


for _g, _c, _t, _col, _text, _lo, _hi in (
    ("mlp3456", "S", "sva", "lambda_score", "0.457", 0.457, 0.457),
    ("mlp3456", "S", "quote", "lambda_score", "0.360", 0.360, 0.360),
    ("value384", "S", "sva", "lambda_score", "0.691", 0.691, 0.691),
    ("all-common-axis", "S", "sva", "lambda_score", "0.720", 0.720, 0.720),
    ("all-common-axis", "S", "sva", "p_value", "0.0002", 0.0002, 0.0002),
    ("all-common-axis", "S", "quote", "lambda_score", "0.299", 0.299, 0.299),
    ("all-common-axis", "S", "quote", "p_value", "0.001", 0.001, 0.001),
    ("all-common-axis", "S", "plural", "lambda_score", "0.035", 0.035, 0.035),
    ("write-common", "R", "sva", "lambda_score", "0.342", 0.342, 0.342),
    ("write-common", "R", "quote", "lambda_score", "0.162", 0.162, 0.162),
    ("write-common", "R", "plural", "lambda_score", "0.246", 0.246, 0.246),
    ("write-common-axis", "R", "sva", "lambda_score", "0.185", 0.185, 0.185),
    ("write-common-axis", "R", "quote", "lambda_score", "0.165", 0.165, 0.165),
    ("write-common-axis", "R", "plural", "lambda_score", "0.070", 0.070, 0.070),
):
    _name = "Λ" if _col == "lambda_score" else "Λ permutation p"
    register(
        "§20.4",
        f"{_name} {TASK_NAME[_t]}",
        _label(_g, _c),
        _text,
        _lo,
        _hi,
        kinds=["lanes"],
        compute=_lane(_g, _c, _t, _col),
        split="discovery",
    )
for _g, _c, _text, _lo, _hi in (
    ("read-common", "S", "≤ 0.23", -INF, 0.23),
    ("learned", None, "≤ 0.10", -INF, 0.10),
    ("write-rotated", "S", "0.05–0.14", 0.05, 0.14),
    ("all-rotated", "S", "0.02–0.06", 0.02, 0.06),
    ("all-rotated-self", "S", "0.04–0.10", 0.04, 0.10),
):
    register(
        "§20.4",
        "Λ, all tasks",
        _label(_g, _c),
        _text,
        _lo,
        _hi,
        kinds=["lanes"],
        compute=_lane_span(_g, _c),
        split="discovery",
        decimals=2,
    )


def _index_repeats(geometry, corpus=None, task="sva"):
    def compute(c: Context):
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

    return compute


register(
    "§20.4",
    "SVA top-3 heads repeat a head index (share of runs)",
    "write-common-axis",
    "all variants (100%)",
    1.0,
    kinds=["heads"],
    percent=True,
    decimals=0,
    compute=_index_repeats("write-common-axis"),
    split="discovery",
)
register(
    "§20.4",
    "SVA top-3 heads repeat a head index (share of runs)",
    "learned",
    "none (0%)",
    0.0,
    kinds=["heads"],
    percent=True,
    decimals=0,
    compute=_index_repeats("learned"),
    split="discovery",
)
for _g, _vals in (("all-rotated-self", (0.61, 0.64, 0.77)), ("all-rotated", (0.42, 0.39, 0.78))):
    for _t, _v in zip(TASKS, _vals, strict=True):
        register(
            "§20.4",
            f"top-head share of E, {TASK_NAME[_t]}",
            _label(_g, "S"),
            f"{100 * _v:.0f}%",
            _v,
            kinds=["summaries"],
            percent=True,
            compute=_stat("summaries", _g, "S", _t, "top_head_share"),
        )


def _share_span(geometry, tasks):
    def compute(c: Context):
        return _span(
            [
                c.value("summaries", r, "top_head_share", task=t)
                for r in c.runs_of(geometry)
                for t in tasks
            ]
        )

    return compute


register(
    "§20.4",
    "top-head share of E, SVA and Quote",
    "learned (all)",
    "27–37%",
    0.27,
    0.37,
    kinds=["summaries"],
    percent=True,
    compute=_share_span("learned", ("sva", "quote")),
)
register(
    "§20.4",
    "top-head share of E, Plural",
    "learned (all)",
    "42–62%",
    0.42,
    0.62,
    kinds=["summaries"],
    percent=True,
    compute=_share_span("learned", ("plural",)),
)


def _clamp_span(same: bool | None, learned: bool | None, column: str):
    def compute(c: Context):
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

    return compute


register(
    "§20.4",
    "same-index clamp reduction",
    "pair-clamp models",
    "−0.4% to 24%",
    -0.004,
    0.24,
    kinds=["clamp_pairs"],
    percent=True,
    decimals=0,
    compute=_clamp_span(True, None, "reduction_head"),
)
register(
    "§20.4",
    "different-index clamp reduction",
    "pair-clamp models",
    "−11% to 56%",
    -0.11,
    0.56,
    kinds=["clamp_pairs"],
    percent=True,
    decimals=0,
    compute=_clamp_span(False, None, "reduction_head"),
)
register(
    "§20.4",
    "later-MLP clamp reduction",
    "frozen-write pair-clamp models",
    "70–109%",
    0.70,
    1.09,
    kinds=["clamp_pairs"],
    percent=True,
    decimals=0,
    compute=_clamp_span(None, False, "reduction_mlps"),
)
register(
    "§20.4",
    "later-MLP clamp reduction",
    "learned",
    "13–97%",
    0.13,
    0.97,
    kinds=["clamp_pairs"],
    percent=True,
    decimals=0,
    compute=_clamp_span(None, True, "reduction_mlps"),
)


def _lumped(task, same: bool):
    def compute(c: Context):
        frame = c.frame("clamp_lumped")
        run = c.run("all-common-axis", "S")
        if frame.empty or run is None:
            return None
        rows = frame[
            (frame["model"] == run[0])
            & (frame["seed"] == run[1])
            & (frame["task"] == task)
            & (frame["same_index"] == same)
        ]
        return float(rows["reduction"].mean()) if len(rows) else None

    return compute


for _t, _same, _text, _v in (
    ("sva", True, "21%", 0.21),
    ("sva", False, "0.6%", 0.006),
    ("quote", True, "−5.6%", -0.056),
    ("plural", True, "−2.3%", -0.023),
):
    register(
        "§20.4",
        f"lumped lane clamp, {TASK_NAME[_t]}, {'same index' if _same else 'other indices (mean)'}",
        "all-common-axis (S)",
        _text,
        _v,
        kinds=["clamp_lumped"],
        percent=True,
        compute=_lumped(_t, _same),
    )


# ----------------------------------------------------------------------------- §20.5
_FIGURE7 = ["learned", "write-common-axis", "write-common", "write-rotated"]


def _geometry_span(column, geometries, transform=lambda v: v):
    def compute(c: Context):
        frame = c.frame("geometry")
        runs = {r for g in geometries for r in c.runs_of(g)}
        if frame.empty or not runs:
            return None
        keep = [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]
        return _span([transform(v) for v in frame.loc[keep, column]])

    return compute


register(
    "§20.5",
    "own-best fraction, layers 1–11",
    "8 free-reader models",
    "53–87%",
    0.53,
    0.87,
    kinds=["geometry"],
    percent=True,
    split="weights",
    compute=_geometry_span("own_best_fraction", _FIGURE7),
)
register(
    "§20.5",
    "own-best fraction, layer 0",
    "8 free-reader models",
    "12/12 (100%)",
    1.0,
    kinds=["geometry"],
    percent=True,
    split="weights",
    decimals=0,
    compute=_geometry_span("own_best_fraction_layer0", _FIGURE7),
)
register(
    "§20.5",
    "ρ_self",
    "learned",
    "0.18–0.19",
    0.18,
    0.19,
    kinds=["geometry"],
    split="weights",
    compute=_geometry_span("rho_self_mean", ("learned",)),
)
register(
    "§20.5",
    "ρ_self",
    "frozen-write free readers",
    "0.11–0.12",
    0.11,
    0.12,
    kinds=["geometry"],
    split="weights",
    compute=_geometry_span("rho_self_mean", _FIGURE7[1:]),
)
register(
    "§20.5",
    "scaled idempotence (median)",
    "learned",
    "0.49–0.52",
    0.49,
    0.52,
    kinds=["geometry"],
    split="weights",
    compute=_geometry_span("idempotence_median", ("learned",)),
)
register(
    "§20.5",
    "scaled idempotence (median)",
    "frozen-write free readers",
    "0.12–0.22",
    0.12,
    0.22,
    kinds=["geometry"],
    split="weights",
    compute=_geometry_span("idempotence_median", _FIGURE7[1:]),
)


# ----------------------------------------------------------------------------- §20.6
def _path_sum(geometry, column, corpus="S"):
    def compute(c: Context):
        frame = c.frame("clamp_paths")
        run = c.run(geometry, corpus)
        if frame.empty or run is None:
            return None
        rows = frame[
            (frame["model"] == run[0]) & (frame["seed"] == run[1]) & (frame["task"] == "sva")
        ]
        return float(rows[column].sum()) if len(rows) else None

    return compute


for _g, _col, _text, _lo, _hi in (
    ("learned", "direct", "3.55", 3.55, 3.55),
    ("all-common-axis", "direct", "0.88", 0.88, 0.88),
    ("all-rotated-self", "direct", "0.44", 0.44, 0.44),
    ("learned", "via_mlps_a", "2.08", 2.08, 2.08),
    ("read-common", "direct", "2.57", 2.57, 2.57),
    ("read-common", "delta_none", "7.74", 7.74, 7.74),
    ("all-common-axis", "delta_none", "7.72", 7.72, 7.72),
):
    register(
        "§20.6",
        f"SVA top-5 heads, Σ {_col} (MLP-first)",
        _label(_g, "S"),
        _text,
        _lo,
        _hi,
        kinds=["clamp_paths"],
        compute=_path_sum(_g, _col),
    )
register(
    "§20.6",
    "SVA top-5 heads, Σ via MLPs (MLP-first)",
    "frozen-write models (S)",
    "4.7–5.3",
    4.7,
    5.3,
    kinds=["clamp_paths"],
    compute=lambda c: _span(
        [
            _path_sum(g, "via_mlps_a")(c)
            for g in ("write-rotated", "all-common-axis", "all-rotated", "all-rotated-self")
        ]
    ),
)


def _shares(geometry, corpus, key):
    def compute(c: Context):
        from headgeom.paper.tables import path_shares

        frame = c.frame("clamp_paths")
        runs = set(c.runs_of(geometry, corpus))
        if frame.empty or not runs:
            return None
        keep = [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]
        return float(path_shares(frame[keep])[key]) if any(keep) else None

    return compute


for _g, _c, _key, _v in (
    ("learned", "R", "mlp_share_a", 0.42),
    ("learned", "R", "mlp_share_b", 0.49),
    ("write-common-axis", "R", "mlp_share_a", 0.69),
    ("write-common-axis", "R", "mlp_share_b", 0.81),
    ("learned", "S", "mlp_share_a", 0.36),
    ("learned", "S", "mlp_share_b", 0.41),
    ("learned", "R", "direct_share", 0.48),
    ("write-common-axis", "R", "direct_share", 0.17),
    ("learned", "S", "direct_share", 0.57),
):
    register(
        "§20.6",
        _key.replace("_a", " (order A)").replace("_b", " (order B)").replace("_", " "),
        _label(_g, _c),
        f"{_v:.2f}",
        _v,
        kinds=["clamp_paths"],
        compute=_shares(_g, _c, _key),
    )


def _interaction(key):
    def compute(c: Context):
        from headgeom.paper.tables import path_shares

        frame = c.frame("clamp_paths")
        # the paper's 75 head–task cases: the both-orders models (learned, write-common-axis)
        runs = {r for g in ["learned", "write-common-axis"] for r in c.runs_of(g)}
        if frame.empty or not runs:
            return None
        keep = [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]
        return float(path_shares(frame[keep])[key]) if any(keep) else None

    return compute


for _key, _metric, _text, _v, _pct in (
    ("interaction_median_rel", "interaction, median |I|/|Δ(∅)|", "5%", 0.05, True),
    ("interaction_signed_share", "interaction, Σ I / Σ Δ(∅) signed", "9%", 0.09, True),
    ("interaction_abs_share", "interaction, Σ |I| / Σ Δ(∅)", "11%", 0.11, True),
    ("interaction_max_rel", "interaction, max |I|/|Δ(∅)|", "90%", 0.90, True),
):
    register(
        "§20.6",
        _metric,
        "path-decomposition cases",
        _text,
        _v,
        kinds=["clamp_paths"],
        compute=_interaction(_key),
        percent=_pct,
    )


# ------------------------------------------------------------------------ §20.6 edges (issue 13)
def _edge_summary(column: str, geometry: str, corpus: str | None = None):
    """``column`` of the edge summaries of every run of ``geometry`` (a range over runs)."""

    def compute(c: Context):
        frame = c.frame("edge_summary")
        if frame.empty:
            return None
        runs = set(c.runs_of(geometry, corpus))
        keys = zip(frame["model"], frame["seed"], strict=True)
        rows = frame[[(m, int(s)) in runs for m, s in keys]]
        return _span(rows[column].tolist()) if len(rows) else None

    return compute


def _edges_per_model(c: Context):
    """The edges one model's summary counts (3·H²·L(L−1)/2; the paper's 28,512 at 12×12)."""
    frame = c.frame("edge_summary")
    return float(frame["n_edges"].max()) if not frame.empty else None


register("§20.6", "edges per model (paper: 12×12 shape)", "edge runs", "28,512", 28512,
         kinds=["edge_summary"], compute=_edges_per_model, decimals=0)  # fmt: skip
for _geometry, _corpus, _paper, _lo, _hi in (
    ("learned", None, "0.30–0.32", 0.30, 0.32),
    ("read-common", None, "0.04", 0.04, 0.04),
    ("all-common-axis", None, "0.76", 0.76, 0.76),
):
    register("§20.6", "Spearman(PK, KL), pooled over edges", _geometry, _paper, _lo, _hi,
             kinds=["edge_summary"], compute=_edge_summary("pooled_spearman", _geometry, _corpus),
             split="validation")  # fmt: skip


def _acdc_into_attention(source_kind: str | None):
    """ACDC edges into attention-head inputs (q, k, v), all or from ``source_kind``."""

    def compute(c: Context):
        frame = c.frame("acdc")
        if frame.empty:
            return None
        into = frame[frame["target_kind"].isin(["q", "k", "v"])]
        if source_kind is not None:
            into = into[into["source_kind"] == source_kind]
        return float(len(into))

    return compute


for _source, _paper in ((None, "22"), ("head", "0"), ("mlp", "20"), ("embed", "2")):
    register("§20.6", f"ACDC edges into attention{f' from {_source}s' if _source else ''} "
             "(threshold 0.001)", "all-rotated", _paper, float(_paper), kinds=["acdc"],
             compute=_acdc_into_attention(_source), split="validation")  # fmt: skip


# Coordinate concentration (§15.2, issue 13): top-10 shares of the SVA best layer, evaluation
# split (directions selected on validation), a range over the runs of a model group.
def _coordinate_share(groups: Sequence[str], site: str, task: str = "sva"):
    def compute(c: Context):
        from headgeom.paper.selections import COORDINATE_GROUPS

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

    return compute


_COORDINATE_METRICS = {
    "after_wo": "top-10 coordinate share after W_O, SVA",
    "before_wo": "top-10 direction share before W_O, SVA",
    "before_wo_rotated": "top-10 direction share before W_O, Haar-rotated, SVA",
}
# the paper's values are the ones Table "coordinates" prints (tables.COORDINATES_PAPER)
for (_group, _site), _text in COORDINATES_PAPER.items():
    _bounds = [float(b) / 100 for b in _text.rstrip("%").split("–")]
    register("§20.6", _COORDINATE_METRICS[_site], _group, _text, _bounds[0],
             _bounds[1] if len(_bounds) > 1 else None, kinds=["coordinates"],
             compute=_coordinate_share([_group], _site), percent=True)  # fmt: skip


# ----------------------------------------------------------------------------- dynamics (issue 12)
# The paper's steps as fractions of its 65,536 training steps, matched to the run's nearest
# checkpoint on a log scale: 4,096 = 1/16 of training, 256 = 1/256.
PAPER_STEPS = 65536


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


def _timeline(column: str, fraction: float | None):
    def compute(c: Context):
        return _span(_timeline_at(c, fraction)[column].tolist())

    return compute


for _metric, _paper, _lo, _hi, _column, _fraction, _decimals in (
    ("SVA accuracy at 1/16 of training (paper step 4,096)", "~97%", 0.97, 0.97, "sva_accuracy",
     1 / 16, 0),
    ("Λ SVA at 1/16 of training (paper step 4,096)", "0.127", 0.127, 0.127, "lambda_score",
     1 / 16, 3),
    ("own-best fraction at 1/64 of training (paper step 1,024)", "0.11", 0.11, 0.11,
     "own_best_fraction", 1 / 64, 2),
    ("own-best fraction at 1/16 of training (paper step 4,096)", "0.56", 0.56, 0.56,
     "own_best_fraction", 1 / 16, 2),
    ("own-best fraction, final", "0.64", 0.64, 0.64, "own_best_fraction", None, 2),
    ("Λ SVA, final", "0.342", 0.342, 0.342, "lambda_score", None, 3),
):  # fmt: skip
    register(
        "§20.4" if "Λ" in _metric or "accuracy" in _metric else "§20.5",
        _metric,
        "write-common (timeline runs)",
        _paper,
        _lo,
        _hi,
        kinds=["timeline"],
        compute=_timeline(_column, _fraction),
        decimals=_decimals,
        percent=_column == "sva_accuracy",
    )


def _tau(column: str):
    """The range over the paper's τ steps (selections.in_tau_range: its 1,024–65,536, not
    the timelines' 256) of every timeline run."""

    def compute(c: Context):
        frame = c.frame("tau")
        if frame.empty:
            return None
        final = frame.groupby(["model", "seed"])["step"].transform("max")
        frame = frame[[in_tau_range(s, f) for s, f in zip(frame["step"], final, strict=True)]]
        if frame.empty:
            return None
        return _span([float(frame[column].min()), float(frame[column].max())])

    return compute


register("§20.4", "task-gradient adjacent-layer cosine, all steps", "timeline runs", "0.79–0.89",
         0.79, 0.89, kinds=["tau"], compute=_tau("adjacent_cosine_mean"))  # fmt: skip
register("§20.4", "task-gradient same-index projected cosine, all steps",
         "write-common (timeline runs)", "0.45–0.63", 0.45, 0.63, kinds=["tau"],
         compute=_tau("same_index_cosine"))  # fmt: skip


def _own_largest(first_step: bool):
    """Share of heads whose own V-gradient trace is the largest, at step 0 or at the first
    traced step after it (the paper's step 256 = 1/256 of training)."""

    def compute(c: Context):
        frame = c.frame("value_gradients")
        if frame.empty:
            return None
        traced = sorted(frame.loc[~frame["is_final"], "step"].unique())
        later = [s for s in traced if s > 0]
        step = 0 if first_step else (later[0] if later else None)
        rows = frame[frame["step"] == step]
        return float(rows["own_largest"].mean()) if len(rows) else None

    return compute


register("§20.5", "V-gradient own trace largest, step 0", "timeline runs", "6–7%", 0.06, 0.07,
         kinds=["value_gradients"], compute=_own_largest(True), percent=True)  # fmt: skip
register("§20.5", "V-gradient own trace largest, first traced step (paper 256)", "timeline runs",
         "77–78%", 0.77, 0.78, kinds=["value_gradients"], compute=_own_largest(False),
         percent=True)  # fmt: skip


def _scalar_hurts_more(c: Context):
    """Share of (run, task) cases where removing the scalar part drops the margin more than
    the mean of its equal-norm random controls (paper: 13 of 15)."""
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


register("§20.5", "scalar-part ablation hurts more than its random control (share of cases)",
         "ablation runs", "13/15 = 0.87", 13 / 15, 13 / 15, kinds=["scalar_ablation"],
         compute=_scalar_hurts_more, decimals=2)  # fmt: skip


# ----------------------------------------------------------------------------- the table
@dataclass
class Row:
    ref: Reference
    value: Value
    status: str = field(default="")


def evaluate(inputs: Inputs, references: Sequence[Reference] | None = None) -> pd.DataFrame:
    """One row per reference: the run's value (number or range), whether it lies within the
    paper's range, or why it is not in this study."""
    ctx = Context(inputs)
    rows = []
    for ref in REFERENCES if references is None else references:
        missing = [k for k in ref.kinds if not ctx.has(k)]
        value: Any = None
        if missing:
            status = f"not in this study (no {', '.join(missing)} input)"
        else:
            value = ref.compute(ctx)
            status = "not in this study (no such run)" if value is None else ""
        within = ref.within(value)
        lo, hi = (
            (value if isinstance(value, tuple) else (value, value))
            if value is not None
            else (None, None)
        )
        rows.append(
            {
                "section": ref.section,
                "metric": ref.metric,
                "model": ref.model,
                "split": ref.split,
                "paper": ref.paper,
                "paper_low": ref.low,
                "paper_high": ref.high,
                "run_value": ref.show(value) if value is not None else status,
                "run_low": lo,
                "run_high": hi,
                "within": None if within is None else bool(within),
            }
        )
    return pd.DataFrame(rows)


def comparison_table(inputs: Inputs) -> Table:
    frame = evaluate(inputs)
    cells = pd.DataFrame(
        {
            "Section": frame["section"],
            "Metric": frame["metric"],
            "Model": frame["model"],
            "Split": frame["split"],
            "Paper": frame["paper"],
            "This run": frame["run_value"],
            "Within?": frame["within"].map({True: "yes", False: "no"}).fillna("—"),
        }
    )
    known = frame["within"].notna()
    caption = (
        f"Paper vs this run: every reference number of METHODS §20 ({len(frame)}), with this "
        f"run's value computed from the result Parquets; {int(known.sum())} computed here, "
        f"{int(frame.loc[known, 'within'].sum())} of them within the paper's range (after "
        "rounding to the paper's precision). A range in 'This run' spans the models or tasks "
        "the paper's number covers. Toy-size studies (the demo) are not expected to match."
    )
    return Table("comparison", frame, [Block(cells)], caption)
