"""§5.2 Concentration against loss (docs §12.7): Figure 4, validation loss against the
geometric-mean N_eff over tasks per model, with Spearman's ρ over all models and over those
with the base architecture's heads per layer (the figure's and the comparison's one number).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads.analysis.stats import spearman
from headgeom.heads.paper.inputs import (
    Inputs,
    need_kind,
    read_kind,
)
from headgeom.model import facts
from headgeom.plotting import place_labels

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
        # NaN with fewer than 3 points or a constant variable
        rho, _ = spearman(rows["val_loss"], rows["N_eff_geomean"])
        out[name] = (rho, len(rows))
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
            facecolors="none" if flagged else ("#4c72b0" if reader == facts.FREE else "#dd8452"),
            edgecolors="#4c72b0" if reader == facts.FREE else "#dd8452",
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
    place_labels(fig, ax, data["val_loss"], data["N_eff_geomean"], data["label"])
    return fig
