"""The AtP-vs-exact figure of one run (rule atp_agreement, ``atp/<m>/s<seed>/agreement.png``):
one panel per task, every head's AtP mean effect against its exact one, with the rank
correlation and the top-k overlap of that task's agreement row
(:mod:`headgeom.heads.analysis.atp_agreement`). Not a paper figure: one per run, drawn by the
stage that measures it, from the same frames it writes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from headgeom.heads.paper.inputs import TASK_ORDER, TASK_TITLES

#: [CHOICE] Misses labelled in each panel (the agreement file lists more).
LABELLED_MISSES = 3


def _limits(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """One range for both axes (so the identity is the diagonal), 0 always inside."""
    low = min(0.0, float(np.min(x)), float(np.min(y)))
    high = max(0.0, float(np.max(x)), float(np.max(y)))
    pad = 0.08 * (high - low) if high > low else 1.0
    return low - pad, high + pad


def agreement_figure(heads: pd.DataFrame, agreement: pd.DataFrame, title: str) -> Figure:
    """Scatter of ``effect_atp`` against ``effect_exact`` per task (``heads``: the atp_heads
    rows of every task of one run; ``agreement``: their atp_agreement rows), the exact top-k
    filled, AtP's top-k ringed, the largest misses labelled, ρ and the overlap in a corner."""
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of a job's start

    tasks = [t for t in TASK_ORDER if t in set(heads["task"])]
    if not tasks:
        raise ValueError("no per-head rows to draw")
    fig = Figure(figsize=(0.4 + 3.3 * len(tasks), 4.1), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    colour = sns.color_palette("colorblind", 4)
    for ax, task in zip(axes, tasks, strict=True):
        rows = heads[heads["task"] == task]
        row = agreement[agreement["task"] == task].iloc[0]
        x, y = rows["effect_exact"].to_numpy(float), rows["effect_atp"].to_numpy(float)
        low, high = _limits(x, y)
        ax.plot([low, high], [low, high], color="0.55", lw=0.8, ls="--", zorder=1)
        ax.axhline(0, color="0.85", lw=0.6, zorder=0)
        ax.axvline(0, color="0.85", lw=0.6, zorder=0)
        top = rows["top_exact"].to_numpy(bool)
        k = int(row["top_k"])
        if (~top).any():
            ax.scatter(x[~top], y[~top], s=12, color="0.6", lw=0, zorder=2, label="other heads")
        ax.scatter(x[top], y[top], s=22, color=colour[0], lw=0, zorder=3,
                   label=f"exact top-{k}")  # fmt: skip
        ring = rows["top_atp"].to_numpy(bool)
        ax.scatter(x[ring], y[ring], s=60, facecolors="none", edgecolors=colour[3], lw=0.9,
                   zorder=4, label=f"AtP top-{k}")  # fmt: skip
        labelled = list(zip(row["miss_layer"], row["miss_head"], row["miss_exact"],
                            row["miss_atp"], strict=True))[:LABELLED_MISSES]  # fmt: skip
        for layer, head, ex, at in labelled:
            right = ex > (low + high) / 2  # label inwards, so it stays inside the panel
            ax.annotate(f"L{layer}.H{head}", (ex, at), xytext=(-4 if right else 4, -9),
                        textcoords="offset points", ha="right" if right else "left",
                        fontsize=6.5, color="0.2")  # fmt: skip
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.set_aspect("equal", adjustable="box")
        rho = row["spearman_rho"]
        tie = " (tie at k)" if row["top_k_boundary_tie"] else ""
        text = (
            f"ρ = {rho:.2f}" if pd.notna(rho) else "ρ undefined",
            f"top-{k} overlap {round(row['top_k_overlap'] * k)}/{k}{tie}",
            f"n = {int(row['n_examples'])} examples",
        )
        box = {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.8"}
        ax.text(0.03, 0.97, "\n".join(text), transform=ax.transAxes, va="top", ha="left",
                fontsize=7.5, bbox=box)  # fmt: skip
        ax.set_title(TASK_TITLES.get(task, task), fontsize=9)
        ax.set_xlabel("exact mean drop e (logits)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("AtP mean drop e (logits)", fontsize=8)
    handles, labels = axes[-1].get_legend_handles_labels()
    # below the panels: inside one it would cover a labelled miss
    fig.legend(handles, labels, fontsize=7, frameon=False, loc="outside lower center", ncols=3)
    split = agreement["split"].iloc[0]
    fig.suptitle(f"{title}: AtP vs exact head patching, {split} split", fontsize=9)
    return fig
