"""Paper figures as pure functions of result Parquets (METHODS §17.2).

Each figure has a data builder (Parquet paths → the tidy frame that is plotted, which is
also written as the figure's CSV source data) and a drawing function (frame → matplotlib
``Figure``). Figures are built on ``matplotlib.figure.Figure`` directly (Agg canvas, no
pyplot state), and saved deterministically: no date in the SVG, fixed SVG id salt.

* Figure 1: inter-layer write–write PK heat maps, heads ordered (layer, head), one panel per
  model, same-layer blocks masked (§17.2, data from ``geometry_stats`` pk Parquets).
* Figure 7: own-best fraction of V self-alignment per model with the chance line 1/H, and
  ρ_self with its chance d/D (§14.1, data from ``geometry_stats`` summaries).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from headgeom.io import atomic_path  # noqa: E402

MASK_COLOUR = "#d9d9d9"
LAYER_LABELS = {"own_best_fraction": "layers ≥ 1", "own_best_fraction_layer0": "layer 0"}


def _concat(paths: Sequence[str]) -> pd.DataFrame:
    if not paths:
        raise ValueError("no input Parquets given")
    return pd.concat([pq.read_table(p).to_pandas() for p in paths], ignore_index=True)


def _model_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["model"]))


# --------------------------------------------------------------------------- Figure 1
FIGURE1_COLUMNS = [
    "model",
    "seed",
    "kind",
    "source_layer",
    "source_head",
    "target_layer",
    "target_head",
    "read_type",
    "pk",
    "source_dim",
    "target_dim",
    "same_index",
]


def figure1_data(paths: Sequence[str]) -> pd.DataFrame:
    """The write–write rows of the pk Parquets (plus write–read rows, used for the panel
    annotations), one (model, seed) per input."""
    frame = _concat(paths)[FIGURE1_COLUMNS]
    if frame.groupby("model")["seed"].nunique().max() > 1:
        raise ValueError("figure1 draws one checkpoint per model; got several seeds of a model")
    return frame.reset_index(drop=True)


def pk_heatmap_matrix(rows: pd.DataFrame, n_layer: int, n_head: int) -> np.ndarray:
    """(L·H, L·H) matrix of write–write PK indexed by l·H + h, mirrored (PK is symmetric),
    NaN on same-layer blocks."""
    n = n_layer * n_head
    matrix = np.full((n, n), np.nan)
    i = rows["source_layer"].to_numpy() * n_head + rows["source_head"].to_numpy()
    j = rows["target_layer"].to_numpy() * n_head + rows["target_head"].to_numpy()
    pk = rows["pk"].to_numpy(dtype=np.float64)
    matrix[i, j] = pk
    matrix[j, i] = pk
    return matrix


def _shape(rows: pd.DataFrame) -> tuple[int, int]:
    n_layer = int(max(rows["source_layer"].max(), rows["target_layer"].max())) + 1
    n_head = int(max(rows["source_head"].max(), rows["target_head"].max())) + 1
    return n_layer, n_head


def _annotation(rows: pd.DataFrame) -> str:
    ww = rows[rows["kind"] == "write_write"]
    lines = [
        "write–write PK: same index {:.2f}, other {:.2f}".format(
            ww.loc[ww["same_index"], "pk"].mean(), ww.loc[~ww["same_index"], "pk"].mean()
        )
    ]
    wr = rows[rows["kind"] == "write_read"]
    if len(wr):
        lines.append(
            "write→read PK (Q,K,V): same {:.2f}, other {:.2f}".format(
                wr.loc[wr["same_index"], "pk"].mean(), wr.loc[~wr["same_index"], "pk"].mean()
            )
        )
    return "\n".join(lines)


def figure1(data: pd.DataFrame, ncols: int = 3) -> Figure:
    """Heat maps of PK(U^{l,h}, U^{l',k}), l ≠ l', one panel per model on one colour scale
    from 0 to the largest write dimension (the most a pair can share)."""
    ww = data[data["kind"] == "write_write"]
    models = _model_order(data)
    if ww.empty:
        raise ValueError("figure1: no write–write rows (models need at least two layers)")
    vmax = float(max(ww["source_dim"].max(), ww["target_dim"].max()))
    ncols = min(ncols, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig = Figure(figsize=(4.3 * ncols + 1.0, 5.3 * nrows + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    mesh = None
    for ax, model in zip(axes, models, strict=False):
        rows = ww[ww["model"] == model]
        n_layer, n_head = _shape(rows)
        matrix = pk_heatmap_matrix(rows, n_layer, n_head)
        ax.set_facecolor(MASK_COLOUR)
        sns.heatmap(
            matrix,
            mask=np.isnan(matrix),
            vmin=0.0,
            vmax=vmax,
            cmap="viridis",
            square=False,
            cbar=False,
            xticklabels=False,
            yticklabels=False,
            rasterized=True,
            ax=ax,
        )
        mesh = ax.collections[0]
        for boundary in range(1, n_layer):
            ax.axhline(boundary * n_head, color="white", linewidth=0.6)
            ax.axvline(boundary * n_head, color="white", linewidth=0.6)
        centres = (np.arange(n_layer) + 0.5) * n_head
        step = max(1, math.ceil(n_layer / 12))  # at most ~12 layer labels per axis
        ax.set_xticks(centres[::step], [f"L{i}" for i in range(0, n_layer, step)], fontsize=8)
        ax.set_yticks(centres[::step], [f"L{i}" for i in range(0, n_layer, step)], fontsize=8)
        ax.tick_params(length=0)
        ax.set_ylabel("head (layer, head)", fontsize=8)
        ax.set_xlabel(
            f"head (layer, head), {n_head} heads per layer\n\n"
            + _annotation(data[data["model"] == model]),
            fontsize=8,
            loc="left",
        )
        seed = int(data.loc[data["model"] == model, "seed"].iloc[0])
        ax.set_title(f"{model} (s{seed})", fontsize=10, fontweight="bold", loc="left")
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    cbar = fig.colorbar(mesh, ax=axes[: len(models)].tolist(), shrink=0.8, pad=0.02)
    cbar.set_label("PK(U, U′) (grey: same layer, masked)", fontsize=9)
    fig.suptitle("Figure 1 — inter-layer write–write PK (weight space)", fontsize=11)
    return fig


# --------------------------------------------------------------------------- Figure 7
FIGURE7_COLUMNS = [
    "model",
    "seed",
    "n_head",
    "d_head",
    "d_model",
    "own_best_fraction",
    "own_best_fraction_layer0",
    "rho_self_mean",
]


def figure7_data(paths: Sequence[str]) -> pd.DataFrame:
    """Per (model, seed): own-best fractions (layers ≥ 1, layer 0), ρ_self and chances."""
    frame = _concat(paths)[FIGURE7_COLUMNS].copy()
    frame["chance_own_best"] = 1.0 / frame["n_head"]
    frame["chance_rho_self"] = frame["d_head"] / frame["d_model"]
    return frame.reset_index(drop=True)


def _chance_segments(ax, models: list[str], chance: pd.Series, label: str) -> None:
    """A dashed chance line over each model's bars (chance may differ between models)."""
    for x, model in enumerate(models):
        ax.hlines(chance[model], x - 0.45, x + 0.45, colors="black", linestyles="--", lw=1.2)
    values = chance.loc[models].unique()
    text = f"{label} = {values[0]:.3f}" if len(values) == 1 else label
    ax.plot([], [], "k--", lw=1.2, label=text)


def figure7(data: pd.DataFrame) -> Figure:
    """Bars: own-best fraction per model (mean over seeds, seeds as dots), layers ≥ 1 and
    layer 0; chance 1/H. Second panel: mean ρ_self (layers ≥ 1), chance d/D."""
    models = _model_order(data)
    long = data.melt(
        id_vars=["model", "seed"],
        value_vars=list(LAYER_LABELS),
        var_name="reader_layers",
        value_name="fraction",
    )
    long["reader_layers"] = long["reader_layers"].map(LAYER_LABELS)
    width = max(6.5, 1.1 * len(models) + 2.5)
    fig = Figure(figsize=(width, 7.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    palette = {"layers ≥ 1": "#4c72b0", "layer 0": "#a6bddb"}
    sns.barplot(
        long,
        x="model",
        y="fraction",
        hue="reader_layers",
        order=models,
        hue_order=list(palette),
        palette=palette,
        errorbar=None,
        ax=top,
    )
    sns.stripplot(
        long,
        x="model",
        y="fraction",
        hue="reader_layers",
        order=models,
        hue_order=list(palette),
        palette={k: "black" for k in palette},
        dodge=True,
        jitter=False,
        size=4,
        legend=False,
        ax=top,
    )
    chance = data.groupby("model")["chance_own_best"].first()
    _chance_segments(top, models, chance, "chance 1/H")
    top.set_ylim(0, 1.22)  # headroom for the legend above bars that reach 1
    top.set_yticks(np.linspace(0, 1, 6))
    top.set_ylabel("own-best fraction")
    top.set_xlabel("")
    top.set_title(
        "fraction of heads whose V read space overlaps their own write space most\n"
        "among their layer's heads (bars: mean over seeds; dots: seeds)",
        fontsize=9,
        loc="left",
    )
    top.legend(fontsize=8, loc="upper right", ncols=3, frameon=False)

    sns.barplot(
        data, x="model", y="rho_self_mean", order=models, color="#55a868", errorbar=None, ax=bottom
    )
    sns.stripplot(
        data,
        x="model",
        y="rho_self_mean",
        order=models,
        color="black",
        jitter=False,
        size=4,
        ax=bottom,
    )
    _chance_segments(bottom, models, data.groupby("model")["chance_rho_self"].first(), "chance d/D")
    highest = float(np.nanmax([data["rho_self_mean"].max(), data["chance_rho_self"].max()]))
    bottom.set_ylim(0, min(1.3, 1.35 * highest) if highest > 0 else 1.0)
    bottom.set_yticks([t for t in bottom.get_yticks() if 0 <= t <= 1])
    # Where every V read space is its own write space (ρ_self = 1), own-best is 1 by
    # construction, not learned (METHODS §14.1 leaves such designs out): say so on the bar.
    identical = data.groupby("model")["rho_self_mean"].min() > 1 - 1e-9
    for x, model in enumerate(models):
        if identical[model]:
            bottom.text(x, 1.02, "R_V = U", ha="center", va="bottom", fontsize=8)
    bottom.set_ylabel("mean ρ_self (layers ≥ 1)")
    bottom.set_xlabel("")
    bottom.legend(fontsize=8, loc="upper right", frameon=False)
    if len(models) > 4:
        bottom.tick_params(axis="x", labelrotation=35)
        for label in bottom.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.suptitle("Figure 7 — V self-alignment (weight space)", fontsize=11)
    return fig


# --------------------------------------------------------------------------- output
def save_figure(fig: Figure, path: str | os.PathLike, fmt: str) -> None:
    """Write ``fig`` atomically as ``fmt`` (png or svg) with deterministic bytes."""
    metadata = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.hashsalt": "headgeom", "svg.fonttype": "none"}):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)


FIGURES: dict[str, tuple[Callable[[Sequence[str]], pd.DataFrame], Callable[..., Figure]]] = {
    "figure1": (figure1_data, figure1),
    "figure7": (figure7_data, figure7),
}
