"""§5.1 Exclusivity: how much of a head's patch perturbation reaches later readers
(docs §11.3–11.4).

* ``leakage``: L, L/ρ against the isotropic expectation ρ and Spearman(L, ρ) per model and
  read type.
* Figure 2: L against ρ per source–reader pair, the top pairs marked.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads.analysis.stats import spearman
from headgeom.heads.paper.inputs import Inputs, need_kind, read_kind, read_runs
from headgeom.render import Block, Table, cell_frame


def leakage(inputs: Inputs) -> Table:
    """Leakage summaries per model, seed and read type, pooled over tasks (docs §11.3):
    median L (fraction of perturbation energy), median L/ρ and Spearman(L, ρ) across
    source–reader pairs."""
    cols = results.LEAKAGE.columns(
        "model", "seed", "read_type", "leakage", "rho", "leakage_over_rho"
    )
    frame = read_kind(need_kind(inputs, "leakage", "leakage"), cols, "leakage")
    frame = frame.dropna(subset=["leakage", "rho"])
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
                "spearman_leakage_rho": spearman(group["leakage"], group["rho"])[0],
            }
        )
    out = pd.DataFrame(rows)
    cells = cell_frame(
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
    caption = (
        "Leakage L of real patch perturbations into later readers against the isotropic "
        "expectation ρ, pooled over tasks: medians and rank correlation across "
        "source–reader pairs."
    )
    return Table("leakage", out, [Block(cells)], caption)


FIGURE2_COLUMNS = [
    "model", "seed", "corpus", "task", "source", "reader", "X", "L", "rho",
    "is_top_pair", "percentile_all_later", "percentile_same_layer",
]  # fmt: skip


X_COLOURS = {"Q": "#1f77b4", "K": "#2ca02c", "V": "#d62728"}


def figure2_data(inputs: Inputs) -> pd.DataFrame:
    """Every source → later reader pair (L, ρ, the two percentiles of L) of every leakage
    run and task, flagged where it is one of the evaluation-selected top pairs (docs §11.4,
    §17.2 Figure 2)."""
    from headgeom.heads.analysis.exclusivity import add_percentiles  # scipy.stats: ~1 s

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
