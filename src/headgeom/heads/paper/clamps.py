"""§5.3 Lanes, clamped (docs §13.3, §15.3; App. B.3): single-head, later-MLP and lumped
lane clamp reductions and the path decomposition of a head's effect (direct, via MLPs,
via later attention).

* ``clamps``: the reductions and path shares beside the paper's values.
* Figure 6d–e: pair clamp reductions, same index against other indices.
* Figure 8: the path decomposition per model, orders A and B.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads.paper import references
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    need_kind,
    optional_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.model import facts
from headgeom.render import Block, Table, value_range

CLAMP_PAIR_COLUMNS = results.CLAMP_PAIRS.columns(
    "model", "seed", "task", "source_layer", "source_head", "later_layer", "later_head",
    "same_index", "e_unclamped", "reduction_head", "reduction_mlps",
)  # fmt: skip


CLAMP_PATH_COLUMNS = results.CLAMP_PATHS.columns(
    "model", "seed", "task", "rank", "layer", "head", "delta_none", "direct", "via_mlps_a",
    "via_attention_a", "via_attention_b", "via_mlps_b", "interaction",
)  # fmt: skip


CLAMP_LUMPED_COLUMNS = results.CLAMP_LUMPED.columns(
    "model", "seed", "task", "index_shift", "same_index", "sources", "reduction"
)


def path_shares(paths: pd.DataFrame) -> dict[str, float]:
    """Shares of Δ(∅) over head–task cases (docs §15.3): Σ part / Σ Δ(∅), both orders, and
    the interaction statistics (|I| relative to each case's |Δ(∅)|)."""
    total = paths["delta_none"].sum()
    rel = (paths["interaction"].abs() / paths["delta_none"].abs()).replace(np.inf, np.nan)
    return {
        "n_cases": len(paths),
        "total": total,
        "direct_share": paths["direct"].sum() / total,
        "mlp_share_a": paths["via_mlps_a"].sum() / total,
        "attention_share_a": paths["via_attention_a"].sum() / total,
        "mlp_share_b": paths["via_mlps_b"].sum() / total,
        "attention_share_b": paths["via_attention_b"].sum() / total,
        "interaction_median_rel": float(rel.median()),
        "interaction_signed_share": paths["interaction"].sum() / total,
        "interaction_abs_share": paths["interaction"].abs().sum() / total,
        "interaction_over_20pct": int((rel > 0.2).sum()),
        "interaction_over_50pct": int((rel > 0.5).sum()),
        "interaction_max_rel": float(rel.max()),
    }


def _percents(values: pd.Series) -> str:
    """'a% to b%' (this table prints both ends even when they agree)."""
    return value_range(values, "{:.1f}%", " to ", scale=100, collapse=False)


#: path_shares keys of the paper's per-model shares (docs §15.3): order A, order B, direct.
SHARE_KEYS = ("mlp_share_a", "mlp_share_b", "direct_share")


def _paper_shares(geometry: str, corpus: str) -> str:
    """'a / b; direct c': the paper's MLP shares (orders A, B) and direct share of a model."""
    a, b, direct = (references.text(f"paths.{geometry}.{corpus}.{key}") for key in SHARE_KEYS)
    return f"{a} / {b}; direct {direct}"


def _percent_range(key: str) -> str:
    """A paper range of percentages as the clamps table prints it: 'a–b%' as 'a% to b%'."""
    low, high = references.text(key).removesuffix("%").split("–")
    return f"{low}% to {high}%"


def clamps_table(inputs: Inputs) -> Table:
    """The §13.3 clamp tests and §15.3 decomposition summaries beside the paper's values."""
    runs = read_runs(need_kind(inputs, "runs", "clamps"))
    geometry = runs.set_index(["model", "seed"])["geometry"]
    rows = []

    def add(section, quantity, value, paper, models="all"):
        rows.append({"section": section, "quantity": quantity, "models": models,
                     "value": value, "paper": paper})  # fmt: skip

    pairs = optional_kind(inputs, "pairs", CLAMP_PAIR_COLUMNS)
    if pairs is not None and len(pairs):
        keys = zip(pairs["model"], pairs["seed"], strict=True)
        learned = [facts.is_baseline(geometry[key]) for key in keys]
        pairs = pairs.assign(learned=learned)
        same = pairs[pairs["same_index"]]
        add(
            "§13.3 (d)",
            "same-index pairs: reduction",
            _percents(same["reduction_head"]),
            references.text("clamps.same-index"),
            f"{len(same)} pairs",
        )
        diff = pairs[~pairs["same_index"]]
        add(
            "§13.3 (d)",
            "different-index pairs: reduction",
            _percents(diff["reduction_head"]),
            references.text("clamps.different-index"),
            f"{len(diff)} pairs",
        )
        sources = pairs.drop_duplicates(["model", "seed", "task", "source_layer", "source_head"])
        add(
            "§13.3 (e)",
            "later-MLP clamp: reduction, frozen-write models",
            _percents(sources.loc[~sources["learned"], "reduction_mlps"]),
            _percent_range("clamps.mlps-frozen"),
        )
        add(
            "§13.3 (e)",
            "later-MLP clamp: reduction, learned",
            _percents(sources.loc[sources["learned"], "reduction_mlps"]),
            _percent_range("clamps.mlps-learned"),
        )
    lumped = optional_kind(inputs, "lumped", CLAMP_LUMPED_COLUMNS, empty=True)
    paper = references.text
    paper_lumped = {
        "sva": f"{paper('lumped.sva.same')} (others {paper('lumped.sva.other')})",
        "quote": paper("lumped.quote.same"),
        "plural": paper("lumped.plural.same"),
    }
    for (model, seed, task), group in lumped.groupby(["model", "seed", "task"], sort=False):
        own = group.loc[group["same_index"], "reduction"].iloc[0]
        other = group.loc[~group["same_index"], "reduction"].mean()
        add(
            "§13.3 lumped",
            f"{TASK_TITLES.get(task, task)}: same index (other indices)",
            f"{100 * own:.1f}% ({100 * other:.1f}%)",
            paper_lumped.get(task, ""),
            f"{model} s{seed}",
        )
    paths = optional_kind(inputs, "paths", CLAMP_PATH_COLUMNS, empty=True)
    learned_s = [paper(f"paths.learned.S.{key}") for key in SHARE_KEYS]
    paper_shares = {
        "learned": f"learned R {_paper_shares('learned', 'R')} "
        f"(S: {learned_s[0]} / {learned_s[1]}; {learned_s[2]})",
        "learned-r": _paper_shares("learned", "R"),
        "learned-s": _paper_shares("learned", "S"),
        "write-common-axis": _paper_shares("write-common-axis", "R"),
    }
    for model, group in paths.groupby("model", sort=False):
        s = path_shares(group)
        add(
            "§15.3 both orders",
            "MLP share order A / order B; direct share",
            f"{s['mlp_share_a']:.2f} / {s['mlp_share_b']:.2f}; direct {s['direct_share']:.2f}",
            paper_shares.get(model, ""),
            f"{model} ({s['n_cases']} cases)",
        )
    if len(paths):
        s = path_shares(paths)
        add(
            "§15.3 interaction",
            "median |I| / |Δ(∅)|",
            f"{100 * s['interaction_median_rel']:.1f}%",
            paper("interaction.median_rel"),
            f"{s['n_cases']} cases",
        )
        add(
            "§15.3 interaction",
            "Σ I / Σ Δ(∅), signed (absolute)",
            f"{100 * s['interaction_signed_share']:.1f}% ({100 * s['interaction_abs_share']:.1f}%)",
            f"{paper('interaction.signed_share')} ({paper('interaction.abs_share')})",
        )
        add(
            "§15.3 interaction",
            "cases with |I| > 20% / > 50% of Δ(∅); max",
            f"{s['interaction_over_20pct']} / {s['interaction_over_50pct']}; "
            f"{100 * s['interaction_max_rel']:.0f}%",
            f"{paper('interaction.over_20_50')}; {paper('interaction.max_rel')}",
        )
    frame = pd.DataFrame(rows, columns=["section", "quantity", "models", "value", "paper"])
    cells = frame.rename(columns=str.capitalize)
    caption = (
        "Clamp tests (docs §13.3) and the two-order path decomposition (§15.3) on the "
        "evaluation split: reductions r = (e − e_clamped)/e of top heads' effects, and shares "
        "of Σ Δ(∅) over head–task cases (order A releases the MLP clamp first)."
    )
    return Table("clamps", frame, [Block(cells)], caption)


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
