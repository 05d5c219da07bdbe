"""ACDC (docs §15.4): its graph forward is the model's forward; its metric with one head → Q/K/V
edge removed is that edge's KL by the test's naive float64 definition (every geometry, float64
and float32); on a model with a planted two-edge circuit it finds exactly that circuit; its
decisions match an independent hooked recomputation within their rounding tolerance; the
circuit at threshold 0.001 is the one the earlier first-order KL formula gave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.analysis import acdc as A
from headgeom.analysis import edges as E
from headgeom.analysis.edges import final_logits
from headgeom.analysis.tolerance import model_dtype, rounding_tolerance
from headgeom.model.geometries import READ_TYPES
from tests.unit.test_edges import (
    EDGE_GEOMETRIES,
    assert_exact,
    float32_floor,
    naive_edge_kl,
    random_pairs,
    zoo_model,
)


def test_graph_forward_is_the_model_forward():
    for geometry in ("learned", "all-rotated", "value384"):
        model = zoo_model(geometry)
        clean, ref = (torch.as_tensor(np.stack(a)) for a in random_pairs(4, (6,))[:2])
        graph = A.Graph(model, clean, ref)
        torch.testing.assert_close(
            final_logits(model, graph.clean_cache["final"]),
            model(clean, last_only=True),
            rtol=0,
            atol=1e-10,
        )
        assert graph.metric(frozenset(), 0) == 0.0 or abs(graph.metric(frozenset(), 0)) < 1e-12


def planted_model():
    """Only head (0, 0) writes (other heads' W_O and every MLP output are 0) and it attends
    uniformly (W_Q = W_K = 0): the circuit is embedding → (0, 0).V → logits."""
    model = zoo_model("learned")
    H, d = model.cfg.n_head, model.cfg.d_head
    with torch.no_grad():
        for lay, block in enumerate(model.blocks):
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            w = block.attn.writer.c_proj.weight
            keep = w[:, :d].clone() * 3
            w.zero_()
            if lay == 0:
                w[:, :d] = keep
                qk = block.attn.reader.c_attn.weight[: 2 * H * d]
                qk.zero_()
    return model


def test_acdc_recovers_a_planted_two_edge_circuit():
    model = planted_model()
    clean, ref = random_pairs(6, (6,), seed=3)[:2]
    result = A.acdc(model, clean, ref, threshold=1e-3, n_checks=10)
    assert set(result.kept) == {(A.EMBED, ("v", 0, 0)), (("head", 0, 0), A.LOGITS)}
    for _, engine, hooked, tolerance in result.checks:
        assert abs(engine - hooked) <= tolerance < 1e-9


def test_decisions_match_the_hooked_recomputation_on_a_random_model():
    model = zoo_model("all-rotated")  # small frozen writes: a small threshold
    clean, ref = random_pairs(4, (5,), seed=2)[:2]
    result = A.acdc(model, clean, ref, threshold=1e-7, n_checks=12)
    assert len(result.checks) == 12
    for _, engine, hooked, tolerance in result.checks:
        assert abs(engine - hooked) <= tolerance < 1e-9  # float64: δ ~ 1e-13
    assert 0 < len(result.kept) < len(A.graph_edges(3, 4))


@pytest.mark.parametrize("geometry", EDGE_GEOMETRIES)
def test_metric_of_one_removed_edge_is_the_edge_kl(geometry):
    # Removing head i → X of head j feeds X the input x − (out_i − out_i^ref) = x + δ_i: the
    # edge patch of docs §15.1, so the metric is the mean edge KL of the naive definition.
    model = zoo_model(geometry)
    L, H = model.cfg.n_layer, model.cfg.n_head
    clean, ref = random_pairs(4, (6,), seed=4)[:2]
    edges = E.all_edges(L, H).subset(np.random.default_rng(0).choice(E.edge_count(L, H), 12, False))
    expected, sens = naive_edge_kl(model, clean, ref, edges)
    for dtype in (torch.float64, torch.float32):
        model = model.to(dtype)
        graph = A.Graph(model, *(torch.as_tensor(np.stack(a)) for a in (clean, ref)))
        got = []
        for wl, wh, rl, rh, x in zip(*(a.tolist() for a in edges.arrays()), strict=True):
            removed = frozenset({(("head", wl, wh), (READ_TYPES[x].lower(), rl, rh))})
            got.append(graph.metric(removed, rl))
            assert got[-1] >= 0
        if dtype == torch.float64:
            assert_exact(np.array(got), expected.mean(0))
        else:
            floor = float32_floor(model, sens).mean(0)
            np.testing.assert_array_less(np.abs(np.array(got) - expected.mean(0)), floor)
    assert expected.mean(0).max() > 1e-6  # not vacuous (all-common-axis: 8e-6)


@pytest.fixture(scope="module")
def float32_run():
    model = zoo_model("learned", seed=1).float()
    clean, ref = random_pairs(4, (6,), seed=3)[:2]
    return model, clean, ref, A.acdc(model, clean, ref, threshold=1e-3, n_checks=8)


def test_float32_decisions_match_the_hooked_recomputation_within_their_tolerance(float32_run):
    *_, result = float32_run
    assert len(result.checks) == 8
    for _, engine, hooked, tolerance in result.checks:
        assert abs(engine - hooked) <= tolerance < 1e-4  # 1e-4: well below the threshold
    assert 0 < len(result.kept) < len(A.graph_edges(3, 4))  # not vacuous


def test_circuit_is_the_one_of_the_first_order_formula(float32_run, monkeypatch):
    # The formula before docs §15.1's exact KL (neg_entropy − ē·h + logsumexp(b), float32
    # rounding of b at first order, ~1e-6) moves no decision at threshold 0.001.
    model, clean, ref, result = float32_run

    @torch.no_grad()
    def first_order(self, removed, start):
        _, cache = self.run(None, removed, start)
        h = E.final_state(self.model, cache["final"])
        p = self.clean_logp.exp()
        w = self.model.wte.weight
        lse = torch.logsumexp((h @ w.T).double(), -1)
        kl = (p * self.clean_logp).sum(-1) - (h.double() * (p @ w.double())).sum(-1) + lse
        return float(kl.mean())

    monkeypatch.setattr(A.Graph, "metric", first_order)
    old = A.acdc(model, clean, ref, threshold=1e-3, n_checks=0)
    assert [d[4] for d in old.decisions] == [d[4] for d in result.decisions]
    assert set(old.kept) == set(result.kept)
    drift = max(abs(a[3] - b[3]) for a, b in zip(old.decisions, result.decisions, strict=True))
    # They differ only in the rounding of the unembedding of one final state (Σ p·b rounded or
    # not, and the log-sum-exp's product): 2 stages at the weight bound on every logit
    # (Cauchy–Schwarz, whatever the circuit)
    tol = rounding_tolerance(model_dtype(model), E.logit_scale(model), 2)
    assert 0 < drift <= tol < 1e-3 / 10  # the formulas differ, by far less than the threshold
