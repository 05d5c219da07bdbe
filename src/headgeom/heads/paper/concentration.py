"""§5.2 Concentration: how many heads carry a task's patching effect (docs §12.1–12.4).

* Table 3: ``N_eff = N_index × N_layer|index`` per model and task, the index-level
  permutation null, N_eff from per-example absolute effects and the pairs whose order
  reverses under them.
* Table 6: N_eff and E on the evaluation split for the paper's rows; ``table6_all_runs``
  every run.
* Figure 3: N_eff per configuration and task, seeds as points.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Context,
    Inputs,
    label_runs,
    need_kind,
    read_kind,
    read_runs,
    row_keys,
    split_rows,
    task_columns,
    tidy_order,
    widen,
    with_runs,
)
from headgeom.plotting import single_value
from headgeom.render import Block, Table, format_p, formatter

#: Columns Table 3 reads from the robustness Parquets (coord interface §3).
TABLE3_COLUMNS = results.ROBUSTNESS.columns(
    "model",
    "seed",
    "task",
    "split",
    "N_eff",
    "N_index",
    "N_layer_given_index",
    "index_meaningful",
    "N_index_null_median",
    "N_index_p_lower",
    "n_permutations",
    "N_eff_abs",
)


def decomposition_cell(n_eff: float, n_index: float, n_layer: float) -> str:
    """'N_eff = N_index × N_layer|index', each factor rounded separately (paper Table 3)."""
    if pd.isna(n_index) or pd.isna(n_layer):
        return f"{n_eff:.1f}" if not pd.isna(n_eff) else "—"
    return f"{n_eff:.1f} = {n_index:.1f} × {n_layer:.1f}"


def abs_reversals(tidy: pd.DataFrame) -> pd.DataFrame:
    """Pairs of runs whose N_eff order reverses when p comes from E_x|d(x)| instead of
    |E_x d(x)| (docs §12.3, "reversals of close pairs"), per task: one row per (task, a, b),
    a before b in run order, where (N_eff_a − N_eff_b)(N_eff_abs_a − N_eff_abs_b) < 0 in
    unrounded values (a tie on either side is no reversal)."""
    rows = []
    for task, group in tidy.dropna(subset=["N_eff", "N_eff_abs"]).groupby("task", sort=False):
        runs = list(group.sort_values("order").itertuples(index=False))
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if (a.N_eff - b.N_eff) * (a.N_eff_abs - b.N_eff_abs) < 0:
                    rows.append({
                        "task": task, "label_a": a.label, "label_b": b.label,
                        "order_a": a.order, "order_b": b.order,
                        "N_eff_a": a.N_eff, "N_eff_b": b.N_eff,
                        "N_eff_abs_a": a.N_eff_abs, "N_eff_abs_b": b.N_eff_abs,
                    })  # fmt: skip
    columns = ["task", "label_a", "label_b", "order_a", "order_b", "N_eff_a", "N_eff_b"]
    return pd.DataFrame(rows, columns=[*columns, "N_eff_abs_a", "N_eff_abs_b"])


def _reversal_cell(r) -> str:
    """'9.2 < 10.0 → 24.0 > 21.0': a's value first, as the paper prints a reversal."""

    def sign(x: float, y: float) -> str:
        return "<" if x < y else ">"

    return (
        f"{r.N_eff_a:.1f} {sign(r.N_eff_a, r.N_eff_b)} {r.N_eff_b:.1f} → "
        f"{r.N_eff_abs_a:.1f} {sign(r.N_eff_abs_a, r.N_eff_abs_b)} {r.N_eff_abs_b:.1f}"
    )


def table3(inputs: Inputs) -> Table:
    """N_eff = N_index × N_layer|index per model and task, the index-level permutation null,
    and N_eff from E_x|d(x)| (paper Table 3; docs §10.3–10.4, §12.2–12.3).

    The decomposition and the null are shown only where the head index is comparable across
    layers in the base architecture (``index_meaningful``); elsewhere the cell gives N_eff
    alone."""
    runs = read_runs(need_kind(inputs, "runs", "table3"))
    frame = read_kind(need_kind(inputs, "robustness", "table3"), TABLE3_COLUMNS, "table3")
    splits = sorted(set(frame["split"]))
    if len(splits) != 1:
        raise ValueError(f"table3: robustness rows come from several splits {splits}")
    frame = frame[TABLE3_COLUMNS].copy()
    meaningful = frame["index_meaningful"].astype(bool)
    for col in ("N_index", "N_layer_given_index", "N_index_null_median", "N_index_p_lower"):
        frame.loc[~meaningful, col] = np.nan
    frame["N_eff_abs_ratio"] = frame["N_eff_abs"] / frame["N_eff"]
    tidy = with_runs(frame, runs, "table3")
    values = ["N_eff", "N_index", "N_layer_given_index", "N_index_null_median"]
    values += ["N_index_p_lower", "N_eff_abs"]
    wide = widen(tidy, values)
    keys = row_keys(wide)
    tasks = task_columns(wide, "N_eff")
    for column in ((v, t) for v in values for t in tasks):
        if column not in wide:  # no row's index is meaningful (e.g. pretrained models only)
            wide[column] = np.nan

    def block(render: Callable[[str], list[str]]) -> pd.DataFrame:
        cells = pd.DataFrame({"Model": keys["label"]})
        for task in tasks:
            cells[TASK_TITLES[task]] = render(task)
        return cells

    decomposition = block(
        lambda t: [
            decomposition_cell(*v)
            for v in zip(
                wide[("N_eff", t)],
                wide[("N_index", t)],
                wide[("N_layer_given_index", t)],
                strict=True,
            )
        ]
    )
    null = block(
        lambda t: [
            "—" if pd.isna(n) else f"{n:.1f} vs {m:.1f}, p = {format_p(p)}"
            for n, m, p in zip(
                wide[("N_index", t)],
                wide[("N_index_null_median", t)],
                wide[("N_index_p_lower", t)],
                strict=True,
            )
        ]
    )
    absolute = block(lambda t: [formatter("{:.1f}")(v) for v in wide[("N_eff_abs", t)]])
    reversals = abs_reversals(tidy)
    pairs = reversals.drop_duplicates(["order_a", "order_b"]).sort_values(["order_a", "order_b"])
    pair_keys = list(zip(pairs["order_a"], pairs["order_b"], strict=True))
    names = [f"{a} vs {b}" for a, b in zip(pairs["label_a"], pairs["label_b"], strict=True)]
    flips = pd.DataFrame({"Model": names or ["none"]})
    for task in tasks:
        in_task = reversals[reversals["task"] == task]
        cell = {(r.order_a, r.order_b): _reversal_cell(r) for r in in_task.itertuples()}
        flips[TASK_TITLES[task]] = [cell.get(k, "—") for k in pair_keys] or ["—"]
    # the CSV names, per (run, task), the runs whose order against it reverses
    partners: dict[tuple[int, str], list[str]] = {}
    for r in reversals.itertuples():
        partners.setdefault((r.order_a, r.task), []).append(r.label_b)
        partners.setdefault((r.order_b, r.task), []).append(r.label_a)
    run_tasks = zip(tidy["order"], tidy["task"], strict=True)
    tidy["abs_reversed_with"] = ["; ".join(partners.get(k, [])) for k in run_tasks]
    n_perm = sorted(set(frame.loc[meaningful, "n_permutations"].astype(int)))
    caption = (
        f"Table 3. Head-level N_eff decomposed into effective head indices and effective "
        f"layers within an index, N_eff = N_index × N_layer|index ({splits[0]} split); each "
        f"value rounded separately, so printed factors need not multiply to the printed "
        f"N_eff. Second: N_index against the median of its within-layer index-permutation "
        f"null ({', '.join(map(str, n_perm)) or '—'} draws) with the lower one-sided p "
        f"(uncorrected across models). Third: N_eff with p from E_x|d(x)| instead of "
        f"|E_x d(x)|. Bottom: every pair of rows whose order by N_eff reverses under "
        f"E_x|d(x)| (from unrounded values; A's value first, docs §12.3)."
    )
    blocks = [
        Block(decomposition, "N_eff = N_index × N_layer|index"),
        Block(null, "N_index vs index-permutation null median (lower p)"),
        Block(absolute, "N_eff from E_x|d(x)|"),
        Block(flips, "Reversals, A vs B: N_eff → N_eff from E_x|d(x)|"),
    ]
    return Table("table3", tidy_order(tidy), blocks, caption)


TABLE6_COLUMNS = results.SUMMARY.columns(
    "model", "seed", "task", "split", "N_eff", "E", "top_head_share"
)


def table6_rows(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The runs that are paper Table 6's rows (``selections.TABLE6_ROWS``, docs §6.7), in
    the paper's order (``order`` renumbered), and the paper's names of the rows no run
    fills (by corpus where the study names corpora). The selection is the one the workflow
    reads (``selections.select_models``)."""
    models = selections.models_of_runs(runs)
    chosen = selections.select_models(models, "table6")
    rank = {run: i for i, run in enumerate(chosen)}
    keys = list(zip(runs["model"], runs["seed"], strict=True))
    shown = runs[[k in rank for k in keys]].copy()
    shown["order"] = [rank[k] for k in zip(shown["model"], shown["seed"], strict=True)]
    named = any("corpus" in spec for spec in models.values())
    missing: dict[str, list[str]] = {}  # corpus ("" in a study without corpora) -> rows
    for geometry, corpus, name in selections.TABLE6_ROWS:
        if not any(
            spec["geometry"] == geometry and (not named or spec.get("corpus") == corpus)
            for spec in models.values()
        ):
            missing.setdefault(corpus if named else "", []).append(name)
    text = [f"corpus {c}: {', '.join(rows)}" if c else ", ".join(rows)
            for c, rows in missing.items()]  # fmt: skip
    return label_runs(shown.sort_values("order")), text


def table6(inputs: Inputs, every_run: bool = False) -> Table:
    """N_eff and E per task on the evaluation split (paper Table 6): the paper's 13 rows
    (:func:`table6_rows`: corpus R learned and write-common-axis with their seeds, then the
    corpus-S models), each a run the study has, the paper's rows it lacks in the footnote;
    ``every_run``: every run given, corpus R first, in config order (``table6_all_runs``).
    The top-head share is in the CSV."""
    runs = read_runs(need_kind(inputs, "runs", "table6"))
    frame = split_rows(
        read_kind(need_kind(inputs, "summaries", "table6"), TABLE6_COLUMNS, "table6"),
        "evaluation",
        "table6",
    )
    with_runs(frame, runs, "table6")  # every summary has its training log
    missing: list[str] = []
    if not every_run:
        runs, missing = table6_rows(runs)
        shown = set(zip(runs["model"], runs["seed"], strict=True))
        frame = frame[[k in shown for k in zip(frame["model"], frame["seed"], strict=True)]]
    tidy = with_runs(frame[TABLE6_COLUMNS], runs, "table6")
    wide = widen(tidy, ["N_eff", "E"])
    if every_run:
        corpus_rank = wide.index.get_level_values("corpus").map({"R": 0, "S": 1}).fillna(2)
        wide = wide.iloc[np.lexsort((wide.index.get_level_values("order"), corpus_rank))]
    keys = row_keys(wide)
    cells = pd.DataFrame({"Model": keys["label"], "Corpus": keys["corpus"]})
    groups = [("", 2)]
    for stat in ("N_eff", "E"):
        tasks = task_columns(wide, stat)
        for task in tasks:
            cells[f"{stat} {TASK_TITLES[task]}"] = [f"{v:.1f}" for v in wide[(stat, task)]]
        groups.append((stat, len(tasks)))
    # the group row carries the statistic; titles under it are the tasks
    cells.columns = ["Model", "Corpus"] + [c.split(" ", 1)[1] for c in cells.columns[2:]]
    caption = (
        "Table 6. Effective number of heads N_eff and sum of absolute single-head effects E "
        "(logit units) per task, evaluation split."
    )
    if missing:
        caption += f" The paper's rows not in this study: {'; '.join(missing)}."
    return Table("table6", tidy_order(tidy), [Block(cells)], caption, groups)


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
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of every table job's start

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
    level = single_value(data["ci_level"].dropna(), "ci_level")
    n_boot = single_value(data["n_bootstrap"].dropna(), "n_bootstrap")
    split = single_value(data["split"], "split")
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


def table6_all_runs(inputs: Inputs, context: Context | None = None) -> Table:
    """Table 6 for every run (the paper's rows are ``table6``), corpus R first."""
    table = table6(inputs, every_run=True)
    table.name = "table6_all_runs"
    table.caption = table.caption.replace("Table 6.", "Table 6 (every run, extra view).")
    return table
