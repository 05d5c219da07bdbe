"""§4 Setup: the models and what they cost (docs §6.1, §17).

* Table 2: the main-text models (write map, readers, corpus, parameters, validation loss,
  Δ vs the learned model on the same corpus); ``table2_all_runs`` every run.
* Table 4: every configuration, its geometry in words and the sections that use it.
* Table 5: clean accuracy and mean logit margin per model and task.
* Figure 1: inter-layer write–write PK heat maps, heads ordered (layer, head), one panel per
  model, same-layer blocks masked (data from ``geometry_stats`` pk Parquets).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.paper.inputs import (
    TASK_TITLES,
    Context,
    Inputs,
    learned_reference,
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
from headgeom.model import facts
from headgeom.plotting import MASK_COLOUR, model_order
from headgeom.render import Block, Table, cell_frame, fixed, formatter

#: Geometry columns Table 2 takes from the geometry_stats summaries (docs §9.4, §14.1).
TABLE2_GEOMETRY_COLUMNS = results.GEOMETRY_SUMMARY.columns(
    "own_best_fraction",
    "rho_self_mean",
    "write_write_pk_same_index_mean",
    "write_write_pk_other_index_mean",
    "prop1_applies",
    "prop1_max_residual",
)


def table2(inputs: Inputs) -> Table:
    """Parameters, validation loss and Δ vs learned (paper Table 2), with the designed
    weight-space geometry of each model (optional input kind ``geometry``).

    Δ = val loss − that of the ``learned`` model on the same corpus (comparisons are only
    ever within a corpus, docs §0) with the same seed when one exists, else the mean over
    that corpus's learned seeds; computed from unrounded losses. Runs without a ``corpus``
    key (the demo) share one corpus.
    """
    runs = read_runs(need_kind(inputs, "runs", "table2"))
    frame = runs[["model", "geometry", "seed", "corpus", "n_params", "val_loss"]].copy()
    frame["delta_vs_learned"] = frame["val_loss"] - learned_reference(frame, "val_loss", [])
    if inputs.get("geometry"):
        geo = read_kind(inputs["geometry"], ["model", "seed", *TABLE2_GEOMETRY_COLUMNS], "table2")
        geo = geo[["model", "seed", *TABLE2_GEOMETRY_COLUMNS]]
        if geo.duplicated(["model", "seed"]).any():
            raise ValueError("table2: more than one geometry summary for a (model, seed)")
        frame = frame.merge(geo, on=["model", "seed"], how="left", validate="one_to_one")
    else:
        frame = frame.assign(**{c: np.nan for c in TABLE2_GEOMETRY_COLUMNS})

    # NaN where Proposition 1 does not apply (no orthogonal write decomposition) or where
    # no geometry summary was given
    cells = cell_frame(
        frame,
        {
            "model": ("Model", str),
            "geometry": ("Write / readers", str),
            "corpus": ("Corpus", str),
            "seed": ("Seed", str),
            "n_params": ("Params", lambda v: f"{v:,}"),
            "val_loss": ("Val loss (nats)", lambda v: f"{v:.3f}"),
            "delta_vs_learned": ("Δ vs learned", formatter("{:+.3f}")),
            "write_write_pk_same_index_mean": ("WW PK same index", formatter("{:.2f}")),
            "write_write_pk_other_index_mean": ("WW PK other index", formatter("{:.2f}")),
            "own_best_fraction": ("Own-best (L ≥ 1)", formatter("{:.2f}")),
            "rho_self_mean": ("ρ_self", formatter("{:.3f}")),
            "prop1_max_residual": ("Prop. 1 residual (C14)", formatter("{:.1e}", missing="n/a")),
        },
    )
    caption = (
        "Table 2. Models: parameters, validation loss (nats, final checkpoint) and Δ vs the "
        "learned model on the same corpus (from unrounded losses), with the weight-space "
        "write geometry."
    )
    return Table("table2", frame.reset_index(drop=True), [Block(cells)], caption)


def table5(inputs: Inputs) -> Table:
    """Clean accuracy (%) / mean logit margin on the evaluation split (paper Table 5)."""
    runs = read_runs(need_kind(inputs, "runs", "table5"))
    cols = results.EVAL.columns("model", "seed", "task", "split", "n", "accuracy", "margin")
    frame = read_kind(need_kind(inputs, "eval", "table5"), cols, "table5")
    frame = split_rows(frame, "evaluation", "table5")
    tidy = with_runs(frame[cols], runs, "table5")
    wide = widen(tidy, ["accuracy", "margin"])
    keys = row_keys(wide)
    cells = pd.DataFrame({"Model": keys["label_repository"], "Corpus": keys["corpus"]})
    for task in task_columns(wide, "accuracy"):
        acc, margin = wide[("accuracy", task)], wide[("margin", task)]
        cells[TASK_TITLES[task]] = [
            f"{100 * a:.1f} / {fixed(m, 2)}" for a, m in zip(acc, margin, strict=True)
        ]
    n = sorted(set(tidy["n"].astype(int)))
    caption = (
        f"Table 5. Clean task performance: evaluation-split accuracy (%) / mean logit margin "
        f"(correct − incorrect), {', '.join(map(str, n))} examples per task."
    )
    return Table("table5", tidy_order(tidy), [Block(cells)], caption)


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
        (m, int(s)): selections.facts.reader_kind(g)
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
        if rows["reader_kind"].iloc[0] == facts.BLOCK:
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
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of every table job's start

    ww = data[data["kind"] == "write_write"]
    models = model_order(data)
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


#: How each geometry writes and reads, as the paper's Tables 2 and 4 print it (docs §6.1);
#: the reader kind itself comes from the registry.
GEOMETRY_TEXT: dict[str, tuple[str, str]] = {
    "learned": ("learned", ""),
    "write-common-axis": ("g E_h (all layers)", ""),
    "write-common": ("g B_0 E_h (all layers)", ""),
    "write-rotated": ("g B_l E_h (member l per layer)", ""),
    "read-common": ("learned", "E_h"),
    "all-common-axis": ("g E_h", "E_h"),
    "all-rotated": ("g B_l E_h", "h of B_(L+l) (other basis)"),
    "all-rotated-self": ("g B_l E_h", "h of B_l (own basis)"),
    "fixeddiag": ("g √(d/w) E_h diag(m)", ""),
    "identity-original": ("E_h (scale 1)", ""),
    "value384": ("g E_h + value adapter", ""),
    "mlp3456": ("g E_h, wider MLP", ""),
    "write-routed-a": ("routed (frozen, sum-hub)", "more heads"),
    "write-routed-b": ("routed (frozen, split-cycle)", "more heads"),
    "write-routed-c": ("routed (frozen, angle-split)", "more heads"),
    "multiscreen-learned": ("learned", "softmax-free tiles"),
    "multiscreen-identity": ("g_ms E_h", "softmax-free tiles"),
}


def write_text(geometry: str) -> str:
    return GEOMETRY_TEXT.get(geometry, (geometry, ""))[0]


def readers_text(geometry: str) -> str:
    """``free`` or ``block …`` (the registry's reader kind) with the paper's detail."""
    kind = facts.reader_kind(geometry)
    detail = GEOMETRY_TEXT.get(geometry, ("", ""))[1]
    return f"{kind} {detail}".strip() if detail else kind


def table2_paper(inputs: Inputs, context: Context | None = None) -> Table:
    """Paper Table 2: the ten main-text models (selection ``table2``: first seed each), with
    Write, Readers, Corpus, Params, Val loss and Δ vs learned on the same corpus from unrounded
    losses; the footnote states reader kinds, g and the seeds of every configuration (input
    kind ``all_runs``: every run)."""
    runs = read_runs(need_kind(inputs, "runs", "table2"))
    everything = read_runs(inputs.get("all_runs") or need_kind(inputs, "runs", "table2"))
    frame = runs[["model", "display_name", "geometry", "seed", "corpus", "n_params", "val_loss"]]
    frame = frame.copy()
    frame["delta_vs_learned"] = frame["val_loss"] - learned_reference(frame, "val_loss", [])
    frame.loc[frame["geometry"].map(facts.is_baseline), "delta_vs_learned"] = np.nan
    frame["write"] = frame["geometry"].map(write_text)
    frame["readers"] = frame["geometry"].map(readers_text)
    rank = frame["corpus"].map({"R": 0, "S": 1}).fillna(2)
    frame = frame.assign(_r=rank).sort_values("_r", kind="stable").drop(columns="_r")
    cells = cell_frame(
        frame,
        {
            "display_name": ("Model", str),
            "write": ("Write W_O", str),
            "readers": ("Readers", str),
            "corpus": ("Corpus", str),
            "n_params": ("Params", lambda v: f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v:,}"),
            "val_loss": ("Val loss", lambda v: f"{v:.3f}"),
            "delta_vs_learned": ("Δ vs learned", formatter("{:+.3f}")),
        },
    )
    seeds = everything.groupby(["model", "display_name", "corpus"], sort=False)["seed"].nunique()
    several = [
        f"{name}{'' if corpus == '—' else f' (corpus {corpus})'}"
        for (_, name, corpus), n in seeds.items()
        if n > 1
    ]
    shown = sorted(set(runs["seed"]))
    seed_text = (
        "each configuration has 1 seed"
        + (f", except {', '.join(several)}, which have 2 or more" if several else "")
        + f" (seed {', '.join(map(str, shown))} shown)"
    )
    caption = (
        "Table 2. Main-text models: write map W_O, readers, corpus, parameters, validation "
        "loss (nats) and Δ vs the learned model on the same corpus (from unrounded losses). "
        "Free readers: learned W_Q, W_K, W_V after the shared LayerNorm; block readers: head h "
        "reads one fixed d-dimensional block (docs §4.3.1). Frozen writes are scaled by "
        f"g = 0.02·sqrt(D/2L), matched to the initial output RMS of a learned W_O; {seed_text}."
    )
    return Table("table2", frame.reset_index(drop=True), [Block(cells)], caption)


def table2_all_runs(inputs: Inputs, context: Context | None = None) -> Table:
    """The older Table 2 view: every run, with its designed weight-space geometry."""
    table = table2(inputs)
    table.name = "table2_all_runs"
    table.caption = table.caption.replace("Table 2.", "Table 2 (every run, extra view).")
    return table


def table4(inputs: Inputs, context: Context) -> Table:
    """Paper Table 4: every configuration (run) of the study: repository name, write /
    readers, corpus, parameters, validation loss, and the paper sections that use it (the
    sections whose outputs read the run in this study)."""
    runs = read_runs(need_kind(inputs, "runs", "table4"))
    models = context["models"]
    frame = runs[["model", "seed", "repository_name", "geometry", "corpus", "n_params"]].copy()
    frame["val_loss"] = runs["val_loss"]
    frame["name"] = [
        repo if isinstance(repo, str) else f"{m} s{s}"
        for repo, m, s in zip(frame["repository_name"], frame["model"], frame["seed"], strict=True)
    ]
    frame["write_readers"] = [f"{write_text(g)} / {readers_text(g)}" for g in frame["geometry"]]
    frame["sections"] = [", ".join(models[m]["sections"]) or "—" for m in frame["model"]]
    cells = cell_frame(
        frame,
        {
            "name": ("Model", str),
            "write_readers": ("Write / Readers", str),
            "corpus": ("Corpus", str),
            "n_params": ("Params", lambda v: f"{v:,}"),
            "val_loss": ("Val loss", formatter("{:.3f}", missing="---")),
            "sections": ("Sections used", str),
        },
    )
    caption = (
        f"Table 4. All {len(frame)} configurations of the study (model and seed): write map / "
        "readers, corpus, exact parameter count, validation loss (nats, final checkpoint) and "
        "the paper sections whose tables and figures use it in this study."
    )
    return Table("table4", frame.drop(columns="write_readers"), [Block(cells)], caption)
