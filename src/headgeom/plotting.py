"""What every paper figure shares (docs §17.2): figures are built on
``matplotlib.figure.Figure`` directly (Agg canvas, no pyplot state) and saved
deterministically: no date in the SVG, fixed SVG id salt.

Each figure is a data builder (Parquet paths → the tidy frame that is plotted, also written
as the figure's CSV source data) and a drawing function (frame → ``Figure``), both named by
its record in its section module.
"""

from __future__ import annotations

import math
import os

import matplotlib
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headgeom.io import atomic_path

MASK_COLOUR = "#d9d9d9"


def model_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["model"]))


def single_value(values: pd.Series, what: str):
    """The one value a column takes (None if empty); several values are an error."""
    unique = pd.unique(values)
    if len(unique) > 1:
        raise ValueError(f"inputs disagree on {what}: {sorted(unique)}")
    return unique[0] if len(unique) else None


#: Label offsets (points) tried in turn, so that neighbouring labels do not overlap.
_LABEL_OFFSETS = [(5, 4, "left"), (5, -11, "left"), (-5, 4, "right"), (-5, -11, "right")]


_LABEL_OFFSETS += [(5, 15, "left"), (5, -22, "left"), (-5, 15, "right"), (-5, -22, "right")]


def place_labels(fig: Figure, ax, xs, ys, labels) -> None:
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


def heatmap_ticks(ax, n_layer: int, n_head: int) -> None:
    step_h, step_l = max(1, math.ceil(n_head / 12)), max(1, math.ceil(n_layer / 12))
    ax.set_xticks(range(0, n_head, step_h))
    ax.set_yticks(range(0, n_layer, step_l))
    ax.tick_params(labelsize=7, length=2)


def save_figure(fig: Figure, path: str | os.PathLike, fmt: str) -> None:
    """Write ``fig`` atomically as ``fmt`` (png or svg) with deterministic bytes."""
    metadata = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.hashsalt": "headgeom", "svg.fonttype": "none"}):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)
