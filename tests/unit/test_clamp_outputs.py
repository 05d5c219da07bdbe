"""Figure 6d–e, Figure 8 and the clamps / lane_heads tables from hand-made result rows, with
hand-computed shares, ranges and counts (docs §13.1, §13.3, §15.3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headgeom import results
from headgeom.heads.paper.clamps import path_shares
from headgeom.heads.paper.outputs import FIGURES, TABLES
from tests.helpers.results import train_log_s as train_log


def paths_row(model, seed, task, rank, none, heads, mlps, both):
    d = dict(delta_none=none, delta_later_heads=heads, delta_mlps=mlps, delta_both=both)
    return {
        "model": model, "seed": seed, "task": task, "split": "evaluation", "rank": rank,
        "layer": rank, "head": 0, "e_stored": none, **d, "delta_all_but_source": both,
        "direct_closed_form": both, "direct": both, "via_mlps_a": heads - both,
        "via_attention_a": none - heads, "via_attention_b": mlps - both,
        "via_mlps_b": none - mlps, "interaction": none - heads - mlps + both,
    }  # fmt: skip


@pytest.fixture
def inputs(tmp_path):
    runs = [
        train_log(tmp_path / "l.parquet", "learned", "learned"),
        train_log(tmp_path / "w.parquet", "write-common-axis", "write-common-axis"),
    ]
    pairs = pd.DataFrame(
        [
            # learned: one different-index pair; w-c-a: a same-index and a different-index pair
            ("learned", 0, 1, 2, 3, False, 1.0, 0.8, 0.5),
            ("write-common-axis", 1, 2, 4, 2, True, 2.0, 1.9, 0.1),
            ("write-common-axis", 1, 2, 3, 0, False, 2.0, 2.2, 0.1),
        ],
        columns=["model", "source_layer", "source_head", "later_layer", "later_head",
                 "same_index", "e_unclamped", "e_head_clamped", "e_mlps_clamped"],
    )  # fmt: skip
    pairs = pairs.assign(
        seed=42, task="sva", split="evaluation", source_rank=0, later_rank=1,
        reduction_head=(pairs.e_unclamped - pairs.e_head_clamped) / pairs.e_unclamped,
        reduction_mlps=(pairs.e_unclamped - pairs.e_mlps_clamped) / pairs.e_unclamped,
    )  # fmt: skip
    pair_paths = []
    for model in ("learned", "write-common-axis"):
        path = tmp_path / f"pairs-{model}.parquet"
        results.CLAMP_PAIRS.write(path, pairs[pairs.model == model][results.CLAMP_PAIRS.names])
        pair_paths.append(str(path))
    rows = [
        paths_row("learned", 42, "sva", 0, 4.0, 3.0, 2.0, 1.0),  # I = 0
        paths_row("learned", 42, "quote", 0, 2.0, 1.0, 1.5, 0.0),  # I = −0.5
        paths_row("write-common-axis", 42, "sva", 0, 3.0, 2.5, 1.0, 0.5),  # I = 0
    ]
    path_files = []
    for model in ("learned", "write-common-axis"):
        path = tmp_path / f"paths-{model}.parquet"
        frame = pd.DataFrame([r for r in rows if r["model"] == model])
        results.CLAMP_PATHS.write(path, frame[results.CLAMP_PATHS.names])
        path_files.append(str(path))
    lumped = pd.DataFrame({
        "model": "write-common-axis", "seed": 42, "task": "sva", "split": "evaluation",
        "index_shift": [0, 1, 2, 3], "same_index": [True, False, False, False], "n_sources": 5,
        "sources": "L1H2", "sum_unclamped": 10.0, "sum_clamped": [8.0, 10.0, 9.9, 10.3],
        "reduction": [0.2, 0.0, 0.01, -0.03],
    })  # fmt: skip
    lumped_path = tmp_path / "lumped.parquet"
    results.CLAMP_LUMPED.write(lumped_path, lumped)
    return {
        "runs": runs, "pairs": pair_paths, "paths": path_files, "both_orders": path_files,
        "lumped": [str(lumped_path)],
    }  # fmt: skip


def test_path_shares_by_hand():
    frame = pd.DataFrame([paths_row("m", 1, "sva", 0, 4.0, 3.0, 2.0, 1.0),
                          paths_row("m", 1, "quote", 0, 2.0, 1.0, 1.5, 0.0)])  # fmt: skip
    s = path_shares(frame)
    assert s["direct_share"] == pytest.approx(1 / 6)
    assert s["mlp_share_a"] == pytest.approx((2 + 1) / 6)  # (3−1) + (1−0)
    assert s["mlp_share_b"] == pytest.approx((2 + 0.5) / 6)  # (4−2) + (2−1.5)
    assert s["interaction_signed_share"] == pytest.approx(-0.5 / 6)
    assert s["interaction_median_rel"] == pytest.approx(0.125)  # median of 0 and 0.25
    assert (s["interaction_over_20pct"], s["interaction_over_50pct"]) == (1, 0)


def test_clamps_table_ranges_and_lumped_control(inputs):
    table = TABLES["clamps"].function()(inputs)
    values = dict(zip(table.frame["quantity"] + " " + table.frame["models"],
                      table.frame["value"], strict=True))  # fmt: skip
    assert values["same-index pairs: reduction 1 pairs"] == "5.0% to 5.0%"
    assert values["different-index pairs: reduction 2 pairs"] == "-10.0% to 20.0%"
    frozen = table.frame[table.frame.quantity.str.contains("frozen-write")]["value"].item()
    assert frozen == "95.0% to 95.0%"  # one source of write-common-axis: (2 − 0.1)/2
    lumped = table.frame[table.frame.section == "§13.3 lumped"]["value"].item()
    assert lumped == "20.0% (-0.7%)"  # others: mean(0, 0.01, −0.03)


def test_figures_draw_and_their_data(inputs):
    data, draw = FIGURES["figure6de"].function("build"), FIGURES["figure6de"].function("draw")
    frame = data(inputs)
    assert list(frame["pair"]) == ["L0H1→L2H3", "L1H2→L3H0", "L1H2→L4H2"]  # by later layer
    assert len(draw(frame).axes) == 2
    data, draw = FIGURES["figure8"].function("build"), FIGURES["figure8"].function("draw")
    frame = data(inputs)
    a = frame[frame.panel == "a"].set_index(["label", "part"])["value"]
    # panel a: SVA only, order A, summed: learned direct 1, via MLPs 2, via attention 1
    assert a[("learned", "direct")] == 1.0 and a[("learned", "via MLPs")] == 2.0
    b = frame[(frame.panel == "b") & (frame.release_order == "B")]
    learned_b = b[b.label.str.startswith("learned")].set_index("part")["value"]
    assert learned_b["via MLPs"] == pytest.approx(2.5 / 6)
    assert np.isclose(learned_b.sum(), 1.0)  # the three shares of one order sum to 1
    assert len(draw(frame).axes) == 2


def test_lane_heads_counts_positive_and_repeats(tmp_path):
    runs = [train_log(tmp_path / "l.parquet", "m", "learned")]
    rows = []
    for split, e in (("discovery", [[0.1, 0.9], [0.8, 0.7]]), ("evaluation", [[0, 1], [-1, 2]])):
        for layer in range(2):
            for head in range(2):
                rows.append(
                    {
                        "model": "m",
                        "seed": 42,
                        "task": "sva",
                        "split": split,
                        "layer": layer,
                        "head": head,
                        "e": float(e[layer][head]),
                        "p": 0.0,
                    }
                )
    path = tmp_path / "h.parquet"
    results.HEADS.write(path, pd.DataFrame(rows))
    table = TABLES["lane_heads"].function()({"runs": runs, "heads": [str(path)]})
    row = table.frame.iloc[0]
    assert row["top3_discovery"] == "L0H1, L1H0, L1H1"
    assert row["n_positive_on_evaluation"] == 2  # L1H0 has e = −1 on evaluation
    assert bool(row["index_repeats"])  # L0H1 and L1H1 share index 1
