"""The tables added for the real-model rehearsal (headgeom.samoe.paper): SAMOE §10.3's
supplement beside the targets, each run's perplexity beside its dense source's, the audit
pilot against a plain forward; and the §8 counts of an imported family from its checkpoint
header (samoe/stages/stats.py). Expected values are computed by hand from the frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from headgeom.samoe import paper
from headgeom.samoe.checkpoint import _save
from headgeom.samoe.hub import HubSource
from headgeom.samoe.stages.stats import counts_frame

EMPTY = pd.DataFrame()


def inputs(**frames) -> paper.Inputs:
    base = {k: EMPTY for k in ("counts", "seed_means", "contrasts", "history", "probes",
                               "rankings", "audit_cost", "runtime", "checks")}  # fmt: skip
    return paper.Inputs(config={}, **{**base, **frames})


def seed_means(rows) -> pd.DataFrame:
    return pd.DataFrame([{"family": "f", "variant": v, "quantity": q, "key": "", "mean": m,
                          "low": math.nan, "high": math.nan, "per_seed": [m], "n_seeds": 1}
                         for v, q, m in rows])  # fmt: skip


def test_every_decision_beside_the_targets_and_the_clamped_coordinates():
    # one persistent run, two layers: kept 3 and 1 decisions; signed over 4 and 2 decisions
    hp = pd.DataFrame({"family": "f", "variant": "persistent", "seed": 42, "layer": [1, 2],
                       "n_decisions": [4, 2], "n_kept": [3, 1], "non_recent": [0.0, 0.8],
                       "ess": [1.0, 3.0], "max_share": [1.0, 0.5],
                       "signed_state_term": [0.5, -1.0]})  # fmt: skip
    records = pd.DataFrame([{"family": "f", "variant": "persistent", "seed": 42,
                             "clamped_final": 7, "coordinates_final": 1000}])  # fmt: skip
    means = seed_means([("persistent", "non_recent", 0.9), ("persistent", "ess", 4.0),
                        ("persistent", "max_share", 0.3),
                        ("persistent", "signed_state_term", 0.2)])  # fmt: skip
    table = paper.table_history_pool(inputs(seed_means=means, history_pool=hp,
                                            pool_records=records))  # fmt: skip
    got = table.frame.set_index("quantity")
    # kept-weighted: NR (3·0 + 1·0.8)/4 = 0.2; ESS (3·1 + 3)/4 = 1.5; max (3·1 + 0.5)/4 = 0.875
    # the signed term over every decision: (4·0.5 + 2·(−1))/6 = 0
    assert got.every_decision.to_dict() == pytest.approx(
        {"non_recent": 0.2, "ess": 1.5, "max_share": 0.875, "signed_state_term": 0.0}
    )
    assert got.targets.to_dict() == pytest.approx(
        {"non_recent": 0.9, "ess": 4.0, "max_share": 0.3, "signed_state_term": 0.2}
    )
    assert set(got.n_decisions) == {6} and set(got.n_kept) == {4}
    assert set(got.clamped_coordinates) == {7} and set(got.write_coordinates) == {1000}
    assert "7 of 1,000" in table.markdown() and "20.000" in table.markdown()


def test_perplexity_beside_the_dense_source():
    records = pd.DataFrame([{"family": "f", "variant": "latest", "seed": 42, "ppl": 11.0,
                             "ppl_dense": 10.0, "ppl_rel_dense": 0.1}])  # fmt: skip
    table = paper.table_quality_dense(inputs(pool_records=records))
    assert "+10.00%" in table.markdown() and "10.000" in table.markdown()
    toy = paper.table_quality_dense(inputs())  # a toy study measures no dense source
    assert toy.frame.empty


def test_the_audit_pilot_against_a_plain_forward():
    a = pd.DataFrame({"family": "f", "variant": "persistent", "seed": 42,
                      "phase": ["capture", "attribution", "gradient", "plain_forward"],
                      "wall_s": [0.3, 0.01, 2.0, 0.2], "passes": [1, 0, 8, 1],
                      "n_targets": [4, 4, 4, 0], "n_objects": [74, 74, 74, 0],
                      "retained_bytes": [10, 0, 0, 0]})  # fmt: skip
    table = paper.table13(inputs(audit_cost=a))
    assert table.frame.plain_ratio.tolist() == pytest.approx([1.5, 0.05, 10.0, 1.0])


def test_counts_of_an_imported_family_are_the_papers(tmp_path):
    """SAMOE §8 [DERIVED]: SmolLM2 with 16 experts and r = 128 at T = 2048: the state adds
    2·30·(576·128 + 16·128) = 4.547M FLOPs to 729.58M, +0.62%."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True)  # fmt: skip
    path = tmp_path / "dense.safetensors"
    _save(path, {}, np.arange(3), {"hub": HubSource.of("x", "y", config).to_dict()})
    moe = {"n_experts": 16, "top_k": 2, "state_dim": 128}
    families = {"s": {"paper_shape": "HuggingFaceTB/SmolLM2-135M"}}
    frame = counts_frame({"s": path}, moe, ["ordinary", "persistent"], families)
    ordinary, persistent = frame.iloc[0], frame.iloc[1]
    attention = 30 * 4 * 2048 * 576
    state = 2 * 30 * (576 * 128 + 16 * 128)
    assert persistent.flops_per_token - ordinary.flops_per_token == state == 4_546_560
    assert ordinary.flops_per_token == 2 * 294_008_832 + attention  # 729.58M
    assert 100 * persistent.flops_rel == pytest.approx(0.623, abs=0.001)
    # at the rehearsal's T = 64 only the attention term shrinks
    frame64 = counts_frame({"s": path}, moe, ["ordinary"], {"s": {**families["s"], "seq_len": 64}})
    assert ordinary.flops_per_token - frame64.iloc[0].flops_per_token == 30 * 4 * (2048 - 64) * 576


def test_one_seed_gets_its_differences_without_an_interval():
    """A one-seed study (the real-model rehearsal): each contrast is that seed's difference,
    with no interval, so a non-inferiority decision is inconclusive, never supported."""
    from headgeom.samoe.stages.stats import contrasts

    values = pd.DataFrame([("f", v, 42, q, "", x) for v, q, x in (
        ("ordinary", "ppl", 10.0), ("persistent", "ppl", 11.0), ("latest", "ppl", 10.0),
        ("persistent", "non_recent", 0.8), ("latest", "non_recent", 0.0))],
        columns=["family", "variant", "seed", "quantity", "key", "value"])  # fmt: skip
    frame = contrasts(values, [42], {"ppl_rel": 0.01, "macro_pp": 1.0}).set_index(
        ["quantity", "variant", "reference"])  # fmt: skip
    ppl = frame.loc[("ppl", "persistent", "ordinary")]
    assert ppl["mean"] == pytest.approx(0.1) and ppl.per_seed == pytest.approx([0.1])  # 11/10 − 1
    assert math.isnan(ppl.low) and math.isnan(ppl.high) and ppl.decision == "inconclusive"
    nr = frame.loc[("non_recent", "persistent", "latest")]
    assert nr["mean"] == pytest.approx(0.8) and nr.n_seeds == 1 and nr.all_positive


def test_the_step0_identity_from_the_seed_registry():
    checks = pd.DataFrame([{"family": "f", "seed": 42, "check_K1.writes_mismatches": 0,
                            "check_K1.logits_mismatches": 0,
                            "check_K1.ordinary_logits_mismatches": 0,
                            "check_K1.ordinary_outputs_max_abs_residual": 0.0,
                            "check_K3.variants_mismatches": 0}])  # fmt: skip
    table = paper.table_step0(inputs(seed_checks=checks))
    assert table.frame.key.tolist() == [key for key, _ in paper.STEP0]  # K1 only, in order
    assert (table.frame.value == 0).all() and set(table.frame.seed) == {42}
