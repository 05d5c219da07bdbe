"""Appendix B.2: coordinate concentration (docs §15.2): the top-10 single-direction share
of the evaluation drop after W_O, before W_O and before W_O after a within-head Haar
rotation (table), and the share curves over ranked directions (figure).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.paper import references
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.render import Block, Table, value_range


def coordinates_paper() -> dict[tuple[str, str], str]:
    """The paper's top-10 shares (docs §15.2, §20.6) per (group, site), SVA: the comparison's
    ``coordinate_share`` records of references.yaml (one model group each)."""
    return {
        (entry.args["groups"][0], entry.args["site"]): entry.paper
        for entry in references.references()
        if entry.recipe == "coordinate_share" and entry.args.get("task", "sva") == "sva"
    }


COORDINATES_COLUMNS = results.COORDINATES.columns(
    "model", "seed", "task", "site", "best_layer", "best_head", "share_evaluation",
    "share_in_sample", "null_p95", "beats_every_random_set",
)  # fmt: skip


_SITE_TITLES = {"after_wo": "after W_O", "before_wo": "before W_O",
                "before_wo_rotated": "before W_O, Haar-rotated"}  # fmt: skip


def coordinates_table(inputs: Inputs) -> Table:
    """Top-10 single-direction shares (docs §15.2, paper App. B.2): one row per model group
    and task, a column per site (range over the group's runs, evaluation split, directions
    selected on validation), the paper's SVA value in brackets; and how often the selected
    set beats every magnitude-matched random set."""
    runs = read_runs(need_kind(inputs, "runs", "coordinates"))
    frame = read_kind(need_kind(inputs, "coordinates", "coordinates"), COORDINATES_COLUMNS,
                      "coordinates")  # fmt: skip
    tidy = frame.merge(runs[["model", "seed", "geometry"]], on=["model", "seed"])
    tidy["group"] = tidy["geometry"].map(selections.COORDINATE_GROUPS).fillna(tidy["geometry"])
    rows, paper = [], coordinates_paper()
    groups = list(dict.fromkeys([*selections.COORDINATE_GROUPS.values(), *tidy["group"]]))
    for task in [t for t in TASK_ORDER if t in set(tidy["task"])]:
        for group in groups:
            part = tidy[(tidy["group"] == group) & (tidy["task"] == task)]
            if part.empty:
                continue
            n = part[["model", "seed"]].drop_duplicates().shape[0]
            row = {"Task": task, "Model group": f"{group} ({n} run{'s' if n > 1 else ''})"}
            for site, title in _SITE_TITLES.items():
                shares = part.loc[part["site"] == site, "share_evaluation"]
                cell = value_range(shares, "{:.0f}", scale=100, unit="%")
                ref = paper.get((group, site)) if task == "sva" else None
                row[title] = f"{cell} [{ref}]" if ref else cell
            after = part[part["site"] == "after_wo"]
            row["after W_O beats every random set"] = (
                f"{int(after['beats_every_random_set'].sum())}/{len(after)}"
            )
            rows.append(row)
    caption = (
        "Coordinate concentration (paper App. B.2). Top-10 share of single-direction effects "
        "at the best head's layer and the final position: the evaluation-split drops of the 10 "
        "directions with the largest validation drop over the sum of all positive evaluation "
        "drops; after W_O one residual coordinate of the layer's attention output, before W_O "
        "one coordinate of a head's z, and after a Haar-random rotation of each head's basis. "
        "Ranges over the runs of each row, the paper's SVA value in brackets; the last column "
        "counts runs whose selected set beats every one of the magnitude-decile-matched random "
        "sets, drawn without the selected directions (p = 1/(1 + n_random_sets))."
    )
    return Table("coordinates", tidy, [Block(pd.DataFrame(rows))], caption)


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
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of every table job's start

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
