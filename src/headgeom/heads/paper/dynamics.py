"""§5.3 Lanes over training (docs §13.2, §13.4, §14.2, §14.4): the task-gradient
alignment τ per checkpoint, the V-gradient own-term fractions, and the training timeline.

* ``dynamics``: τ (adjacent-layer, same-index projected, lane share) and the V-gradient
  own-term fractions beside the paper's values.
* Figure 6a–c: the timeline of N_eff, Λ and loss over checkpoints.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.paper import references
from headgeom.heads.paper.inputs import Inputs, need_kind, read_kind, read_runs, with_runs
from headgeom.render import Block, Table, fixed, format_p

TIMELINE_COLUMNS = results.TIMELINE.columns(
    "model", "seed", "step", "is_final", "sva_accuracy", "lambda_score", "lambda_p", "chance",
    "own_best_fraction", "idempotence_median",
)  # fmt: skip


TAU_COLUMNS = results.TAU.columns(
    "model", "seed", "step", "is_final", "adjacent_cosine_mean", "adjacent_cosine_min",
    "adjacent_cosine_max", "same_index_cosine", "different_index_cosine",
    "same_index_internal_cosine", "different_index_internal_cosine", "lane_index", "lane_share",
    "lane_share_max_other", "lane_share_chance",
)  # fmt: skip


VALUE_GRADIENT_COLUMNS = results.VALUE_GRADIENTS.columns(
    "model", "seed", "step", "is_final", "layer", "head", "own_largest", "scalar_trace"
)


#: The paper's values (docs §13.4, §14.4, §20.4–20.5) by the run's geometry, per quantity:
#: the ids of their records in references.yaml.
DYNAMICS_PAPER = {
    "tau_adjacent": {"write-common": "tau.adjacent", "write-rotated": "tau.adjacent"},
    "tau_same": {"write-common": "tau.same-index", "write-rotated": "tau.same-index.write-rotated"},
    "vgrad_init": {"write-common": "vgrad.step0", "write-rotated": "vgrad.step0"},
    "vgrad_early": {"write-common": "vgrad.first-step", "write-rotated": "vgrad.first-step"},
}


def _paper(quantity: str, geometry: str) -> str:
    key = DYNAMICS_PAPER.get(quantity, {}).get(geometry)
    if key is None:
        return "—"
    # the first traced step is the paper's step 256 (of 65,536)
    return references.text(key) + (" (step 256)" if quantity == "vgrad_early" else "")


def dynamics_table(inputs: Inputs) -> Table:
    """τ (docs §13.4) per checkpoint and the V-gradient own-term fractions (§14.4) per
    traced checkpoint with the per-layer sign of tr(V_hᵀO_h) at the final one, per
    timeline run, beside the paper's values."""
    runs = read_runs(need_kind(inputs, "runs", "dynamics"))
    tau = with_runs(read_kind(need_kind(inputs, "tau", "dynamics"), TAU_COLUMNS, "dynamics")
                    [TAU_COLUMNS], runs, "dynamics")  # fmt: skip
    vg = with_runs(read_kind(need_kind(inputs, "value_gradients", "dynamics"),
                             VALUE_GRADIENT_COLUMNS, "dynamics")[VALUE_GRADIENT_COLUMNS],
                   runs, "dynamics")  # fmt: skip
    geometry = runs.set_index(["model", "seed"])["geometry"]
    rows = []

    def add(run, step, section, quantity, value, text, paper="—"):
        rows.append({"label": run.label, "model": run.model, "seed": run.seed, "step": step,
                     "section": section, "quantity": quantity, "value": value, "text": text,
                     "paper": paper})  # fmt: skip

    for run in runs.itertuples():
        g = geometry[(run.model, run.seed)]
        run_tau = tau[(tau["model"] == run.model) & (tau["seed"] == run.seed)]
        final = int(run_tau["step"].max()) if len(run_tau) else 0  # the final checkpoint
        # the paper's τ steps only (1,024–65,536 of 65,536: from 1/64 of training on)
        in_range = [selections.in_tau_range(int(t), final) for t in run_tau["step"]]
        for r in run_tau[in_range].itertuples():
            step = f"{r.step}" + (" (final)" if r.is_final else "")
            add(run, step, "§13.4", "τ adjacent-layer cosine (mean [min, max])",
                r.adjacent_cosine_mean, f"{r.adjacent_cosine_mean:.2f} "
                f"[{r.adjacent_cosine_min:.2f}, {r.adjacent_cosine_max:.2f}]",
                _paper("tau_adjacent", g))  # fmt: skip
            add(run, step, "§13.4", "τ same-index projected cosine", r.same_index_cosine,
                fixed(r.same_index_cosine, 3), _paper("tau_same", g))  # fmt: skip
            add(run, step, "§13.4", "τ different-index projected cosine",
                r.different_index_cosine, fixed(r.different_index_cosine, 3))  # fmt: skip
            add(run, step, "§13.4", "τ internal-coordinate cosine, same / different index",
                r.same_index_internal_cosine, f"{fixed(r.same_index_internal_cosine, 3)} / "
                f"{fixed(r.different_index_internal_cosine, 3)}")  # fmt: skip
            add(run, step, "§13.4", f"gradient lane share, index {r.lane_index} (largest other)",
                r.lane_share, f"{r.lane_share:.3f} ({r.lane_share_max_other:.3f}; chance "
                f"{r.lane_share_chance:.3f})")  # fmt: skip
        heads = vg[(vg["model"] == run.model) & (vg["seed"] == run.seed)]
        steps = sorted(heads["step"].unique())
        for i, step in enumerate(steps):
            at = heads[heads["step"] == step]
            final = bool(at["is_final"].iloc[0])
            label = f"{step}" + (" (final)" if final else "")
            paper = "—" if final else _paper("vgrad_init" if i == 0 else "vgrad_early", g)
            for scope, sel in (("all heads", at), ("layers ≥ 1", at[at["layer"] >= 1])):
                share = float(sel["own_largest"].mean())
                add(run, label, "§14.4", f"own V-gradient term largest ({scope})", share,
                    f"{100 * share:.0f}% of {len(sel)} (chance {100 / at['head'].nunique():.0f}%)",
                    paper)  # fmt: skip
            if final:
                for layer, sel in at.groupby("layer"):
                    positive = int((sel["scalar_trace"] > 0).sum())
                    add(run, label, "§14.4", f"tr(V_hᵀO_h) > 0, layer {layer}",
                        float(sel["scalar_trace"].mean()),
                        f"{positive}/{len(sel)} heads (mean {sel['scalar_trace'].mean():+.3f})",
                        "negative shallow, positive deep")  # fmt: skip
    frame = pd.DataFrame(rows)
    cells = frame[["label", "step", "section", "quantity", "text", "paper"]].set_axis(
        ["Model", "Step", "§", "Quantity", "Value", "Paper"], axis=1
    )
    caption = (
        "Training dynamics (docs §13.4, §14.4): task gradients τ (SVA evaluation split) per "
        "checkpoint of the paper's τ range (from 1/64 of training on: its steps 1,024–65,536 "
        "of 65,536), V-gradient own-term fractions on validation tokens, and the sign of the "
        "scalar part tr(V_hᵀO_h) per layer at the final checkpoint."
    )
    return Table("dynamics", frame, [Block(cells)], caption)


#: The paper shades steps 4,096–16,384 of 65,536 (docs §13.2: where write-common's lane
#: forms); a run of another length shades the same fractions of its training.
BAND_FRACTIONS = (4096 / 65536, 16384 / 65536)


def figure6abc_data(inputs: Inputs) -> pd.DataFrame:
    """Per timeline run and checkpoint: SVA accuracy, Λ and p, own-best fraction and median
    scaled idempotence, with run labels and the run's final step (for the shaded band)."""
    runs = read_runs(need_kind(inputs, "runs", "figure6abc"))
    frame = read_kind(need_kind(inputs, "timeline", "figure6abc"), TIMELINE_COLUMNS,
                      "figure6abc")  # fmt: skip
    frame = with_runs(frame[TIMELINE_COLUMNS], runs, "figure6abc")
    final = frame[frame["is_final"]].set_index(["model", "seed"])["step"]
    frame["final_step"] = [int(final[(m, s)]) for m, s in zip(frame.model, frame.seed, strict=True)]
    frame = frame.sort_values(["order", "step"]).drop(columns=["label_repository"])
    return frame.reset_index(drop=True)


def figure6abc(data: pd.DataFrame) -> Figure:
    """(a) SVA accuracy, (b) Λ (SVA, p beside each point), (c) median P(T_h) (solid) and the
    own-best fraction (dashed) against the step on a log axis; the paper's 4,096–16,384 band
    (the same fractions of each run's training) shaded."""
    import seaborn as sns  # here: seaborn (with scipy.stats) costs ~1 s of every table job's start

    fig = Figure(figsize=(13.0, 4.4), layout="constrained")
    axes = fig.subplots(1, 3, sharex=True)
    colours = dict(zip(dict.fromkeys(data["label"]), sns.color_palette("deep"), strict=False))
    lo, hi = BAND_FRACTIONS
    for final in sorted(set(data["final_step"])):
        for ax in axes:
            ax.axvspan(lo * final, hi * final, color="#e6e6e6", zorder=0, lw=0)
    for label, rows in data.groupby("label", sort=False):
        c = colours[label]
        axes[0].plot(rows["step"], 100 * rows["sva_accuracy"], "o-", color=c, label=label)
        axes[1].plot(rows["step"], rows["lambda_score"], "o-", color=c, label=label)
        for x, y, p in zip(rows["step"], rows["lambda_score"], rows["lambda_p"], strict=True):
            if y == y:
                axes[1].annotate(f"p={format_p(p)}", (x, y), textcoords="offset points",
                                 xytext=(4, 5), fontsize=7, color=c)  # fmt: skip
        axes[2].plot(rows["step"], rows["idempotence_median"], "o-", color=c,
                     label=f"{label}: median P(T_h)")  # fmt: skip
        axes[2].plot(rows["step"], rows["own_best_fraction"], "s--", color=c, mfc="white",
                     label=f"{label}: own-best fraction")  # fmt: skip
    titles = ("(a) SVA accuracy (evaluation split)", "(b) lane score Λ, SVA (discovery split)",
              "(c) V–O self-alignment over training")  # fmt: skip
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("training step (log scale)")
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    steps = sorted(set(data["step"]))
    axes[0].set_xticks(steps, [f"{s:,}" for s in steps], fontsize=7)
    axes[0].xaxis.set_minor_locator(NullLocator())
    axes[0].set_ylabel("accuracy (%)")
    axes[0].set_ylim(0, 105)
    axes[0].axhline(50, color="black", lw=0.7, ls=":")
    for ax in axes[1:]:
        for chance in sorted(set(data["chance"])):
            ax.axhline(chance, color="black", lw=0.8, ls=":")
    axes[2].plot([], [], "k:", lw=0.8, label="chance 1/H (Λ, own-best)")
    axes[1].set_ylabel("Λ")
    axes[1].set_ylim(0, max(0.5, float(np.nanmax(data["lambda_score"].to_numpy(float))) * 1.2))
    axes[2].set_ylabel("fraction / P(T_h)")
    axes[2].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8, frameon=False, loc="lower right")
    axes[2].legend(fontsize=7, frameon=False, loc="upper left")
    fig.suptitle("Figure 6a–c — when lanes and V self-alignment form (shaded: steps "
                 "4,096–16,384 of 65,536, as fractions of training)", fontsize=11)  # fmt: skip
    return fig
