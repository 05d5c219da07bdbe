"""Concentration per head-patching ablation mode, side by side (docs §10.6).

No torch here: the comparison reads the concentration and lanes Parquets of each mode.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr


def mode_comparison(
    summaries: pd.DataFrame,
    heads: pd.DataFrame,
    lanes: pd.DataFrame,
    split: str,
    base_mode: str,
) -> pd.DataFrame:
    """One row per (model, seed, task, mode): the concentration measures of ``split``
    (N_eff, E, top-head share, N_index, N_layer|index), Λ and its p from the lanes rows, and,
    against ``base_mode`` of the same run and task, the Spearman ρ of the per-head effects
    e_{l,h} and the ratios N_eff / N_eff(base), E / E(base). Every frame has a ``mode``
    column."""
    keys = ["model", "seed", "task", "mode"]
    summ = summaries[summaries["split"] == split].set_index(keys)
    lane = lanes.set_index(keys)
    hs = heads[heads["split"] == split]
    rows = []
    for (model, seed, task, mode), s in summ.iterrows():
        base = (model, seed, task, base_mode)
        if base not in summ.index:
            raise ValueError(f"mode comparison: no {base_mode} summary for {model} s{seed} {task}")
        b = summ.loc[base]

        def e_of(m, model=model, seed=seed, task=task):
            rows_ = hs[(hs["model"] == model) & (hs["seed"] == seed) & (hs["task"] == task)
                       & (hs["mode"] == m)].sort_values(["layer", "head"])  # fmt: skip
            return rows_["e"].to_numpy(np.float64)

        e, e_base = e_of(mode), e_of(base_mode)
        if len(e) != len(e_base) or len(e) == 0:
            raise ValueError(f"mode comparison: {model} s{seed} {task} {mode}: heads missing")
        constant = np.ptp(e) == 0 or np.ptp(e_base) == 0
        rho = float("nan") if constant else float(spearmanr(e, e_base).statistic)
        lrow = (
            lane.loc[(model, seed, task, mode)] if (model, seed, task, mode) in lane.index else None
        )
        rows.append({
            "model": model, "seed": int(seed), "task": task, "mode": mode,
            "base_mode": base_mode, "split": split,
            "E": s["E"], "N_eff": s["N_eff"], "top_head_share": s["top_head_share"],
            "N_index": s["N_index"], "N_layer_given_index": s["N_layer_given_index"],
            "top_layer": int(s["top_layer"]), "top_head": int(s["top_head"]),
            "lambda_score": None if lrow is None else lrow["lambda_score"],
            "lambda_p": None if lrow is None else lrow["p_value"],
            "lambda_split": None if lrow is None else lrow["split"],
            "spearman_vs_base": rho,
            "N_eff_ratio": s["N_eff"] / b["N_eff"] if b["N_eff"] else float("nan"),
            "E_ratio": s["E"] / b["E"] if b["E"] else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows)
