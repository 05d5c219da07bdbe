"""Paper tables as pure functions of result Parquets (METHODS §17.1).

Each builder takes the Parquet paths its table needs and returns a tidy DataFrame (the
CSV) plus the rendered Markdown. Derived values are computed from unrounded numbers;
rounding happens only when rendering (METHODS §17).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from scipy.stats import spearmanr

from headgeom.io import read_parquet_metadata

TASK_ORDER = ["sva", "quote", "plural"]
TASK_TITLES = {"sva": "SVA", "quote": "Quote", "plural": "Plural"}


def _concat(paths: Sequence[str]) -> pd.DataFrame:
    if not paths:
        raise ValueError("no input Parquets given")
    return pd.concat([pq.read_table(p).to_pandas() for p in paths], ignore_index=True)


def _model_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep the config order of models (first appearance), then seed."""
    order = {m: i for i, m in enumerate(dict.fromkeys(frame["model"]))}
    return frame.assign(_o=frame["model"].map(order)).sort_values(["_o", "seed"]).drop(columns="_o")


def _meta_json(meta: dict[str, str], key: str, path: str):
    if key not in meta:
        raise KeyError(f"{path}: Parquet metadata lacks {key!r}")
    return json.loads(meta[key])


# ----------------------------------------------------------------------------- Table 2
#: Geometry columns Table 2 takes from the geometry_stats summaries (METHODS §9.4, §14.1).
TABLE2_GEOMETRY_COLUMNS = [
    "own_best_fraction",
    "rho_self_mean",
    "write_write_pk_same_index_mean",
    "write_write_pk_other_index_mean",
    "prop1_applies",
    "prop1_max_residual",
]


def table2(paths: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Parameters, validation loss and Δ vs learned (paper Table 2), with the designed
    weight-space geometry of each model.

    ``paths`` holds training logs (``train_log.parquet``) and, optionally, geometry
    summaries (metadata ``analysis`` = ``geometry_stats``); the two are told apart by that
    metadata and joined on (model, seed). Δ = val loss − that of the ``learned`` model on
    the same corpus (comparisons are only ever within a corpus, METHODS §0) with the same
    seed when one exists, else the mean over that corpus's learned seeds; computed from
    unrounded losses. Runs without a ``corpus`` key (the demo) share one corpus.
    """
    rows, geometry = [], []
    for path in paths:
        meta = read_parquet_metadata(path)
        if meta.get("analysis") == "geometry_stats":
            geometry.append(pq.read_table(path).to_pandas())
            continue
        cfg = _meta_json(meta, "config", path)
        rows.append(
            {
                "model": cfg["model_name"],
                "geometry": cfg["model"]["geometry"],
                "seed": int(cfg["seed"]),
                "corpus": cfg.get("corpus", "—"),
                "n_params": int(_meta_json(meta, "n_params", path)),
                "val_loss": float(_meta_json(meta, "val_loss_nats", path)),
            }
        )
    if not rows:
        raise ValueError("table2 needs at least one training log")
    frame = _model_order(pd.DataFrame(rows))
    frame["delta_vs_learned"] = frame["val_loss"] - _learned_reference(frame)
    if geometry:
        geo = pd.concat(geometry, ignore_index=True)[["model", "seed", *TABLE2_GEOMETRY_COLUMNS]]
        if geo.duplicated(["model", "seed"]).any():
            raise ValueError("table2: more than one geometry summary for a (model, seed)")
        frame = frame.merge(geo, on=["model", "seed"], how="left", validate="one_to_one")
    else:
        frame = frame.assign(**{c: np.nan for c in TABLE2_GEOMETRY_COLUMNS})

    # NaN where Proposition 1 does not apply (no orthogonal write decomposition) or where
    # no geometry summary was given
    fmt_prop1 = _fmt("{:.1e}", missing="n/a")

    md = _render(
        frame,
        {
            "model": ("Model", str),
            "geometry": ("Write / readers", str),
            "corpus": ("Corpus", str),
            "seed": ("Seed", str),
            "n_params": ("Params", lambda v: f"{v:,}"),
            "val_loss": ("Val loss (nats)", lambda v: f"{v:.3f}"),
            "delta_vs_learned": ("Δ vs learned", _fmt("{:+.3f}")),
            "write_write_pk_same_index_mean": ("WW PK same index", _fmt("{:.2f}")),
            "write_write_pk_other_index_mean": ("WW PK other index", _fmt("{:.2f}")),
            "own_best_fraction": ("Own-best (L ≥ 1)", _fmt("{:.2f}")),
            "rho_self_mean": ("ρ_self", _fmt("{:.3f}")),
            "prop1_max_residual": ("Prop. 1 residual (C14)", fmt_prop1),
        },
    )
    return frame.reset_index(drop=True), md


def _evaluation_by_task(
    paths: Sequence[str], columns: list[str], values: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evaluation-split rows (tidy) and the same pivoted to (model, seed) × (value, task)."""
    frame = _concat(paths)
    frame = frame[frame["split"] == "evaluation"]
    tidy = _model_order(frame[["model", "seed", "task", *columns]])
    wide = tidy.pivot_table(index=["model", "seed"], columns="task", values=values, sort=False)
    return tidy, wide


def _learned_reference(frame: pd.DataFrame) -> pd.Series:
    """Validation loss of the learned model each row is compared with (NaN if none)."""
    learned = frame[frame["geometry"] == "learned"]
    same_seed = learned.set_index(["corpus", "seed"])["val_loss"]
    corpus_mean = learned.groupby("corpus")["val_loss"].mean()
    keys = pd.MultiIndex.from_frame(frame[["corpus", "seed"]])
    ref = pd.Series(same_seed.reindex(keys).to_numpy(), index=frame.index)
    return ref.fillna(frame["corpus"].map(corpus_mean))


# ----------------------------------------------------------------------------- Table 5
def table5(paths: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Clean accuracy (%) / mean logit margin on the evaluation split (paper Table 5)."""
    tidy, wide = _evaluation_by_task(paths, ["n", "accuracy", "margin"], ["accuracy", "margin"])
    out = wide.index.to_frame(index=False)
    for task in TASK_ORDER:
        if ("accuracy", task) in wide:
            acc, margin = wide[("accuracy", task)], wide[("margin", task)]
            out[TASK_TITLES[task]] = [
                f"{100 * a:.1f} / {m:.2f}" for a, m in zip(acc, margin, strict=True)
            ]
    md = _render(out, {c: (c.capitalize() if c in ("model", "seed") else c, str) for c in out})
    return tidy.reset_index(drop=True), md


# ----------------------------------------------------------------------------- Table 6
def table6(paths: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """N_eff and E per task on the evaluation split (paper Table 6)."""
    tidy, wide = _evaluation_by_task(paths, ["N_eff", "E", "top_head_share"], ["N_eff", "E"])
    out = wide.index.to_frame(index=False)
    for stat, fmt in (("N_eff", "{:.1f}"), ("E", "{:.2f}")):
        for task in TASK_ORDER:
            if (stat, task) in wide:
                out[f"{stat} {TASK_TITLES[task]}"] = [fmt.format(v) for v in wide[(stat, task)]]
    md = _render(out, {c: (c.capitalize() if c in ("model", "seed") else c, str) for c in out})
    return tidy.reset_index(drop=True), md


# ----------------------------------------------------------------------------- Lanes
def lanes(paths: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Lane score Λ with its permutation p, Bonferroni ×3 within each model (METHODS §10.5)."""
    frame = _model_order(_concat(paths))
    n_tasks = frame.groupby(["model", "seed"])["task"].transform("nunique")
    frame["p_bonferroni"] = np.minimum(1.0, frame["p_value"] * n_tasks)
    frame = frame[
        [
            "model",
            "seed",
            "task",
            "split",
            "lambda_score",
            "chance",
            "p_value",
            "p_bonferroni",
            "n_permutations",
        ]
    ]

    fmt_lambda = _fmt("{:.3f}", missing="undefined")
    fmt_p = _fmt("{:.4f}")

    md = _render(
        frame,
        {
            "model": ("Model", str),
            "seed": ("Seed", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "lambda_score": ("Λ", fmt_lambda),
            "chance": ("Chance", lambda v: f"{v:.3f}"),
            "p_value": ("p", fmt_p),
            "p_bonferroni": ("p (Bonferroni ×3)", fmt_p),
        },
    )
    return frame.reset_index(drop=True), md


# ----------------------------------------------------------------------------- Leakage
def leakage(paths: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Leakage summaries per model, seed and read type, pooled over tasks (METHODS §11.3):
    median L (fraction of perturbation energy), median L/ρ and Spearman(L, ρ) across
    source–reader pairs."""
    frame = _concat(paths).dropna(subset=["leakage", "rho"])
    rows = []
    for (model, seed, read_type), group in frame.groupby(
        ["model", "seed", "read_type"], sort=False
    ):
        rows.append(
            {
                "model": model,
                "seed": seed,
                "read_type": read_type,
                "n_pairs": len(group),
                "median_leakage": group["leakage"].median(),
                "median_leakage_over_rho": group["leakage_over_rho"].median(),
                "spearman_leakage_rho": spearmanr(group["leakage"], group["rho"]).statistic,
            }
        )
    out = _model_order(pd.DataFrame(rows))
    md = _render(
        out,
        {
            "model": ("Model", str),
            "seed": ("Seed", str),
            "read_type": ("X", str),
            "n_pairs": ("Pairs (all tasks)", str),
            "median_leakage": ("Median L", lambda v: f"{100 * v:.1f}%"),
            "median_leakage_over_rho": ("Median L/ρ", lambda v: f"{v:.2f}"),
            "spearman_leakage_rho": ("Spearman(L, ρ)", lambda v: f"{v:.2f}"),
        },
    )
    return out.reset_index(drop=True), md


def _fmt(spec: str, missing: str = "—") -> Callable:
    """Formatter for a possibly missing (None/NaN) value."""
    return lambda v: missing if v is None or pd.isna(v) else spec.format(v)


def _render(frame: pd.DataFrame, columns: dict[str, tuple[str, Callable]]) -> str:
    shown = pd.DataFrame({title: frame[col].map(fmt) for col, (title, fmt) in columns.items()})
    return shown.to_markdown(index=False, disable_numparse=True) + "\n"


BUILDERS: dict[str, Callable[[Sequence[str]], tuple[pd.DataFrame, str]]] = {
    "table2": table2,
    "table5": table5,
    "table6": table6,
    "lanes": lanes,
    "leakage": leakage,
}
