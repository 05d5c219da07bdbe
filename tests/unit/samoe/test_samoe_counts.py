"""Counts, FLOPs and trace sizes (SAMOE §8, K5): the paper's derived numbers from the shapes
of §4 alone, and the toy formula against a built model's tensors."""

import pytest

from headgeom.samoe.config import VARIANTS, MoEConfig
from headgeom.samoe.counts import GEMMA, SMOLLM2, counts, model_counts, toy_shape, trace_sizes
from tests.helpers.samoe import CFG, MOE, random_model

PAPER_MOE = MoEConfig(state_dim=128)


def pct(new, old):
    return 100 * (new / old - 1)


@pytest.mark.parametrize(
    "shape, flops_m, overhead_pct, active_pct, state_flops_m, total_b",
    [(SMOLLM2, 729.58, 0.62, 0.77, 4.547, 1.41), (GEMMA, 876.19, 0.34, 0.37, 3.023, 1.40)],
    ids=["smollm2", "gemma"],
)
def test_paper_numbers_from_the_shapes(shape, flops_m, overhead_pct, active_pct,
                                       state_flops_m, total_b):  # fmt: skip
    ordinary = counts(shape, PAPER_MOE, "ordinary")
    p, lwo = counts(shape, PAPER_MOE, "persistent"), counts(shape, PAPER_MOE, "latest")
    assert p == lwo  # P and LWO have identical counts
    assert ordinary.flops_per_token / 1e6 == pytest.approx(flops_m, abs=0.005)
    assert (p.flops_per_token - ordinary.flops_per_token) / 1e6 == pytest.approx(
        state_flops_m, abs=0.0005)  # fmt: skip
    assert pct(p.flops_per_token, ordinary.flops_per_token) == pytest.approx(overhead_pct, abs=0.01)
    assert pct(p.active, ordinary.active) == pytest.approx(active_pct, abs=0.01)
    assert ordinary.total / 1e9 == pytest.approx(total_b, abs=0.005)


def test_smollm2_active_matmul_weights_are_the_spec_integer():
    assert counts(SMOLLM2, PAPER_MOE, "ordinary").active_matmul == 294_008_832
    assert counts(GEMMA, PAPER_MOE, "ordinary").active_matmul == 409_784_320


def test_paper_trace_sizes():
    for shape, writes, total in ((SMOLLM2, 15.00, 15.70), (GEMMA, 9.00, 9.42)):
        t = trace_sizes(shape, PAPER_MOE)
        assert t.writes == pytest.approx(writes, abs=0.005)
        assert t.live_state == pytest.approx(0.50, abs=0.005)
        assert t.writes_and_top3 == pytest.approx(total, abs=0.005)


@pytest.mark.parametrize("variant", VARIANTS)
def test_toy_formula_equals_the_built_model(variant):
    model = random_model(variant)
    total, active = model_counts(model)
    c = counts(toy_shape(CFG), MOE, variant)
    assert (c.total, c.active) == (total, active)
    # active = total − (E − k) routed experts per layer, each with the dense MLP's size
    mlp = 2 * CFG.d_model * CFG.d_mlp + CFG.d_mlp + CFG.d_model
    assert c.total - c.active == CFG.n_layer * (MOE.n_experts - MOE.top_k) * mlp
