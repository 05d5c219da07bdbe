"""Attribution patching beside exact patching: what a user who ranks heads by AtP instead of
patching each one loses, measured on the study's own examples (docs §10.1).

AtP (:func:`headgeom.heads.analysis.patching.attribution_patch`: two forwards and one backward per
batch) estimates head (l, h)'s patched logit difference to first order,

    atp_ld = clean_ld + Σ_t (z^ref_{l,h,t} − z_{l,h,t}) · ∂LD/∂z^{l,h}_t,

so its drop is ``effect_atp = clean_ld − atp_ld``; the exact drop ``effect`` is the effects
file's (every head patched and the model rerun). This module runs AtP on the examples of one
task split, lays its per-example drops beside the exact ones and compares the per-head mean
effects e_{l,h} (the numbers the head-effect grid, N_eff and E are computed from):

* Spearman ρ of e_exact and e_atp over the L·H heads (signed), and of |e_exact| and |e_atp|
  (what a ranking of heads by size uses): :func:`headgeom.heads.analysis.stats.spearman`
  (``scipy.stats.spearmanr``, average ranks for ties; null when a side is constant);
* the top-k overlap |top_k(exact) ∩ top_k(atp)| / k, k = min(10, L·H), each top-k the k
  heads of largest |e|. Ties in |e| are broken in row-major (layer, head) order, the
  concentration stage's top-head rule; ``top_k_boundary_tie`` says when the k-th and
  (k+1)-th largest |e| of either side are equal, i.e. when the overlap depends on that rule;
* the largest misses: the heads of largest |e_atp − e_exact| (ties row-major), with both
  values.

The agreement is a measured result of a study, not a property of the code.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headgeom.data.task_files import model_inputs
from headgeom.heads.analysis.concentration import concentration
from headgeom.heads.analysis.effects import drops_columns, effect_matrix
from headgeom.heads.analysis.patching import attribution_patch
from headgeom.heads.analysis.stats import spearman

#: [CHOICE] Heads compared by the top-k overlap (k = min(TOP_K, L·H)).
TOP_K = 10
#: [CHOICE] Largest misses listed per (run, task, split).
N_MISSES = 5
#: How ties in |e| are ordered (the rankings, the top-k and the misses), for the metadata.
TIE_RULE = "ties in |e| (and in |e_atp − e_exact|) broken in row-major (layer, head) order"


# --------------------------------------------------------------------------- AtP drops
def atp_examples(
    model: torch.nn.Module,
    vocab: np.ndarray,
    rows: pd.DataFrame,
    batch_size: int,
    replacement: torch.Tensor | None = None,
) -> pd.DataFrame:
    """AtP's per-example estimates for the examples ``rows`` of one split of a task frame
    (``TaskSplits.frame``): one row per (example, layer, head), example-major, with
    ``example_id``, ``layer``, ``head``, ``clean_ld``, ``atp_ld`` and ``effect_atp =
    clean_ld − atp_ld``. Batches are the exact engines' length groups of ``batch_size``
    (each example's value does not depend on its batch beyond float round-off);
    ``replacement``: the ablation mode's fixed z (None: resample, the reference prompts)."""
    inputs = model_inputs(rows, vocab)
    clean_ld, atp_ld = attribution_patch(
        model, inputs.clean_ids, inputs.ref_ids, inputs.correct, inputs.incorrect, batch_size,
        replacement=replacement,
    )  # fmt: skip
    grid = drops_columns(clean_ld, atp_ld)
    example = grid.pop("example")
    return pd.DataFrame(
        {
            "example_id": rows["example_id"].to_numpy()[example],
            "layer": grid["layer"],
            "head": grid["head"],
            "clean_ld": grid["clean_ld"],
            "atp_ld": grid["patched_ld"],
            "effect_atp": grid["effect"],
        }
    )


def beside_exact(atp: pd.DataFrame, exact: pd.DataFrame, where: str) -> pd.DataFrame:
    """AtP rows (:func:`atp_examples`) joined with the exact rows of the same split of an
    effects file (columns example_id, layer, head, clean_ld, effect) on (example, layer,
    head): adds ``effect_exact`` and ``clean_ld_exact``. Both sides must cover the same
    examples and heads, each once; ``where`` names the effects file in the error."""
    key = ["example_id", "layer", "head"]
    if exact.duplicated(key).any():
        raise ValueError(f"{where}: the effects name some (example, layer, head) twice")
    exact = exact[[*key, "clean_ld", "effect"]].rename(
        columns={"clean_ld": "clean_ld_exact", "effect": "effect_exact"}
    )
    joined = atp.merge(exact, on=key, how="outer", indicator=True, validate="one_to_one")
    unmatched = joined[joined["_merge"] != "both"]
    if len(unmatched):
        side = {"left_only": "AtP only", "right_only": "effects only"}
        first = unmatched.iloc[0]
        raise ValueError(
            f"{where}: {len(unmatched)} (example, layer, head) rows are not in both the task's "
            f"split and the effects file, e.g. example {first['example_id']} layer "
            f"{first['layer']} head {first['head']} ({side[first['_merge']]}); rerun "
            "patch_heads on this task file"
        )
    joined = joined.drop(columns="_merge")
    order = atp[key].merge(joined, on=key, how="left")  # AtP's (example-major) row order
    return order.reset_index(drop=True)


def head_means(examples: pd.DataFrame) -> pd.DataFrame:
    """Per-head means over the examples of :func:`beside_exact`'s rows: ``layer``, ``head``,
    ``n_examples``, ``effect_exact`` and ``effect_atp`` (the signed mean drops e_{l,h}),
    row-major."""
    grouped = examples.groupby(["layer", "head"], sort=True)
    out = grouped.agg(
        n_examples=("example_id", "size"),
        effect_exact=("effect_exact", "mean"),
        effect_atp=("effect_atp", "mean"),
    )
    return out.reset_index()


# --------------------------------------------------------------------------- agreement
def ranking(values: np.ndarray) -> np.ndarray:
    """Flat indices of ``values`` (L, H) by |value| descending, ties in row-major order."""
    return np.argsort(-np.abs(np.asarray(values, dtype=np.float64)).reshape(-1), kind="stable")


def boundary_tie(values: np.ndarray, k: int) -> bool:
    """Whether the k-th and (k+1)-th largest |value| are equal: the top-k set then depends
    on the tie-break (False when there is no (k+1)-th)."""
    magnitude = np.sort(np.abs(np.asarray(values, dtype=np.float64)).reshape(-1))[::-1]
    return bool(k < len(magnitude) and magnitude[k - 1] == magnitude[k])


def agreement(
    exact: np.ndarray, atp: np.ndarray, top_k: int = TOP_K, n_misses: int = N_MISSES
) -> dict:
    """The agreement of two effect matrices (L, H), exact and AtP (see the module docstring):
    ``n_heads``, ``spearman_rho``, ``spearman_p``, ``spearman_rho_abs``, ``top_k`` (k used),
    ``top_k_overlap``, ``top_k_boundary_tie``, ``E_exact``, ``E_atp``, ``N_eff_exact``,
    ``N_eff_atp``, ``max_abs_miss`` and the misses ``miss_layer``, ``miss_head``,
    ``miss_exact``, ``miss_atp`` (lists, largest |atp − exact| first)."""
    exact, atp = np.asarray(exact, dtype=np.float64), np.asarray(atp, dtype=np.float64)
    if exact.shape != atp.shape or exact.ndim != 2:
        raise ValueError(f"effects must be two (layers, heads) matrices, got {exact.shape} and "
                         f"{atp.shape}")  # fmt: skip
    if top_k < 1 or n_misses < 1:
        raise ValueError(f"top_k and n_misses must be at least 1, got {top_k} and {n_misses}")
    n_heads = exact.size
    k = min(top_k, n_heads)
    rho, p = spearman(exact.reshape(-1), atp.reshape(-1))
    rho_abs, _ = spearman(np.abs(exact).reshape(-1), np.abs(atp).reshape(-1))
    top_exact, top_atp = set(ranking(exact)[:k]), set(ranking(atp)[:k])
    miss = atp - exact
    worst = ranking(miss)[: min(n_misses, n_heads)]
    layers, heads = np.unravel_index(worst, exact.shape)
    c_exact, c_atp = concentration(exact), concentration(atp)
    return {
        "n_heads": n_heads,
        "spearman_rho": rho,
        "spearman_p": p,
        "spearman_rho_abs": rho_abs,
        "top_k": k,
        "top_k_overlap": len(top_exact & top_atp) / k,
        "top_k_boundary_tie": boundary_tie(exact, k) or boundary_tie(atp, k),
        "E_exact": c_exact["E"],
        "E_atp": c_atp["E"],
        "N_eff_exact": c_exact["N_eff"],
        "N_eff_atp": c_atp["N_eff"],
        "max_abs_miss": float(np.abs(miss).max()),
        "miss_layer": layers.tolist(),
        "miss_head": heads.tolist(),
        "miss_exact": exact.reshape(-1)[worst].tolist(),
        "miss_atp": atp.reshape(-1)[worst].tolist(),
    }


def head_ranks(heads: pd.DataFrame, top_k: int = TOP_K) -> pd.DataFrame:
    """``heads`` (:func:`head_means` of one split) with ``rank_exact`` and ``rank_atp``
    (1 = largest |e|, ties row-major), ``top_exact`` and ``top_atp`` (in that side's
    top-k, k = min(top_k, L·H)) and ``miss = effect_atp − effect_exact``."""
    out = heads.sort_values(["layer", "head"]).reset_index(drop=True)
    k = min(top_k, len(out))
    for side in ("exact", "atp"):
        matrix = effect_matrix(out, f"effect_{side}", f"per-head {side} effects")
        rank = np.empty(matrix.size, dtype=np.int64)
        rank[ranking(matrix)] = np.arange(1, matrix.size + 1)
        out[f"rank_{side}"] = rank  # row-major, as out's rows
        out[f"top_{side}"] = rank <= k
    out["miss"] = out["effect_atp"] - out["effect_exact"]
    return out


def split_agreement(
    examples: pd.DataFrame, top_k: int = TOP_K, n_misses: int = N_MISSES
) -> tuple[pd.DataFrame, dict]:
    """Per-head rows (:func:`head_ranks`) and the agreement row (:func:`agreement`, with
    ``n_examples``) of one split's joined examples (:func:`beside_exact`)."""
    heads = head_ranks(head_means(examples), top_k)
    exact = effect_matrix(heads, "effect_exact", "per-head exact effects")
    atp = effect_matrix(heads, "effect_atp", "per-head AtP effects")
    n_examples = int(examples["example_id"].nunique())
    return heads, {"n_examples": n_examples, **agreement(exact, atp, top_k, n_misses)}
