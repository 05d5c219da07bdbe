"""Figure 6a–c and the dynamics / scalar_ablation tables (docs §13.2–14.5) from hand-made
Parquets."""

from __future__ import annotations

import pandas as pd
import pytest

from headgeom import results
from headgeom.heads.paper.alignment import scalar_ablation_table
from headgeom.heads.paper.dynamics import (
    BAND_FRACTIONS,
    dynamics_table,
    figure6abc,
    figure6abc_data,
)
from tests.helpers.results import train_log


def timeline(path, model, steps, final):
    rows = [{"model": model, "seed": 42, "step": s, "is_final": s == final,
             "checkpoint_sha256": f"{s:064d}", "tokens_seen": 64 * s, "val_loss": 3.0,
             "sva_accuracy": min(1.0, 0.5 + s / 1000), "sva_margin": 0.1, "sva_n": 240,
             "lambda_score": 0.1 * i, "lambda_p": 0.5, "lane_split": "discovery",
             "chance": 0.25, "own_best_fraction": 0.3, "own_best_fraction_layer0": 1.0,
             "rho_self_mean": 0.3, "idempotence_median": 0.1 * i}
            for i, s in enumerate(steps)]  # fmt: skip
    results.TIMELINE.write(path, pd.DataFrame(rows))
    return str(path)


def test_figure6abc_plots_every_step_with_the_papers_band(tmp_path):
    runs = [train_log(tmp_path / "log.parquet", "write-common", "write-common", 42)]
    tl = [timeline(tmp_path / "t.parquet", "write-common", [32, 128, 512, 800], 800)]
    data = figure6abc_data({"runs": runs, "timeline": tl})
    assert data["step"].tolist() == [32, 128, 512, 800]
    assert set(data["final_step"]) == {800}
    fig = figure6abc(data)
    ax = fig.axes[0]
    box = ax.patches[0].get_bbox()  # the shaded band (matplotlib ≥ 3.9: a Rectangle)
    x0, x1 = box.x0, box.x1
    assert (x0, x1) == pytest.approx((800 * BAND_FRACTIONS[0], 800 * BAND_FRACTIONS[1]))
    assert (x0, x1) == pytest.approx((50, 200))  # 4,096/65,536 and 16,384/65,536 of 800
    assert ax.get_xscale() == "log"


def test_dynamics_table_counts_own_largest_heads_and_signs(tmp_path):
    runs = [train_log(tmp_path / "log.parquet", "wc", "write-common", 42)]
    tau = [{"model": "wc", "seed": 42, "step": 800, "is_final": True,
            "checkpoint_sha256": "0" * 64, "n_examples": 240, "n_positions": 2400,
            "adjacent_cosine_mean": 0.8, "adjacent_cosine_min": 0.7, "adjacent_cosine_max": 0.9,
            "same_index_cosine": 0.5, "different_index_cosine": 0.0,
            "same_index_internal_cosine": 0.5, "different_index_internal_cosine": 0.01,
            "lane_index": 1, "lane_share": 0.4, "lane_share_max_other": 0.3,
            "lane_share_chance": 0.25}]  # fmt: skip
    results.TAU.write(tmp_path / "tau.parquet", pd.DataFrame(tau))
    heads = []
    for step, own in ((0, [True, False, False, False]), (8, [True, True, True, False])):
        for layer in range(2):
            for head in range(2):
                heads.append({"model": "wc", "seed": 42, "step": step, "is_final": False,
                              "checkpoint_sha256": "1" * 64, "layer": layer, "head": head,
                              "own_trace": 1.0, "max_other_abs_trace": 0.5,
                              "own_largest": own[2 * layer + head], "n_tokens": 64,
                              "scalar_trace": -1.0 if layer == 0 else 2.0})  # fmt: skip
    final = [dict(h, step=800, is_final=True) for h in heads[-4:]]
    results.VALUE_GRADIENTS.write(tmp_path / "vg.parquet", pd.DataFrame(heads + final))
    table = dynamics_table(
        {"runs": runs, "tau": [str(tmp_path / "tau.parquet")],
         "value_gradients": [str(tmp_path / "vg.parquet")]}
    )  # fmt: skip
    f = table.frame.set_index(["step", "quantity"])["value"]
    assert f[("0", "own V-gradient term largest (all heads)")] == 0.25
    assert f[("8", "own V-gradient term largest (all heads)")] == 0.75
    assert f[("8", "own V-gradient term largest (layers ≥ 1)")] == 0.5
    assert f[("800 (final)", "tr(V_hᵀO_h) > 0, layer 0")] == -1.0
    text = table.frame.set_index(["step", "quantity"])["text"]
    assert text[("800 (final)", "tr(V_hᵀO_h) > 0, layer 1")].startswith("2/2 heads")
    paper = table.frame.set_index(["step", "quantity"])["paper"]
    assert paper[("800 (final)", "τ same-index projected cosine")] == "0.45–0.63"
    assert paper[("8", "own V-gradient term largest (all heads)")] == "77–78% (step 256)"


def test_scalar_ablation_table_counts_cases_where_the_scalar_part_hurts_more(tmp_path):
    runs = [train_log(tmp_path / "log.parquet", "wca", "write-common-axis", 42)]
    rows = []
    drops = {"sva": (0.5, [0.1, 0.2]), "quote": (0.1, [0.3, 0.5])}
    for task, (scalar, random) in drops.items():
        for edit, kind, draw, drop in [("scalar", "scalar", None, scalar)] + [
            (f"random{k}", "random", k, d) for k, d in enumerate(random)
        ]:
            rows.append({"model": "wca", "seed": 42, "task": task, "split": "evaluation",
                         "edit": edit, "kind": kind, "draw": draw, "layers": "1",
                         "n_heads_edited": 4, "scalar_norm": 1.0, "margin_unedited": 2.0,
                         "margin": 2.0 - drop, "drop": drop, "accuracy": 1.0, "n": 240,
                         "checkpoint_sha256": "2" * 64, "haar_seed": 1405})  # fmt: skip
    results.SCALAR_ABLATION.write(tmp_path / "a.parquet", pd.DataFrame(rows))
    table = scalar_ablation_table({"runs": runs, "scalar_ablation": [str(tmp_path / "a.parquet")]})
    frame = table.frame.set_index("task")
    assert frame.loc["sva", "drop_random_mean"] == pytest.approx(0.15)
    assert frame.loc["quote", "drop_random_max"] == pytest.approx(0.5)
    assert frame["scalar_hurts_more"].tolist() == [True, False]  # SVA before Quote
    assert "in 1 of 2 cases" in table.caption and "seed 1405" in table.caption
