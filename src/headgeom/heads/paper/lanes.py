"""§5.3 Lanes: whether same-index heads act together (docs §13.1).

* ``lanes``: lane score Λ with its permutation p-value, Bonferroni-corrected over tasks;
  runs beyond the paper's Λ runs are marked extra.
* ``lane_heads``: the top-3 heads by discovery effect and whether they share an index.
* Figure 5: per-head effect heat maps (asinh colour scale) with Λ and the largest drop.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.colors import AsinhNorm
from matplotlib.figure import Figure
from matplotlib.patches import Circle

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.analysis.effects import effect_matrix
from headgeom.heads.analysis.stats import concentration
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.plotting import heatmap_ticks, single_value
from headgeom.render import Block, Table, cell_frame, fixed, format_p, formatter


def lanes(inputs: Inputs) -> Table:
    """Lane score Λ with its permutation p, Bonferroni ×3 within each model (docs §10.5);
    runs beyond the paper's Λ runs (``selections.LAMBDA_PAPER_RUNS``, docs §13.1) are marked
    extra (``paper_lambda`` false)."""
    cols = results.LANES.columns(
        "model", "seed", "task", "split", "lambda_score", "chance", "p_value"
    )
    runs = read_runs(need_kind(inputs, "runs", "lanes"))
    frame = read_kind(
        need_kind(inputs, "lanes", "lanes"),
        [*cols, *results.LANES.columns("n_permutations")],
        "lanes",
    )
    frame = with_runs(frame, runs, "lanes").sort_values(["order"], kind="stable")
    n_tasks = frame.groupby(["model", "seed"])["task"].transform("nunique")
    frame["p_bonferroni"] = np.minimum(1.0, frame["p_value"] * n_tasks)
    paper = selections.lambda_paper_runs(selections.models_of_runs(runs))
    frame["paper_lambda"] = [
        (m, int(s)) in paper for m, s in zip(frame["model"], frame["seed"], strict=True)
    ]
    frame = frame[[*cols, "p_bonferroni", "n_permutations", "paper_lambda"]]
    fmt_p = formatter("{:.4f}")
    cells = cell_frame(
        frame,
        {
            "model": ("Model", str),
            "seed": ("Seed", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "lambda_score": ("Λ", formatter("{:.3f}", missing="undefined")),
            "chance": ("Chance", lambda v: f"{v:.3f}"),
            "p_value": ("p", fmt_p),
            "p_bonferroni": ("p (Bonferroni ×3)", fmt_p),
            "paper_lambda": ("Run", lambda v: "paper" if v else "extra"),
        },
    )
    split = ", ".join(sorted(set(frame["split"])))
    n_extra = frame.loc[~frame["paper_lambda"], ["model", "seed"]].drop_duplicates().shape[0]
    caption = (
        f"Lane score Λ ({split} split): fraction of cross-layer positive effect mass in "
        f"same-index pairs, with the within-layer permutation p (upper) and its Bonferroni "
        f"correction over each model's tasks. Run: paper = one of the paper's Λ runs (docs "
        f"§13.1); extra = computed beyond them ({n_extra} run{'' if n_extra == 1 else 's'})."
    )
    return Table("lanes", frame.reset_index(drop=True), [Block(cells)], caption)


def lane_heads(inputs: Inputs) -> Table:
    """Lanes in full (docs §13.1): per run and task, the top-3 heads by discovery effect,
    whether their evaluation effects are positive, and whether two share a head index
    (the SVA index-repetition test, paper: every write-common-axis variant yes, every
    learned model no)."""
    runs = read_runs(need_kind(inputs, "runs", "lane_heads"))
    cols = results.HEADS.columns("model", "seed", "task", "split", "layer", "head", "e")
    heads = read_kind(need_kind(inputs, "heads", "lane_heads"), cols, "lane_heads")
    rows = []
    for (model, seed, task), group in heads.groupby(["model", "seed", "task"], sort=False):
        disc = group[group["split"] == "discovery"]
        ev = group[group["split"] == "evaluation"]
        if disc.empty or ev.empty:
            raise ValueError(f"lane_heads: {model} s{seed} {task} needs discovery and evaluation")
        top = disc.sort_values(["e", "layer", "head"], ascending=[False, True, True]).head(3)
        e_eval = ev.set_index(["layer", "head"])["e"]
        top_heads = list(zip(top["layer"], top["head"], strict=True))
        confirmed = [e_eval[key] > 0 for key in top_heads]
        rows.append({
            "model": model, "seed": int(seed), "task": task,
            "top3_discovery": ", ".join(f"L{a}H{b}" for a, b in top_heads),
            "n_positive_on_evaluation": int(sum(confirmed)),
            "index_repeats": bool(top["head"].duplicated().any()),
        })  # fmt: skip
    frame = with_runs(pd.DataFrame(rows), runs, "lane_heads").sort_values(["order", "task"])
    frame["task"] = pd.Categorical(frame["task"], TASK_ORDER)
    frame = frame.sort_values(["order", "task"]).drop(columns=["order", "label_repository"])
    total, positive = 3 * len(frame), int(frame["n_positive_on_evaluation"].sum())
    cells = cell_frame(
        frame,
        {
            "label": ("Model", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "top3_discovery": ("Top-3 heads (discovery)", str),
            "n_positive_on_evaluation": ("Positive on evaluation", lambda n: f"{n}/3"),
            "index_repeats": ("Index repeats", lambda b: "yes" if b else "no"),
        },
    )
    caption = (
        f"Top-3 heads by discovery effect (docs §13.1): {positive} of {total} are positive on "
        "the evaluation split (paper: all 15); index repeats = two of them share a head index "
        "(paper, SVA: every write-common-axis variant yes, every learned model no)."
    )
    return Table("lane_heads", frame.reset_index(drop=True), [Block(cells)], caption)


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
    split = single_value(lanes["split"], "the lanes' split")
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
            heatmap_ticks(ax, n_layer, n_head)
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
    split = single_value(data["split"], "split")
    fig.suptitle(
        f"Figure 5 — per-head patch effects e_(l,h) ({split} split); ○ largest drop (max e)",
        fontsize=11,
    )
    return fig


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
