"""§5.2 Concentration under other ablations (docs §10.6): the block ablation atlas (zero
and mean ablation of every attention block, MLP and head on held-out text; table and
figure) and the concentration of head-patching effects per ablation mode.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from headgeom import results
from headgeom.heads.analysis.stats import spearman
from headgeom.heads.paper.concentration import decomposition_cell
from headgeom.heads.paper.inputs import (
    TASK_ORDER,
    TASK_TITLES,
    Inputs,
    need_kind,
    read_kind,
    read_runs,
    with_runs,
)
from headgeom.render import Block, Table, cell_frame, fixed, format_p

ATLAS_COLUMNS = results.ABLATION_ATLAS.columns(
    "model", "seed", "block", "layer", "head", "label", "ablation", "kl", "delta_top1",
    "retention_sva", "retention_quote", "retention_plural", "size", "constant_part",
)  # fmt: skip


_ATLAS_MEASURES = ("kl", "delta_top1", "retention_sva", "retention_quote", "retention_plural")


BLOCK_ORDER = {"attn": 0, "mlp": 1, "head": 2}


def atlas_wide(atlas: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, seed, block): size, constant part and every measure under zero
    and under mean ablation side by side (``kl_zero``, ``kl_mean``, …) plus the mean task
    retention of each ablation, blocks in (layer, attn, mlp, heads) order."""
    keys = ["model", "seed", "block", "layer", "head", "label"]
    atlas = atlas.assign(head=atlas["head"].astype("Int64"))
    desc = atlas.drop_duplicates(keys)[[*keys, "size", "constant_part"]]
    wide = atlas.pivot_table(
        index=keys, columns="ablation", values=list(_ATLAS_MEASURES), dropna=False
    )
    wide.columns = [f"{measure}_{ablation}" for measure, ablation in wide.columns]
    frame = desc.merge(wide.reset_index(), on=keys, validate="one_to_one")
    for ab in ("zero", "mean"):
        cols = [f"retention_{t}_{ab}" for t in TASK_ORDER]
        frame[f"retention_{ab}"] = frame[cols].mean(axis=1)
    frame["_b"] = frame["block"].map(BLOCK_ORDER)
    frame = frame.sort_values(["layer", "_b", "head"], kind="stable").drop(columns="_b")
    return frame.reset_index(drop=True)


def ablation_atlas_table(inputs: Inputs) -> Table:
    """Per model the blocks with the largest zero-ablation KL, with mean ablation beside
    them, size and constant part; the CSV holds every block (docs §10.6)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_atlas"))
    atlas = read_kind(need_kind(inputs, "atlas", "ablation_atlas"), ATLAS_COLUMNS,
                      "ablation_atlas")  # fmt: skip
    frames, blocks = [], []
    for (_, seed), group in atlas.groupby(["model", "seed"], sort=False):
        wide = atlas_wide(group).rename(columns={"label": "block_label"})
        wide = with_runs(wide, runs, "ablation_atlas")
        frames.append(wide)
        valid = wide[["kl_zero", "kl_mean"]].dropna()
        rho, _ = spearman(valid["kl_zero"], valid["kl_mean"])  # NaN under 3 blocks
        top = wide.nlargest(5, "kl_zero")
        cells = cell_frame(
            top,
            {
                "block_label": ("Block", str),
                "size": ("Size", lambda v: fixed(v, 2)),
                "constant_part": ("Const. part", lambda v: fixed(v, 2)),
                "kl_zero": ("KL zero", lambda v: f"{v:.3g}"),
                "kl_mean": ("KL mean", lambda v: f"{v:.3g}"),
                "delta_top1_zero": ("Δtop-1 zero", lambda v: fixed(100 * v, 1)),
                "delta_top1_mean": ("Δtop-1 mean", lambda v: fixed(100 * v, 1)),
                "retention_zero": ("Retention zero", lambda v: fixed(100 * v, 0)),
                "retention_mean": ("Retention mean", lambda v: fixed(100 * v, 0)),
            },
        )
        rho_text = "—" if pd.isna(rho) else fixed(rho, 2)
        title = f"{wide['label'].iloc[0]} s{seed}: ρ(KL zero, KL mean) over {len(valid)} blocks"
        blocks.append(Block(cells, f"{title} = {rho_text}"))
    frame = pd.concat(frames, ignore_index=True).drop(columns=["label_repository"])
    frame = frame.sort_values(["order"], kind="stable").drop(columns=["order"])
    caption = (
        "Block ablation atlas (docs §10.6): per model the five blocks with the largest "
        "zero-ablation KL(original ‖ edited) on held-out validation text (nats), beside mean "
        "ablation; Δtop-1 in points, task retention (%) averaged over SVA, Quote and Plural; "
        "size = RMS(write)/RMS(residual); constant part = ‖mean write‖²/mean‖write‖² "
        "(1 = a fixed bias). ρ: Spearman of zero vs mean KL over every block."
    )
    return Table("ablation_atlas", frame.reset_index(drop=True), blocks, caption)


MODES_COLUMNS = results.ABLATION_MODES.columns(
    "model", "seed", "task", "mode", "base_mode", "split", "E", "N_eff", "top_head_share",
    "N_index", "N_layer_given_index", "lambda_score", "lambda_p", "spearman_vs_base",
    "N_eff_ratio", "E_ratio",
)  # fmt: skip


def ablation_modes_table(inputs: Inputs) -> Table:
    """Concentration per head-patching mode (resample | mean | zero), per model and task:
    N_eff and its ratio to patching.mode, E, top-head share, N_index × N_layer|index, Λ and
    the Spearman ρ of per-head effects against patching.mode (docs §10.6)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_modes"))
    modes = read_kind(need_kind(inputs, "modes", "ablation_modes"), MODES_COLUMNS,
                      "ablation_modes")  # fmt: skip
    frame = with_runs(modes, runs, "ablation_modes")
    order = {m: i for i, m in enumerate(dict.fromkeys(frame["mode"]))}
    frame = (
        frame.assign(
            _t=frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)}),
            _m=frame["mode"].map(order),
        )
        .sort_values(["order", "_t", "_m"])
        .drop(columns=["_t", "_m", "label_repository", "order"])
    )
    cells = cell_frame(
        frame.assign(
            _dec=list(
                zip(frame["N_eff"], frame["N_index"], frame["N_layer_given_index"], strict=True)
            )
        ),
        {
            "label": ("Model", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "mode": ("Mode", str),
            "N_eff": ("N_eff", lambda v: fixed(v, 2)),
            "N_eff_ratio": ("N_eff ratio", lambda v: fixed(v, 2)),
            "E": ("E", lambda v: fixed(v, 2)),
            "top_head_share": ("Top share", lambda v: fixed(v, 2)),
            "_dec": ("N_index × N_layer|index", lambda d: decomposition_cell(*d)),
            "lambda_score": ("Λ", lambda v: "—" if v is None or pd.isna(v) else fixed(v, 2)),
            "lambda_p": ("Λ p", format_p),
            "spearman_vs_base": ("ρ vs base", lambda v: "—" if pd.isna(v) else fixed(v, 2)),
        },
    )
    base = ", ".join(sorted(set(frame["base_mode"])))
    caption = (
        f"Concentration per head-patching ablation mode (docs §10.6) on the "
        f"{', '.join(sorted(set(frame['split'])))} split; ratios and ρ (Spearman of the "
        f"per-head effects e_l,h) against patching.mode = {base}. Λ on the lanes split. "
        "resample: the reference prompt's z; mean: the head's mean z over held-out validation "
        "positions; zero: z = 0."
    )
    return Table("ablation_modes", frame.reset_index(drop=True), [Block(cells)], caption)


ATLAS_ABLATIONS = ("zero", "mean")


CONSTANT_PART_AREA = 320.0  # marker area (points²) of a constant part of 1


def ablation_atlas_data(inputs: Inputs) -> pd.DataFrame:
    """The atlas rows (model, seed, block, layer, head, ablation, KL, constant part, size, …)
    with run labels and the figure's column of each block (attn, mlp, H0, H1, …)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_atlas"))
    atlas = read_kind(need_kind(inputs, "atlas", "ablation_atlas"), ATLAS_COLUMNS,
                      "ablation_atlas")  # fmt: skip
    frame = with_runs(atlas[ATLAS_COLUMNS].rename(columns={"label": "block_label"}), runs,
                      "ablation_atlas")  # fmt: skip
    frame["column"] = [
        "H" + str(int(h)) if b == "head" else b
        for b, h in zip(frame["block"], frame["head"], strict=True)
    ]
    frame["_b"] = frame["block"].map(BLOCK_ORDER)
    frame = frame.sort_values(["order", "layer", "_b", "head", "ablation"], kind="stable")
    return frame.drop(columns=["_b", "label_repository"]).reset_index(drop=True)


def ablation_atlas(data: pd.DataFrame) -> Figure:
    """Layers × blocks per model, zero ablation beside mean ablation: colour = KL(original ‖
    edited) in nats (log scale, shared), circle area ∝ the write's constant part (the
    largest circle, of area :data:`CONSTANT_PART_AREA`: a fixed bias)."""
    runs = list(dict.fromkeys(zip(data["model"], data["seed"], strict=True)))
    kl = data["kl"][data["kl"] > 0]
    norm = LogNorm(vmin=max(float(kl.min()), float(kl.max()) * 1e-4), vmax=float(kl.max()))
    fig = Figure(figsize=(9.0, 1.0 + 1.9 * len(runs)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(runs), 2, squeeze=False))
    image = None
    for row, (model, seed) in enumerate(runs):
        rows = data[(data["model"] == model) & (data["seed"] == seed)]
        columns = list(dict.fromkeys(rows["column"]))
        n_layer = int(rows["layer"].max()) + 1
        for col, ablation in enumerate(ATLAS_ABLATIONS):
            ax = axes[row, col]
            part = rows[rows["ablation"] == ablation]
            grid = np.full((n_layer, len(columns)), np.nan)
            const = np.full_like(grid, np.nan)
            x = part["column"].map({c: i for i, c in enumerate(columns)}).to_numpy()
            grid[part["layer"].to_numpy(), x] = part["kl"].clip(lower=norm.vmin).to_numpy()
            const[part["layer"].to_numpy(), x] = part["constant_part"].to_numpy()
            image = ax.imshow(grid, cmap="viridis", norm=norm, aspect="auto", origin="lower")
            li, ci = np.nonzero(np.nan_to_num(const) > 0)
            ax.scatter(ci, li, s=CONSTANT_PART_AREA * const[li, ci], facecolors="none",
                       edgecolors="white", linewidths=1.2)  # fmt: skip
            ax.set_xticks(range(len(columns)), columns, fontsize=7)
            ax.set_yticks(range(n_layer), [f"L{i}" for i in range(n_layer)], fontsize=7)
            label = rows["label"].iloc[0]
            ax.set_title(f"{label} s{seed}: {ablation} ablation", fontsize=8)
            if len(columns) > 2:
                ax.axvline(1.5, color="white", linewidth=0.8)  # blocks | heads
    fig.colorbar(image, ax=axes, shrink=0.6, label="KL(original ‖ edited), nats")
    fig.suptitle(
        "Block ablation atlas: KL on held-out validation text; circle area = constant part "
        "‖mean w‖²/mean‖w‖²",
        fontsize=9,
    )
    return fig
