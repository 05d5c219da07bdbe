"""Paper figures as pure functions of result Parquets (docs §17.2).

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
import seaborn as sns  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import AsinhNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Circle  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from headgeom import results  # noqa: E402
from headgeom.analysis.effects import effect_matrix  # noqa: E402
from headgeom.analysis.stats import concentration  # noqa: E402
from headgeom.io import atomic_path  # noqa: E402
from headgeom.paper import selections  # noqa: E402
from headgeom.paper.tables import (  # noqa: E402
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    fixed,
    format_p,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)

MASK_COLOUR = "#d9d9d9"
LAYER_LABELS = {"own_best_fraction": "layers ≥ 1", "own_best_fraction_layer0": "layer 0"}


def _model_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["model"]))


# --------------------------------------------------------------------------- Figure 1
FIGURE1_COLUMNS = results.GEOMETRY_PK.columns(
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
)


def figure1_data(inputs: Inputs) -> pd.DataFrame:
    """The write–write rows of the pk Parquets (plus write–read rows, used for the panel
    annotations), one (model, seed) per input, with each model's ``reader_kind`` (registry,
    from its training log: the annotation of folded block readers, docs §9.2)."""
    frame = read_kind(need_kind(inputs, "pk", "figure1"), FIGURE1_COLUMNS, "figure1")[
        FIGURE1_COLUMNS
    ]
    if frame.groupby("model")["seed"].nunique().max() > 1:
        raise ValueError("figure1 draws one checkpoint per model; got several seeds of a model")
    runs = read_runs(need_kind(inputs, "runs", "figure1"))
    with_runs(frame[["model", "seed"]].drop_duplicates(), runs, "figure1")  # each has its log
    kind = {
        (m, int(s)): selections.geometry_registry().reader_kind(g)
        for m, s, g in zip(runs["model"], runs["seed"], runs["geometry"], strict=True)
    }
    frame["reader_kind"] = [kind[(m, int(s))] for m, s in zip(frame.model, frame.seed, strict=True)]
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
        if rows["reader_kind"].iloc[0] == "block":
            lines.append(folded_reader_note(wr))
    return "\n".join(lines)


#: A weight-space PK at most this counts as zero (all-common-axis's other-index write→read
#: PKs are rounding, ~1e-27 in float64; one shared direction would give up to 1).
ORTHOGONAL_PK = 1e-9


def folded_reader_note(wr: pd.DataFrame) -> str:
    """The note of docs §9.2 / §17.2 on block readers: the LayerNorm's centring leaves a
    folded read space of at most d − 1 dimensions inside the d-dim block (the weight-space
    read space), so where every other-index write→read PK is zero it is still orthogonal to
    the other lanes."""
    d = int(wr["target_dim"].max())
    note = f"folded readers ≤ {d - 1}-dim (LN centres the block)"
    other = wr.loc[~wr["same_index"], "pk"]
    if len(other) and float(other.abs().max()) <= ORTHOGONAL_PK:
        note += ",\nstill orthogonal to other lanes"
    return note


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
FIGURE7_COLUMNS = results.GEOMETRY_SUMMARY.columns(
    "model",
    "seed",
    "n_head",
    "d_head",
    "d_model",
    "own_best_fraction",
    "own_best_fraction_layer0",
    "rho_self_mean",
)


def figure7_data(inputs: Inputs) -> pd.DataFrame:
    """Per (model, seed): own-best fractions (layers ≥ 1, layer 0), ρ_self and chances."""
    paths = need_kind(inputs, "geometry", "figure7")
    frame = read_kind(paths, FIGURE7_COLUMNS, "figure7")[FIGURE7_COLUMNS].copy()
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
    # construction, not learned (docs §14.1 leaves such designs out): say so on the bar.
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


# --------------------------------------------------------------------------- Figure 3
#: Columns Figure 3 reads from the robustness Parquets (coord interface §3).
FIGURE3_COLUMNS = results.ROBUSTNESS.columns(
    "model", "seed", "task", "split", "N_eff", "N_eff_ci_low", "N_eff_ci_high"
)
FIGURE3_COLUMNS += results.ROBUSTNESS.columns("ci_level", "n_bootstrap")


def figure3_data(inputs: Inputs) -> pd.DataFrame:
    """Per (model, seed, task): N_eff on the analysis split with its bootstrap percentile
    interval (docs §12.4), models in input (paper) order."""
    runs = read_runs(need_kind(inputs, "runs", "figure3"))
    frame = read_kind(need_kind(inputs, "robustness", "figure3"), FIGURE3_COLUMNS, "figure3")
    frame = with_runs(frame[FIGURE3_COLUMNS], runs, "figure3")
    rank = frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    frame = frame.assign(_t=rank).sort_values(["order", "_t"]).drop(columns=["order", "_t"])
    return frame[["label", "display_name", "corpus", *FIGURE3_COLUMNS]].reset_index(drop=True)


def _configuration_labels(data: pd.DataFrame) -> dict[str, str]:
    """model -> the label of its bar: the run label of a one-seed model, else its display
    name (with the model key where two models share a display name)."""
    out = {}
    names = data.drop_duplicates("model").set_index("model")["display_name"]
    for model, rows in data.groupby("model", sort=False):
        if rows["seed"].nunique() == 1:
            out[model] = str(rows["label"].iloc[0])
        else:
            name = names[model]
            shared = (names == name).sum() > 1
            out[model] = f"{name} [{model}]" if shared else str(name)
    return out


def figure3(data: pd.DataFrame) -> Figure:
    """Grouped bars: tasks on x, one bar per configuration (model); error bars = bootstrap
    interval where the data have one. A model with several seeds shows the seed spread: the
    bar is the seed mean and each seed is a dot with its own bootstrap interval."""
    labels = _configuration_labels(data)
    models = list(labels)
    tasks = [t for t in TASK_ORDER if t in set(data["task"])]
    n = len(models)
    width = 0.8 / n
    fig = Figure(figsize=(max(7.5, 2.8 + 0.42 * n * len(tasks)), 4.6), layout="constrained")
    ax = fig.subplots()
    palette = sns.color_palette("colorblind", n)
    top = 0.0
    any_seeds = False
    for i, model in enumerate(models):
        runs = data[data["model"] == model]
        seeds = list(dict.fromkeys(runs["seed"]))
        x = np.arange(len(tasks)) - 0.4 + width * (i + 0.5)
        by_task = runs.groupby("task")["N_eff"].mean().reindex(tasks)
        y = by_task.to_numpy(dtype=float)
        ax.bar(x, y, width * 0.92, color=palette[i], label=labels[model])
        if len(seeds) == 1:
            rows = runs.set_index("task").reindex(tasks)
            low = rows["N_eff_ci_low"].to_numpy(dtype=float)
            high = rows["N_eff_ci_high"].to_numpy(dtype=float)
            has_ci = np.isfinite(low) & np.isfinite(high)
            if has_ci.any():
                yerr = np.vstack([y - low, high - y])[:, has_ci]
                ax.errorbar(x[has_ci], y[has_ci], yerr=yerr, fmt="none", ecolor="black",
                            elinewidth=1.0, capsize=2.5)  # fmt: skip
            ends = np.where(has_ci, high, y)
        else:  # the seed spread: one dot per seed, with its own bootstrap interval
            any_seeds = True
            offsets = np.linspace(-0.28, 0.28, len(seeds)) * width
            ends = y.copy()
            for seed, dx in zip(seeds, offsets, strict=True):
                rows = runs[runs["seed"] == seed].set_index("task").reindex(tasks)
                ys = rows["N_eff"].to_numpy(dtype=float)
                low = rows["N_eff_ci_low"].to_numpy(dtype=float)
                high = rows["N_eff_ci_high"].to_numpy(dtype=float)
                yerr = np.vstack([ys - np.where(np.isfinite(low), low, ys),
                                  np.where(np.isfinite(high), high, ys) - ys])  # fmt: skip
                ax.errorbar(x + dx, ys, yerr=yerr, fmt="o", ms=3.2, color="black",
                            ecolor="black", elinewidth=0.8, capsize=1.5, zorder=3)  # fmt: skip
                ends = np.fmax(ends, np.where(np.isfinite(high), high, ys))
        for xi, yi, end in zip(x, y, ends, strict=True):
            if np.isfinite(yi):
                ax.annotate(
                    f"{yi:.1f}",
                    (xi, end),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        top = max(top, float(np.nanmax(ends)))
    if any_seeds:
        ax.errorbar([], [], yerr=[], fmt="o", ms=3.2, color="black",
                    label="seeds (bar: seed mean)")  # fmt: skip
    ax.set_xticks(np.arange(len(tasks)), [TASK_TITLES[t] for t in tasks])
    ax.set_xlim(-0.5, len(tasks) - 0.5)
    ax.set_ylim(0, 1.12 * top if top > 0 else 1)
    ax.set_ylabel("N_eff (effective number of heads)", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    level = _single(data["ci_level"].dropna(), "ci_level")
    n_boot = _single(data["n_bootstrap"].dropna(), "n_bootstrap")
    split = _single(data["split"], "split")
    ax.set_title(
        f"N_eff per model and task ({split} split); lower = more concentrated\n"
        f"error bars: {100 * level:.0f}% bootstrap percentile intervals "
        f"({int(n_boot):,} resamples of the examples)"
        if level is not None
        else f"N_eff per model and task ({split} split); lower = more concentrated",
        fontsize=9,
        loc="left",
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Figure 3 — functional concentration N_eff", fontsize=11)
    return fig


def _single(values: pd.Series, what: str):
    """The one value a column takes (None if empty); several values are an error."""
    unique = pd.unique(values)
    if len(unique) > 1:
        raise ValueError(f"inputs disagree on {what}: {sorted(unique)}")
    return unique[0] if len(unique) else None


# --------------------------------------------------------------------------- Figure 4
#: Columns Figure 4 reads from compare/loss.parquet (coord interface §8).
FIGURE4_COLUMNS = results.LOSS.columns(
    "model", "seed", "display_name", "corpus", "reader_type", "n_head"
)
FIGURE4_COLUMNS += results.LOSS.columns("index_meaningful", "val_loss", "N_eff_geomean")
FIGURE4_MARKERS = {"free": "o", "block": "s"}


def figure4_data(inputs: Inputs, models: Sequence[str] | None = None) -> pd.DataFrame:
    """Per (model, seed): validation loss and the geometric mean over tasks of N_eff
    (docs §12.7), restricted to ``models`` (in that order) when given. ``flagged``
    marks models whose heads per layer differ from the base architecture (the paper's
    16-head routed controls): their raw N_eff counts more candidate heads."""
    frame = read_kind(need_kind(inputs, "loss", "figure4"), FIGURE4_COLUMNS, "figure4")
    extra = [c for c in frame.columns if c.startswith("N_eff_") and c != "N_eff_geomean"]
    frame = frame[[*FIGURE4_COLUMNS, *extra]]
    if models is not None:
        missing = sorted(set(models) - set(frame["model"]))
        if missing:
            raise ValueError(f"figure4: models {missing} are not in the loss Parquet")
        rank = {m: i for i, m in enumerate(models)}
        frame = frame[frame["model"].isin(rank)]
        frame = frame.assign(_o=frame["model"].map(rank)).sort_values(["_o", "seed"])
        frame = frame.drop(columns="_o")
    unknown = sorted(set(frame["reader_type"]) - set(FIGURE4_MARKERS))
    if unknown:
        raise ValueError(f"figure4: reader_type {unknown}; expected one of {list(FIGURE4_MARKERS)}")
    several = frame.groupby("display_name")["seed"].transform("nunique") > 1
    frame["label"] = np.where(
        several,
        frame["display_name"] + " (s" + frame["seed"].astype(str) + ")",
        frame["display_name"],
    )
    frame["flagged"] = ~frame["index_meaningful"].astype(bool)
    return frame.reset_index(drop=True)


def figure4_spearman(data: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Spearman(loss, geometric-mean N_eff) on the plotted points: all, and those with the
    base architecture's heads per layer (paper: −0.77 over 9, −0.94 over the six 12-head)."""
    out = {}
    for name, rows in (("all", data), ("base_heads", data[~data["flagged"]])):
        rows = rows.dropna(subset=["val_loss", "N_eff_geomean"])
        ok = (
            len(rows) >= 3
            and rows["val_loss"].nunique() > 1
            and rows["N_eff_geomean"].nunique() > 1
        )
        rho = spearmanr(rows["val_loss"], rows["N_eff_geomean"]).statistic if ok else float("nan")
        out[name] = (float(rho), len(rows))
    return out


def figure4(data: pd.DataFrame) -> Figure:
    """Scatter: x = validation loss, y = geometric-mean N_eff; marker = reader type, open
    markers = flagged head count; the seeds of a model joined by a line, their mean a cross;
    Spearman correlations (over every plotted run) in the title."""
    fig = Figure(figsize=(6.8, 5.0), layout="constrained")
    ax = fig.subplots()
    for (reader, flagged), rows in data.groupby(["reader_type", "flagged"], sort=True):
        heads = ", ".join(str(h) for h in sorted(set(rows["n_head"])))
        label = f"{reader} readers" + (f", {heads} heads/layer (not comparable)" if flagged else "")
        ax.scatter(
            rows["val_loss"],
            rows["N_eff_geomean"],
            marker=FIGURE4_MARKERS[reader],
            s=55,
            facecolors="none" if flagged else ("#4c72b0" if reader == "free" else "#dd8452"),
            edgecolors="#4c72b0" if reader == "free" else "#dd8452",
            linewidths=1.5,
            label=label,
            zorder=3,
        )
    # the seed spread: a line joins the seeds of one model, a cross marks their mean
    spread = False
    for _, rows in data.groupby("model", sort=False):
        if len(rows) > 1:
            spread = True
            order = rows.sort_values("val_loss")
            ax.plot(order["val_loss"], order["N_eff_geomean"], color="grey", lw=1.0, zorder=2)
            ax.plot(rows["val_loss"].mean(), rows["N_eff_geomean"].mean(), marker="x",
                    color="black", ms=6, mew=1.2, ls="none", zorder=4)  # fmt: skip
    if spread:
        ax.plot([], [], color="grey", lw=1.0, marker="x", mec="black",
                label="seeds of one model (×: seed mean)")  # fmt: skip
    ax.margins(x=0.15, y=0.12)
    rho = figure4_spearman(data)

    def text(name: str, what: str) -> str:
        value, n = rho[name]
        shown = "n/a" if np.isnan(value) else f"{value:+.2f}".replace("-", "−")
        return f"{shown} ({n} {what if n != 1 else what.replace('models', 'model')})"

    title = f"Spearman(loss, N_eff): {text('all', 'models')}"
    if data["flagged"].any():
        title += f"; {text('base_heads', 'with base heads/layer')}"
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlabel("validation loss (nats, final checkpoint)")
    ax.set_ylabel("N_eff, geometric mean over tasks")
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, frameon=False, loc="outside lower center", ncols=2)
    fig.suptitle("Figure 4 — validation loss vs concentration", fontsize=11)
    # labels last, once the layout has fixed where the points are drawn
    fig.draw_without_rendering()
    _place_labels(fig, ax, data["val_loss"], data["N_eff_geomean"], data["label"])
    return fig


#: Label offsets (points) tried in turn, so that neighbouring labels do not overlap.
_LABEL_OFFSETS = [(5, 4, "left"), (5, -11, "left"), (-5, 4, "right"), (-5, -11, "right")]
_LABEL_OFFSETS += [(5, 15, "left"), (5, -22, "left"), (-5, 15, "right"), (-5, -22, "right")]


def _place_labels(fig: Figure, ax, xs, ys, labels) -> None:
    """Annotate points, moving a label to the first offset that overlaps no earlier label."""
    renderer = (
        FigureCanvasAgg(fig).get_renderer()
        if not hasattr(fig.canvas, "get_renderer")
        else fig.canvas.get_renderer()
    )
    frame = ax.get_window_extent(renderer)
    placed = []
    for x, y, label in sorted(zip(xs, ys, labels, strict=True), key=lambda t: -t[1]):
        for dx, dy, ha in _LABEL_OFFSETS:
            text = ax.annotate(
                label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7.5, ha=ha
            )
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            inside = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
            if inside and not any(box.overlaps(other) for other in placed):
                break
            text.remove()
        else:  # every offset collides: keep the first
            text = ax.annotate(
                label,
                (x, y),
                xytext=_LABEL_OFFSETS[0][:2],
                textcoords="offset points",
                fontsize=7.5,
            )
            box = text.get_window_extent(renderer)
        placed.append(box)


# --------------------------------------------------------------------------- Figure 5
#: asinh(e / ASINH_WIDTH) colour transform of the heat maps (paper Figure 5).
ASINH_WIDTH = 0.2
FIGURE5_HEADS = results.HEADS.columns("model", "seed", "task", "split", "layer", "head", "e")
FIGURE5_LANES = results.LANES.columns("model", "seed", "task", "split", "lambda_score", "p_value")
FIGURE5_EVAL = results.EVAL.columns("model", "seed", "task", "split", "margin")


def figure5_data(inputs: Inputs) -> pd.DataFrame:
    """Per (model, seed, task, layer, head): e_{l,h} on the lanes' split (discovery), with
    per panel the ringed head (largest drop: argmax of the signed e) and e/E of it, the
    largest-|e| head of the older view (``is_largest_abs_head``), N_eff, Λ with its p, and
    the base (clean) logit difference on that split."""
    runs = read_runs(need_kind(inputs, "runs", "figure5"))
    lanes = read_kind(need_kind(inputs, "lanes", "figure5"), FIGURE5_LANES, "figure5")
    split = _single(lanes["split"], "the lanes' split")
    heads = read_kind(need_kind(inputs, "heads", "figure5"), FIGURE5_HEADS, "figure5")
    heads = heads.loc[heads["split"] == split, FIGURE5_HEADS]
    base = read_kind(need_kind(inputs, "eval", "figure5"), FIGURE5_EVAL, "figure5")
    base = base.loc[base["split"] == split, ["model", "seed", "task", "margin"]]
    panels = []
    for _, rows in heads.groupby(["model", "seed", "task"], sort=False):
        e = effect_matrix(rows)
        stats = concentration(e)
        layer, head = largest_drop(e)
        abs_layer, abs_head = stats["top_head"] if stats["top_head"] is not None else (-1, -1)
        panels.append(
            rows.assign(
                asinh_e=np.arcsinh(rows["e"] / ASINH_WIDTH),
                is_top_head=(rows["layer"] == layer) & (rows["head"] == head),
                top_head_share=e[layer, head] / stats["E"] if stats["E"] else np.nan,
                # the older view (ring on the largest |e|), kept in the source data only
                is_largest_abs_head=(rows["layer"] == abs_layer) & (rows["head"] == abs_head),
                N_eff=stats["N_eff"],
                E=stats["E"],
            )
        )
    if not panels:
        raise ValueError(f"figure5: no per-head effects of split {split!r}")
    frame = pd.concat(panels, ignore_index=True)
    lanes = lanes[FIGURE5_LANES].rename(columns={"p_value": "lambda_p"}).drop(columns="split")
    frame = _attach(frame, lanes, f"lanes of split {split!r}")
    frame = _attach(frame, base.rename(columns={"margin": "base_ld"}), f"eval of split {split!r}")
    frame = with_runs(frame, runs, "figure5")
    # Λ of a run beyond the paper's Λ runs is extra (docs §13.1)
    paper = selections.lambda_paper_runs(selections.models_of_runs(runs))
    keys = zip(frame["model"], frame["seed"], strict=True)
    frame["paper_lambda"] = [(m, int(s)) in paper for m, s in keys]
    rank = frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    frame = frame.assign(_t=rank).sort_values(["order", "_t", "layer", "head"])
    return frame.drop(columns=["order", "_t", "label_repository"]).reset_index(drop=True)


def largest_drop(e: np.ndarray) -> tuple[int, int]:
    """(layer, head) of the largest signed effect e (the largest drop of the logit
    difference, paper Figure 5's ring); the first in row-major order on ties."""
    if not np.isfinite(e).any():
        raise ValueError("figure5: a panel has no finite effect")
    layer, head = np.unravel_index(int(np.nanargmax(e)), e.shape)
    return int(layer), int(head)


def _attach(frame: pd.DataFrame, other: pd.DataFrame, what: str) -> pd.DataFrame:
    """Join one ``other`` row to each (model, seed, task) panel; every panel needs one."""
    keys = ["model", "seed", "task"]
    if other.duplicated(keys).any():
        raise ValueError(f"figure5: more than one {what} row for a (model, seed, task)")
    out = frame.merge(other, on=keys, how="left", validate="many_to_one", indicator=True)
    missing = out.loc[out["_merge"] == "left_only", keys].drop_duplicates()
    if len(missing):
        raise ValueError(f"figure5: no {what} row for {missing.values.tolist()}")
    return out.drop(columns="_merge")


def figure5_norm(data: pd.DataFrame) -> AsinhNorm:
    """One colour scale for every panel: asinh(e/0.2), symmetric about 0 at the largest |e|."""
    vmax = float(np.nanmax(np.abs(data["e"]))) if len(data) else 1.0
    vmax = vmax if vmax > 0 else 1.0
    return AsinhNorm(linear_width=ASINH_WIDTH, vmin=-vmax, vmax=vmax)


def colourbar_ticks(vmax: float) -> list[float]:
    """Symmetric ticks in logit units, roughly even in asinh space (0, ±0.2, ±1, ±5, ...),
    plus the end of the scale (rounded down to two significant digits) when it is far from
    the last of those."""
    ticks = [t for t in (0.2, 1.0, 5.0, 25.0, 125.0) if t <= vmax]
    step = 10.0 ** (math.floor(math.log10(vmax)) - 1)
    end = round(math.floor(vmax / step) * step, 12)
    if not ticks or np.arcsinh(end / ASINH_WIDTH) - np.arcsinh(ticks[-1] / ASINH_WIDTH) > 0.3:
        ticks.append(end)
    return sorted({-t for t in ticks} | {0.0} | set(ticks))


def figure5(data: pd.DataFrame) -> Figure:
    """Heat maps of e_{l,h}: one row of panels per model, one column per task; layer 0 at
    the bottom, head index on x; red = patch hurts (e > 0), blue = helps; one asinh colour
    scale for all panels; the head with the largest drop (largest signed e) circled."""
    labels = list(dict.fromkeys(data["label"]))
    tasks = [t for t in TASK_ORDER if t in set(data["task"])]
    n_layer, n_head = int(data["layer"].max()) + 1, int(data["head"].max()) + 1
    panel_w = 2.9
    panel_h = panel_w * n_layer / n_head
    fig = Figure(
        figsize=(panel_w * len(tasks) + 1.9, (panel_h + 0.75) * len(labels) + 0.7),
        layout="constrained",
    )
    axes = fig.subplots(len(labels), len(tasks), squeeze=False)
    norm = figure5_norm(data)
    image = None
    for r, label in enumerate(labels):
        for c, task in enumerate(tasks):
            ax = axes[r, c]
            rows = data[(data["label"] == label) & (data["task"] == task)]
            if rows.empty:
                ax.set_visible(False)
                continue
            e = effect_matrix(rows)
            # origin="lower": row 0 of the array (layer 0) is drawn at the bottom
            image = ax.imshow(
                e, origin="lower", cmap="RdBu_r", norm=norm, aspect="equal", interpolation="nearest"
            )
            top = rows[rows["is_top_head"]]
            if len(top):
                layer, head = int(top["layer"].iloc[0]), int(top["head"].iloc[0])
                # black on white, so the ring shows on any cell colour
                for colour, width in (("white", 3.0), ("black", 1.3)):
                    ring = Circle((head, layer), 0.42, fill=False, edgecolor=colour, lw=width)
                    ax.add_patch(ring)
            _heatmap_ticks(ax, n_layer, n_head)
            ax.set_title(_figure5_title(rows, task), fontsize=7.5, loc="left")
            if c == 0:
                ax.set_ylabel(f"{label}\nlayer", fontsize=9)
            if r == len(labels) - 1:
                ax.set_xlabel("head index", fontsize=8)
    cbar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, pad=0.02, aspect=30)
    ticks = colourbar_ticks(norm.vmax)
    cbar.set_ticks(ticks, labels=[f"{t:g}".replace("-", "−") for t in ticks])
    cbar.ax.minorticks_off()
    cbar.ax.tick_params(labelsize=8)
    cbar.set_label(
        "e = mean drop of the logit difference (logit units)\n"
        f"colour: asinh(e/{ASINH_WIDTH:g}); red: patch hurts, blue: patch helps",
        fontsize=8,
    )
    split = _single(data["split"], "split")
    fig.suptitle(
        f"Figure 5 — per-head patch effects e_(l,h) ({split} split); ○ largest drop (max e)",
        fontsize=11,
    )
    return fig


def _heatmap_ticks(ax, n_layer: int, n_head: int) -> None:
    step_h, step_l = max(1, math.ceil(n_head / 12)), max(1, math.ceil(n_layer / 12))
    ax.set_xticks(range(0, n_head, step_h))
    ax.set_yticks(range(0, n_layer, step_l))
    ax.tick_params(labelsize=7, length=2)


def _figure5_title(rows: pd.DataFrame, task: str) -> str:
    first = rows.iloc[0]
    top = rows[rows["is_top_head"]]
    head = (
        f"L{int(top['layer'].iloc[0])}.H{int(top['head'].iloc[0])} "
        f"({100 * first['top_head_share']:.0f}% of E)"
        if len(top)
        else "no effect"
    )
    lam = first["lambda_score"]
    extra = "" if first["paper_lambda"] else ", extra"
    lam_text = (
        "Λ undefined" if pd.isna(lam) else f"Λ {lam:.2f} (p {format_p(first['lambda_p'])}{extra})"
    )
    return (
        f"{TASK_TITLES[task]}: top {head}\n"
        f"base LD {fixed(first['base_ld'], 2)} · N_eff {first['N_eff']:.1f} · {lam_text}"
    )


# --------------------------------------------------------------------------- output
# ----------------------------------------------------------- Figure 2 (paper §5.1, docs §11.3–11.4)
FIGURE2_COLUMNS = [
    "model", "seed", "corpus", "task", "source", "reader", "X", "L", "rho",
    "is_top_pair", "percentile_all_later", "percentile_same_layer",
]  # fmt: skip
X_COLOURS = {"Q": "#1f77b4", "K": "#2ca02c", "V": "#d62728"}


def figure2_data(inputs: Inputs) -> pd.DataFrame:
    """Every source → later reader pair (L, ρ, the two percentiles of L) of every leakage
    run and task, flagged where it is one of the evaluation-selected top pairs (docs §11.4,
    §17.2 Figure 2)."""
    from headgeom.analysis.exclusivity import add_percentiles

    cols = results.LEAKAGE.columns(
        "model", "seed", "task", "source_layer", "source_head", "reader_layer",
        "reader_head", "read_type", "leakage", "rho",
    )  # fmt: skip
    leak = add_percentiles(read_kind(need_kind(inputs, "leakage", "figure2"), cols, "figure2"))
    pairs = read_kind(need_kind(inputs, "pairs", "figure2"), [*cols, "selection"], "figure2")
    keys = cols[:8]
    top = pairs[pairs["selection"] == "evaluation"][keys].drop_duplicates()
    leak = leak.merge(top.assign(is_top_pair=True), on=keys, how="left")
    leak["is_top_pair"] = leak["is_top_pair"].fillna(False).astype(bool)
    corpus = read_runs(need_kind(inputs, "runs", "figure2"))[["model", "seed", "corpus"]]
    leak = leak.merge(corpus, on=["model", "seed"], how="left")

    def label(layer: str, head: str) -> pd.Series:  # "L<l>H<h>", 0-based
        return "L" + leak[layer].astype(str) + "H" + leak[head].astype(str)

    leak["source"] = label("source_layer", "source_head")
    leak["reader"] = label("reader_layer", "reader_head")
    leak = leak.rename(columns={"read_type": "X", "leakage": "L"})
    return leak[FIGURE2_COLUMNS]


def figure2(data: pd.DataFrame) -> Figure:
    """L against ρ: grey log-density of all pairs, the top pairs coloured by X, y = x."""
    fig = Figure(figsize=(5.6, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ok = data.dropna(subset=["L", "rho"])
    hi = float(max(ok["L"].max(), ok["rho"].max())) * 1.05
    ax.hexbin(ok["rho"], ok["L"], gridsize=45, bins="log", cmap="Greys", mincnt=1,
              extent=(0, hi, 0, hi), linewidths=0)  # fmt: skip
    top = ok[ok["is_top_pair"]]
    for X, rows in top.groupby("X", sort=False):
        ax.scatter(rows["rho"], rows["L"], s=22, color=X_COLOURS.get(X, "k"), edgecolor="white",
                   linewidth=0.5, label=f"top pairs, {X} (n = {len(rows)})", zorder=3)  # fmt: skip
    ax.plot([0, hi], [0, hi], color="k", lw=0.8, ls="--", label="L = ρ (isotropic)")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("ρ = PK(U, R) / dim U (isotropic expectation)")
    ax.set_ylabel("L (measured leakage)")
    n_runs = ok[["model", "seed"]].drop_duplicates().shape[0]
    ax.set_title(f"Measured leakage vs isotropic expectation ({len(ok):,} pairs, {n_runs} models)",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left")
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, fmt: str) -> None:
    """Write ``fig`` atomically as ``fmt`` (png or svg) with deterministic bytes."""
    metadata = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.hashsalt": "headgeom", "svg.fonttype": "none"}):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)


FIGURES: dict[str, tuple[Callable[..., pd.DataFrame], Callable[..., Figure]]] = {
    "figure1": (figure1_data, figure1),
    "figure3": (figure3_data, figure3),
    "figure4": (figure4_data, figure4),
    "figure5": (figure5_data, figure5),
    "figure7": (figure7_data, figure7),
    "figure2": (figure2_data, figure2),  # exclusivity (paper §5.1)
}


# ----------------------------------------------------------------------- clamps (docs §13.3, §15.3)
from headgeom.paper.tables import (  # noqa: E402
    CLAMP_PAIR_COLUMNS,
    CLAMP_PATH_COLUMNS,
    path_shares,
)

SAME_INDEX_COLOUR, OTHER_INDEX_COLOUR = "#1f5fbf", "#9a9a9a"
PART_COLOURS = {"direct": "#4c4c4c", "via MLPs": "#dd8452", "via later attention": "#4c72b0"}


def figure6de_data(inputs: Inputs) -> pd.DataFrame:
    """Per ordered top-3 pair (source i, later j): the reductions of i's effect when j is
    clamped (panel d) and when every MLP from l_i on is clamped (panel e), with run labels."""
    runs = read_runs(need_kind(inputs, "runs", "figure6de"))
    pairs = read_kind(need_kind(inputs, "pairs", "figure6de"), CLAMP_PAIR_COLUMNS, "figure6de")
    frame = with_runs(pairs[CLAMP_PAIR_COLUMNS], runs, "figure6de")
    frame["pair"] = [
        f"L{a}H{b}→L{c}H{d}"
        for a, b, c, d in zip(frame.source_layer, frame.source_head, frame.later_layer,
                              frame.later_head, strict=True)
    ]  # fmt: skip
    rank = frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    frame = frame.assign(_t=rank).sort_values(["order", "_t", "source_layer", "later_layer"])
    return frame.drop(columns=["_t", "label_repository"]).reset_index(drop=True)


def figure6de(data: pd.DataFrame) -> Figure:
    """(d) reduction when the later top head is clamped, one dot per pair, same-index pairs
    in blue; (e) reduction when every later MLP is clamped, one dot per source."""
    labels = list(dict.fromkeys(data["label"]))
    fig = Figure(figsize=(max(7.0, 1.3 * len(labels) + 3), 7.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    x = {label: i for i, label in enumerate(labels)}
    markers = {"sva": "o", "quote": "s", "plural": "^"}
    rng = np.random.default_rng(0)  # fixed jitter: deterministic bytes
    for ax, column, frame in (
        (top, "reduction_head", data),
        (bottom, "reduction_mlps",
         data.drop_duplicates(["model", "seed", "task", "source_layer", "source_head"])),
    ):  # fmt: skip
        for task, marker in markers.items():
            for same, colour in ((False, OTHER_INDEX_COLOUR), (True, SAME_INDEX_COLOUR)):
                rows = frame[(frame["task"] == task) & (frame["same_index"] == same)]
                if column == "reduction_mlps" and same:
                    continue  # panel e: one dot per source, index plays no role
                xs = np.array([x[v] for v in rows["label"]], dtype=float)
                xs = xs + rng.uniform(-0.18, 0.18, len(rows))
                ax.scatter(xs, 100 * rows[column], marker=marker, s=34, color=colour,
                           edgecolor="black", linewidth=0.4, zorder=3)  # fmt: skip
        ax.axhline(0, color="black", lw=0.8)
        ax.axhline(100, color="black", lw=0.6, ls=":")
        ax.set_ylabel("reduction of the source's effect (%)")
        ax.grid(axis="y", alpha=0.3)
    for task, marker in markers.items():
        top.scatter(
            [], [], marker=marker, color="white", edgecolor="black", label=TASK_TITLES[task]
        )
    top.scatter([], [], marker="o", color=SAME_INDEX_COLOUR, label="same-index pair")
    top.scatter([], [], marker="o", color=OTHER_INDEX_COLOUR, label="different-index pair")
    top.legend(fontsize=8, ncols=5, loc="upper left", frameon=False)
    top.set_title("(d) clamp the later top head j while patching the earlier top head i",
                  fontsize=9, loc="left")  # fmt: skip
    bottom.set_title("(e) clamp every MLP from the source layer on", fontsize=9, loc="left")
    bottom.set_xticks(range(len(labels)), labels)
    if len(labels) > 4:
        bottom.tick_params(axis="x", labelrotation=25)
    fig.suptitle("Figure 6d–e — clamping tests (evaluation split, top-3 heads)", fontsize=11)
    return fig


def figure8_data(inputs: Inputs) -> pd.DataFrame:
    """Panel a: per Figure-8 model, order-A parts summed over the top-5 SVA heads (logit
    units). Panel b: per both-orders model, shares of Σ Δ(∅) over its head–task cases in
    order A and order B. Tidy: panel, label, order, part, value."""
    runs = read_runs(need_kind(inputs, "runs", "figure8"))
    rows = []
    paths = read_kind(need_kind(inputs, "paths", "figure8"), CLAMP_PATH_COLUMNS, "figure8")
    paths = with_runs(paths, runs, "figure8")
    for (label, order), group in paths[paths["task"] == "sva"].groupby(["label", "order"]):
        for part, column in (("direct", "direct"), ("via MLPs", "via_mlps_a"),
                             ("via later attention", "via_attention_a")):  # fmt: skip
            rows.append(
                {
                    "panel": "a",
                    "label": label,
                    "order": order,
                    "release_order": "A",
                    "part": part,
                    "value": group[column].sum(),
                    "n_cases": len(group),
                }
            )
    both = read_kind(need_kind(inputs, "both_orders", "figure8"), CLAMP_PATH_COLUMNS, "figure8")
    both = with_runs(both, runs, "figure8")
    for _, group in both.groupby("model", sort=False):
        shares = path_shares(group)
        label, corpus = str(group["display_name"].iloc[0]), group["corpus"].iloc[0]
        label = f"{label} ({corpus})" if corpus != "—" else label
        n_runs = group["seed"].nunique()
        label = f"{label}, {n_runs} seeds" if n_runs > 1 else label
        for release in ("a", "b"):
            for part, key in (
                ("direct", "direct_share"),
                ("via MLPs", f"mlp_share_{release}"),
                ("via later attention", f"attention_share_{release}"),
            ):
                rows.append({"panel": "b", "label": label, "order": int(group["order"].min()),
                             "release_order": release.upper(), "part": part,
                             "value": shares[key], "n_cases": shares["n_cases"]})  # fmt: skip
    return pd.DataFrame(rows).sort_values(["panel", "order", "release_order"], kind="stable")


def _stacked(ax, frame: pd.DataFrame, xs, width: float) -> None:
    bottom_pos = np.zeros(len(xs))
    bottom_neg = np.zeros(len(xs))
    for part, colour in PART_COLOURS.items():
        values = frame[frame["part"] == part].set_index("label")["value"].to_numpy()
        base = np.where(values >= 0, bottom_pos, bottom_neg)
        ax.bar(xs, values, width, bottom=base, color=colour, label=part, edgecolor="white")
        bottom_pos += np.maximum(values, 0)
        bottom_neg += np.minimum(values, 0)


def figure8(data: pd.DataFrame) -> Figure:
    """(a) stacked direct / via MLPs / via later attention per model (order A, top-5 SVA
    heads, logit units, total marked); (b) the same parts as shares of Σ Δ(∅) over every
    head–task case, order A (release MLPs first) beside order B (release heads first)."""
    a, b = data[data["panel"] == "a"], data[data["panel"] == "b"]
    labels_a = list(dict.fromkeys(a["label"]))
    labels_b = list(dict.fromkeys(b["label"]))
    fig = Figure(figsize=(max(10.0, 1.2 * (len(labels_a) + len(labels_b)) + 3), 5.2),
                 layout="constrained")  # fmt: skip
    left, right = fig.subplots(1, 2, width_ratios=[max(1, len(labels_a)), max(1, len(labels_b))])
    xs = np.arange(len(labels_a))
    _stacked(left, a, xs, 0.7)
    totals = a.groupby("label", sort=False)["value"].sum().loc[labels_a]
    left.scatter(xs, totals, marker="_", s=500, color="black", zorder=4, label="total Δ(∅)")
    left.axhline(0, color="black", lw=0.8)
    left.set_xticks(xs, labels_a, rotation=25, ha="right")
    left.set_ylabel("Σ over top-5 SVA heads (logit units)")
    left.set_title("(a) order A: release the MLP clamp first", fontsize=9, loc="left")
    left.legend(fontsize=8, frameon=False)
    width = 0.38
    for k, release in enumerate(("A", "B")):
        part = b[b["release_order"] == release]
        _stacked(right, part, np.arange(len(labels_b)) + (k - 0.5) * width, width * 0.95)
        for i in range(len(labels_b)):
            right.text(i + (k - 0.5) * width, -0.04, release, ha="center", va="top", fontsize=8)
    right.axhline(0, color="black", lw=0.8)
    right.axhline(1, color="black", lw=0.6, ls=":")
    right.set_xticks(np.arange(len(labels_b)), labels_b, rotation=25, ha="right")
    right.set_ylabel("share of Σ Δ(∅) (all tasks, top-5 heads)")
    right.set_title("(b) order A vs order B (release heads first)", fontsize=9, loc="left")
    fig.suptitle("Figure 8 — where a head's effect goes: two-order path decomposition",
                 fontsize=11)  # fmt: skip
    return fig


FIGURES.update({"figure6de": (figure6de_data, figure6de), "figure8": (figure8_data, figure8)})


# --------------------------------------------------------------------- dynamics (docs §13.2, §14.2)
from matplotlib.ticker import NullLocator  # noqa: E402

from headgeom.paper.tables import TIMELINE_COLUMNS  # noqa: E402

#: The paper shades steps 4,096–16,384 of 65,536 (docs §13.2: where write-common's lane
#: forms); a run of another length shades the same fractions of its training.
BAND_FRACTIONS = (4096 / 65536, 16384 / 65536)


def figure6abc_data(inputs: Inputs) -> pd.DataFrame:
    """Per timeline run and checkpoint: SVA accuracy, Λ and p, own-best fraction and median
    scaled idempotence, with run labels and the run's final step (for the shaded band)."""
    runs = read_runs(need_kind(inputs, "runs", "figure6abc"))
    frame = read_kind(need_kind(inputs, "timeline", "figure6abc"), TIMELINE_COLUMNS,
                      "figure6abc")  # fmt: skip
    frame = with_runs(frame[TIMELINE_COLUMNS], runs, "figure6abc")
    final = frame[frame["is_final"]].set_index(["model", "seed"])["step"]
    frame["final_step"] = [int(final[(m, s)]) for m, s in zip(frame.model, frame.seed, strict=True)]
    frame = frame.sort_values(["order", "step"]).drop(columns=["label_repository"])
    return frame.reset_index(drop=True)


def figure6abc(data: pd.DataFrame) -> Figure:
    """(a) SVA accuracy, (b) Λ (SVA, p beside each point), (c) median P(T_h) (solid) and the
    own-best fraction (dashed) against the step on a log axis; the paper's 4,096–16,384 band
    (the same fractions of each run's training) shaded."""
    fig = Figure(figsize=(13.0, 4.4), layout="constrained")
    axes = fig.subplots(1, 3, sharex=True)
    colours = dict(zip(dict.fromkeys(data["label"]), sns.color_palette("deep"), strict=False))
    lo, hi = BAND_FRACTIONS
    for final in sorted(set(data["final_step"])):
        for ax in axes:
            ax.axvspan(lo * final, hi * final, color="#e6e6e6", zorder=0, lw=0)
    for label, rows in data.groupby("label", sort=False):
        c = colours[label]
        axes[0].plot(rows["step"], 100 * rows["sva_accuracy"], "o-", color=c, label=label)
        axes[1].plot(rows["step"], rows["lambda_score"], "o-", color=c, label=label)
        for x, y, p in zip(rows["step"], rows["lambda_score"], rows["lambda_p"], strict=True):
            if y == y:
                axes[1].annotate(f"p={format_p(p)}", (x, y), textcoords="offset points",
                                 xytext=(4, 5), fontsize=7, color=c)  # fmt: skip
        axes[2].plot(rows["step"], rows["idempotence_median"], "o-", color=c,
                     label=f"{label}: median P(T_h)")  # fmt: skip
        axes[2].plot(rows["step"], rows["own_best_fraction"], "s--", color=c, mfc="white",
                     label=f"{label}: own-best fraction")  # fmt: skip
    titles = ("(a) SVA accuracy (evaluation split)", "(b) lane score Λ, SVA (discovery split)",
              "(c) V–O self-alignment over training")  # fmt: skip
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("training step (log scale)")
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    steps = sorted(set(data["step"]))
    axes[0].set_xticks(steps, [f"{s:,}" for s in steps], fontsize=7)
    axes[0].xaxis.set_minor_locator(NullLocator())
    axes[0].set_ylabel("accuracy (%)")
    axes[0].set_ylim(0, 105)
    axes[0].axhline(50, color="black", lw=0.7, ls=":")
    for ax in axes[1:]:
        for chance in sorted(set(data["chance"])):
            ax.axhline(chance, color="black", lw=0.8, ls=":")
    axes[2].plot([], [], "k:", lw=0.8, label="chance 1/H (Λ, own-best)")
    axes[1].set_ylabel("Λ")
    axes[1].set_ylim(0, max(0.5, float(np.nanmax(data["lambda_score"].to_numpy(float))) * 1.2))
    axes[2].set_ylabel("fraction / P(T_h)")
    axes[2].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8, frameon=False, loc="lower right")
    axes[2].legend(fontsize=7, frameon=False, loc="upper left")
    fig.suptitle("Figure 6a–c — when lanes and V self-alignment form (shaded: steps "
                 "4,096–16,384 of 65,536, as fractions of training)", fontsize=11)  # fmt: skip
    return fig


FIGURES.update({"figure6abc": (figure6abc_data, figure6abc)})

# --------------------------------------------------------------------------- atlas (docs §10.6)
from matplotlib.colors import LogNorm  # noqa: E402

from headgeom.paper.tables import ATLAS_COLUMNS, BLOCK_ORDER  # noqa: E402

ATLAS_ABLATIONS = ("zero", "mean")
CONSTANT_PART_AREA = 320.0  # marker area (points²) of a constant part of 1


def ablation_atlas_data(inputs: Inputs) -> pd.DataFrame:
    """The atlas rows (model, seed, block, layer, head, ablation, KL, constant part, size, …)
    with run labels and the figure's column of each block (attn, mlp, H0, H1, …)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_atlas"))
    atlas = read_kind(need_kind(inputs, "atlas", "ablation_atlas"), ATLAS_COLUMNS,
                      "ablation_atlas")  # fmt: skip
    frame = with_runs(atlas[ATLAS_COLUMNS].rename(columns={"label": "block_label"}), runs,
                      "ablation_atlas")  # fmt: skip
    frame["column"] = [
        "H" + str(int(h)) if b == "head" else b
        for b, h in zip(frame["block"], frame["head"], strict=True)
    ]
    frame["_b"] = frame["block"].map(BLOCK_ORDER)
    frame = frame.sort_values(["order", "layer", "_b", "head", "ablation"], kind="stable")
    return frame.drop(columns=["_b", "label_repository"]).reset_index(drop=True)


def ablation_atlas(data: pd.DataFrame) -> Figure:
    """Layers × blocks per model, zero ablation beside mean ablation: colour = KL(original ‖
    edited) in nats (log scale, shared), circle area ∝ the write's constant part (the
    largest circle, of area :data:`CONSTANT_PART_AREA`: a fixed bias)."""
    runs = list(dict.fromkeys(zip(data["model"], data["seed"], strict=True)))
    kl = data["kl"][data["kl"] > 0]
    norm = LogNorm(vmin=max(float(kl.min()), float(kl.max()) * 1e-4), vmax=float(kl.max()))
    fig = Figure(figsize=(9.0, 1.0 + 1.9 * len(runs)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(runs), 2, squeeze=False))
    image = None
    for row, (model, seed) in enumerate(runs):
        rows = data[(data["model"] == model) & (data["seed"] == seed)]
        columns = list(dict.fromkeys(rows["column"]))
        n_layer = int(rows["layer"].max()) + 1
        for col, ablation in enumerate(ATLAS_ABLATIONS):
            ax = axes[row, col]
            part = rows[rows["ablation"] == ablation]
            grid = np.full((n_layer, len(columns)), np.nan)
            const = np.full_like(grid, np.nan)
            x = part["column"].map({c: i for i, c in enumerate(columns)}).to_numpy()
            grid[part["layer"].to_numpy(), x] = part["kl"].clip(lower=norm.vmin).to_numpy()
            const[part["layer"].to_numpy(), x] = part["constant_part"].to_numpy()
            image = ax.imshow(grid, cmap="viridis", norm=norm, aspect="auto", origin="lower")
            li, ci = np.nonzero(np.nan_to_num(const) > 0)
            ax.scatter(ci, li, s=CONSTANT_PART_AREA * const[li, ci], facecolors="none",
                       edgecolors="white", linewidths=1.2)  # fmt: skip
            ax.set_xticks(range(len(columns)), columns, fontsize=7)
            ax.set_yticks(range(n_layer), [f"L{i}" for i in range(n_layer)], fontsize=7)
            label = rows["label"].iloc[0]
            ax.set_title(f"{label} s{seed}: {ablation} ablation", fontsize=8)
            if len(columns) > 2:
                ax.axvline(1.5, color="white", linewidth=0.8)  # blocks | heads
    fig.colorbar(image, ax=axes, shrink=0.6, label="KL(original ‖ edited), nats")
    fig.suptitle(
        "Block ablation atlas: KL on held-out validation text; circle area = constant part "
        "‖mean w‖²/mean‖w‖²",
        fontsize=9,
    )
    return fig


FIGURES.update({"ablation_atlas": (ablation_atlas_data, ablation_atlas)})

# ------------------------------------------------------------------- coordinate shares (docs §15.2)
from headgeom.paper.tables import _SITE_TITLES, COORDINATES_COLUMNS  # noqa: E402

DIRECTION_COLUMNS = results.COORDINATE_DIRECTIONS.columns(
    "model", "seed", "task", "site", "direction", "drop_evaluation", "rank_validation"
)
CURVE_RANKS = 50  # directions drawn per curve (the selected k = 10 and what follows)


def coordinate_shares_data(inputs: Inputs) -> pd.DataFrame:
    """Per run, task and site, directions in validation-rank order with the cumulative
    evaluation share Σ_{rank ≤ r} drop_evaluation / Σ positive drop_evaluation (r ≤
    :data:`CURVE_RANKS`), the run's selected share (r = k) and its matched-null p95."""
    runs = read_runs(need_kind(inputs, "runs", "coordinate_shares"))
    per = read_kind(need_kind(inputs, "directions", "coordinate_shares"), DIRECTION_COLUMNS,
                    "coordinate_shares")  # fmt: skip
    summary = read_kind(need_kind(inputs, "coordinates", "coordinate_shares"),
                        COORDINATES_COLUMNS, "coordinate_shares")  # fmt: skip
    keys = ["model", "seed", "task", "site"]
    per = per.sort_values([*keys, "rank_validation"], kind="stable")
    positive = per["drop_evaluation"].clip(lower=0).groupby([per[k] for k in keys]).transform("sum")
    per["cumulative_share"] = per.groupby(keys)["drop_evaluation"].cumsum() / positive
    per = per[per["rank_validation"] <= CURVE_RANKS]
    frame = per.merge(summary[[*keys, "share_evaluation", "null_p95"]], on=keys, how="left",
                      validate="many_to_one")  # fmt: skip
    frame = with_runs(frame, runs, "coordinate_shares")
    return (
        frame.drop(columns=["label_repository"])
        .sort_values(["order", "seed", "task", "site", "rank_validation"], kind="stable")
        .reset_index(drop=True)
    )


def coordinate_shares(data: pd.DataFrame) -> Figure:
    """One panel per (task, site): cumulative evaluation share of the directions taken in
    validation order, one line per run; the dotted line is k = 10, where the selected
    share (dot) meets its magnitude-matched random sets' 95th percentile (×). One y scale
    per task (a share far outside 0..1 means the evaluation drops are mostly negative)."""
    tasks = [t for t in TASK_ORDER if t in set(data["task"])]
    sites = [s for s in _SITE_TITLES if s in set(data["site"])]
    fig = Figure(figsize=(3.4 * len(sites), 0.6 + 2.8 * len(tasks)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(tasks), len(sites), squeeze=False, sharey="row"))
    runs = list(dict.fromkeys(zip(data["label"], data["seed"], strict=True)))
    colours = dict(zip(runs, sns.color_palette("colorblind", len(runs)), strict=False))
    k = 10
    for r, task in enumerate(tasks):
        for c, site_name in enumerate(sites):
            ax = axes[r, c]
            part = data[(data["task"] == task) & (data["site"] == site_name)]
            for (label, seed), rows in part.groupby(["label", "seed"], sort=False):
                colour = colours[(label, seed)]
                ax.plot(rows["rank_validation"], rows["cumulative_share"], color=colour,
                        lw=1.2, label=f"{label} s{seed}")  # fmt: skip
                ax.plot(k, rows["share_evaluation"].iloc[0], "o", color=colour, ms=4)
                ax.plot(k, rows["null_p95"].iloc[0], "x", color=colour, ms=5)
            ax.axvline(k, color="black", lw=0.8, ls=":")
            ax.axhline(1.0, color="grey", lw=0.6)  # every positive drop
            ax.axhline(0.0, color="grey", lw=0.6)
            ax.set_xscale("log")
            ax.set_title(f"{TASK_TITLES.get(task, task)}: {_SITE_TITLES[site_name]}", fontsize=9)
            ax.set_xlabel("directions, by validation drop")
            if c == 0:
                ax.set_ylabel("cumulative evaluation share")
    axes[0, -1].plot([], [], "ko", ms=4, label="selected top 10")
    axes[0, -1].plot([], [], "kx", ms=5, label="matched random, p95")
    axes[0, -1].legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle("Coordinate concentration (App. B.2): share of the positive evaluation drop "
                 "in the directions chosen on validation", fontsize=10)  # fmt: skip
    return fig


FIGURES.update({"coordinate_shares": (coordinate_shares_data, coordinate_shares)})
