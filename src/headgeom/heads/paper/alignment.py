"""§5.4 Self-alignment (docs §14.1, §14.5).

* Figure 7: own-best fraction of V self-alignment per model with the chance line 1/H, and
  ρ_self with its chance d/D (data from ``geometry_stats`` summaries).
* ``scalar_ablation``: the drop when the scalar part s·I of the own-lane value maps is
  removed, against equal-norm Haar-random parts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.plotting import model_order
from headgeom.render import Block, Table, cell_frame, fixed

ABLATION_COLUMNS = results.SCALAR_ABLATION.columns(
    "model", "seed", "task", "split", "edit", "kind", "draw", "layers", "margin_unedited",
    "drop", "haar_seed",
)  # fmt: skip


def scalar_ablation_table(inputs: Inputs) -> Table:
    """Scalar-part ablation (docs §14.5): per (model, task) the drop in evaluation mean LD
    when s·I is removed from the own-lane value maps, against the equal-norm random control
    (mean and range over the Haar draws), and the count of cases where the scalar drop is
    larger (paper: 13 of 15)."""
    runs = read_runs(need_kind(inputs, "runs", "scalar_ablation"))
    frame = read_kind(need_kind(inputs, "scalar_ablation", "scalar_ablation"), ABLATION_COLUMNS,
                      "scalar_ablation")  # fmt: skip
    frame = with_runs(frame[ABLATION_COLUMNS], runs, "scalar_ablation")
    rows = []
    for (order, model, seed, task), grp in frame.groupby(["order", "model", "seed", "task"],
                                                         sort=True):  # fmt: skip
        scalar = grp[grp["kind"] == "scalar"]["drop"]
        random = grp[grp["kind"] == "random"]["drop"]
        rows.append({"order": order, "label": grp["label"].iloc[0], "model": model, "seed": seed,
                     "task": task, "layers": grp["layers"].iloc[0],
                     "margin_unedited": grp["margin_unedited"].iloc[0],
                     "drop_scalar": float(scalar.iloc[0]), "drop_random_mean": float(random.mean()),
                     "drop_random_min": float(random.min()), "drop_random_max": float(random.max()),
                     "n_draws": len(random), "haar_seed": int(grp["haar_seed"].iloc[0]),
                     "scalar_hurts_more": bool(scalar.iloc[0] > random.mean())})  # fmt: skip
    out = pd.DataFrame(rows)
    out = out.assign(_t=out["task"].map({t: i for i, t in enumerate(TASK_ORDER)}))
    out = out.sort_values(["order", "_t"]).drop(columns=["_t", "order"]).reset_index(drop=True)
    cells = cell_frame(out, {
        "label": ("Model", str),
        "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
        "layers": ("Layers", str),
        "margin_unedited": ("Mean LD", lambda v: fixed(v, 3)),
        "drop_scalar": ("Drop, −sI", lambda v: fixed(v, 4)),
        "drop_random_mean": ("Drop, −sR (mean)", lambda v: fixed(v, 4)),
        "drop_random_min": ("−sR min", lambda v: fixed(v, 4)),
        "drop_random_max": ("−sR max", lambda v: fixed(v, 4)),
        "scalar_hurts_more": ("Scalar larger", lambda v: "yes" if v else "no"),
    })  # fmt: skip
    n, k = len(out), int(out["scalar_hurts_more"].sum())
    caption = (
        f"Scalar-part ablation of own-lane value maps (docs §14.5, evaluation split): the "
        f"scalar part s·I hurts more than an equal-norm Haar-random part s·R in {k} of {n} "
        f"cases (paper: 13 of 15); {int(out['n_draws'].max()) if n else 0} draws, seed "
        f"{int(out['haar_seed'].iloc[0]) if n else '—'}."
    )
    return Table("scalar_ablation", out, [Block(cells)], caption)


LAYER_LABELS = {"own_best_fraction": "layers ≥ 1", "own_best_fraction_layer0": "layer 0"}


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
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of every table job's start

    models = model_order(data)
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
