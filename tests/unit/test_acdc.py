"""ACDC (docs §15.4). The engine (``acdc.Circuit``) makes exactly the decisions of the
implementation before it (``tests/reference_acdc.py``) on random models of every geometry the
edge engine serves, float64 and float32, with and without a shared prefix, its metric values
within their rounding tolerance (both routes' logits within δ of the exact ones); a rejected
trial leaves its state bit for bit as it was, and the state it reaches equals the one built
afresh for the same circuit; ``reader.read_heads`` is the reader on the chosen heads. Its clean
circuit is the model's forward; its metric with one head → Q/K/V edge removed is that edge's
KL by the test's naive float64 definition (every geometry, float64 and float32); on a model
with a planted two-edge circuit it finds exactly that circuit; its decisions match an
independent hooked recomputation within their rounding tolerance; the circuit at threshold
0.001 is the one the earlier first-order KL formula gave."""

from __future__ import annotations

import functools
from unittest import mock

import numpy as np
import pytest
import torch

from headgeom.heads.analysis import acdc as A
from headgeom.heads.analysis import edges as E
from headgeom.heads.analysis.edges import final_logits
from headgeom.heads.analysis.tolerance import forward_tolerance, model_dtype, rounding_tolerance
from headgeom.model.geometries import READ_TYPES
from tests import reference_acdc
from tests.helpers.edges import EDGE_GEOMETRIES, assert_exact, float32_floor, naive_edge_kl
from tests.helpers.edges import edge_model as zoo_model
from tests.helpers.examples import random_pairs
from tests.helpers.models import N_VOCAB, multiscreen_model
from tests.tolerances import largest


def batch(pairs):
    return tuple(torch.as_tensor(np.stack(a)) for a in pairs[:2])


def shared_prefix_pairs(n: int, T: int, p: int, seed: int = 0):
    """(clean, ref) of n random prompts of length T whose references differ from the clean
    ones at position p (example 0) or later (the others): the batch's first difference is p."""
    rng = np.random.default_rng(seed)
    clean = rng.integers(0, N_VOCAB, (n, T))
    ref = clean.copy()
    for i in range(n):
        t = p if i == 0 else int(rng.integers(p, T - 1))
        ref[i, t] = (clean[i, t] + 1 + rng.integers(0, N_VOCAB - 1)) % N_VOCAB
    return list(clean), list(ref)


def test_clean_circuit_is_the_model_forward():
    for geometry in ("learned", "all-rotated", "value384"):
        model = zoo_model(geometry)
        clean, ref = batch(random_pairs(4, (6,)))
        circuit = A.Circuit(model, clean, ref)
        logits = final_logits(model, circuit.final_residual()[:, None])
        want = model(clean, last_only=True)
        tol = forward_tolerance(model, largest(want))  # the routes part at the embedding
        torch.testing.assert_close(logits, want, rtol=0, atol=tol)
        assert 0 <= circuit.metric < 1e-12


@pytest.mark.parametrize("geometry", EDGE_GEOMETRIES)
def test_read_heads_is_the_reader_on_those_heads(geometry):
    for dtype in (torch.float64, torch.float32):
        model = zoo_model(geometry).to(dtype)
        H = model.cfg.n_head
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(7, 2, 3, model.cfg.d_model, generator=gen, dtype=dtype)
        heads = torch.randint(0, H, (7,), generator=gen)
        kinds = torch.tensor([0, 1, 2, 2, 1, 0, 2])
        for block in model.blocks:
            got = block.attn.reader.read_heads(x, heads, kinds)
            want = torch.stack(
                [block.attn.reader(x[n])[kinds[n]][..., heads[n], :] for n in range(7)]
            )
            tol = rounding_tolerance(dtype, largest(want), 1)  # one reader, summed otherwise
            torch.testing.assert_close(got, want, rtol=0, atol=tol)


CASES = [
    pytest.param(g, dtype, p, id=f"{g}-{name}-p{p}")
    for dtype, name, p in ((torch.float64, "float64", 0), (torch.float32, "float32", 3))
    for g in EDGE_GEOMETRIES
]


@functools.cache
def both_runs(geometry: str, dtype: torch.dtype, p: int):
    """The engine's and the reference's ACDC at threshold 5e-4 on 4 prompts of length 7
    whose first clean/reference difference is at p (0: no shared prefix), and per decision
    the tolerances of its metric values before and after: both routes' logits are within δ
    of the exact ones, so their KLs differ by at most twice the mean ``kl_rounding_bound``
    (as ``acdc``'s checks), taken at the engine's logits of each circuit."""
    model = zoo_model(geometry).to(dtype)
    clean, ref = batch(shared_prefix_pairs(4, 7, p, seed=5))
    delta, kl, bounds = E.logit_rounding(model), A.Circuit.kl, {}

    def recorded(self, final):  # every metric value the engine gives comes from a call here
        value = kl(self, final)
        logits = final_logits(model, final[:, None])
        bounds[value] = 2 * float(E.kl_rounding_bound(self.clean_logp, logits, delta).mean())
        return value

    with mock.patch.object(A.Circuit, "kl", recorded):
        new = A.acdc(model, clean, ref, threshold=5e-4, n_checks=0)
    old = reference_acdc.acdc(model, clean, ref, threshold=5e-4, n_checks=0)
    return new, old, [(bounds[d[2]], bounds[d[3]]) for d in new.decisions]


@pytest.mark.parametrize(("geometry", "dtype", "p"), CASES)
def test_engine_makes_the_reference_decisions(geometry, dtype, p):
    new, old, tolerances = both_runs(geometry, dtype, p)
    assert [d[:2] + (d[4],) for d in new.decisions] == [d[:2] + (d[4],) for d in old.decisions]
    assert set(new.kept) == set(old.kept)
    for a, b, (tol_before, tol_after) in zip(new.decisions, old.decisions, tolerances, strict=True):
        assert abs(a[2] - b[2]) <= tol_before
        assert abs(a[3] - b[3]) <= tol_after
    assert abs(new.final_metric - old.final_metric) <= tolerances[-1][0] + tolerances[-1][1]
    drops = [d[4] for d in new.decisions]
    assert min(sum(drops), len(drops) - sum(drops)) >= 5  # not vacuous: both decisions occur


def test_trials_into_cut_off_nodes_are_the_current_metric():
    # A destination whose node no longer reaches the logits: the engine computes nothing and
    # answers the current metric; the reference recomputes everything and agrees.
    new, old, tolerances = both_runs("all-rotated", torch.float64, 0)
    cut = [
        i
        for i, d in enumerate(new.decisions)
        if d[1] != A.LOGITS and d[2] == d[3] and d[4]  # exactly the current metric, removed
    ]
    assert len(cut) >= 20
    for i in cut:
        assert abs(old.decisions[i][3] - old.decisions[i][2]) <= sum(tolerances[i])


def test_a_kept_trial_restores_the_state_and_a_run_reaches_the_fresh_state():
    model = zoo_model("value384")
    clean, ref = batch(shared_prefix_pairs(4, 7, 2, seed=1))
    circuit = A.Circuit(model, clean, ref)
    removed = set()
    names = ("diff", "read")
    for s, d in A.graph_edges(model.cfg.n_layer, model.cfg.n_head):
        before = {n: getattr(circuit, n).clone() for n in names}
        value = circuit.trial(s, d)
        drop = value - circuit.metric < 3e-3
        circuit.settle(drop)
        if drop:
            removed.add((s, d))
        else:
            for n in names:
                assert torch.equal(getattr(circuit, n), before[n])
    assert 10 < len(removed) < len(A.graph_edges(model.cfg.n_layer, model.cfg.n_head)) - 10
    fresh = A.Circuit(model, clean, ref, removed)
    assert np.array_equal(fresh.alive, circuit.alive)
    final = circuit.final_residual()
    tol = forward_tolerance(model, largest(final))
    torch.testing.assert_close(fresh.final_residual(), final, rtol=0, atol=tol)
    logp, logits = A.hooked_logits(model, clean, ref, removed)
    bound = 2 * float(E.kl_rounding_bound(logp, logits, E.logit_rounding(model)).mean())
    assert abs(fresh.metric - circuit.metric) <= bound


def test_acdc_refuses_models_without_qkv_readers():
    model = multiscreen_model("learned")
    clean, ref = random_pairs(2, (6,))[:2]
    with pytest.raises(ValueError, match="edge_patching"):
        A.acdc(model, clean, ref, threshold=0.001)


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
        circuit = A.Circuit(model, *(torch.as_tensor(np.stack(a)) for a in (clean, ref)))
        got = []
        for wl, wh, rl, rh, x in zip(*(a.tolist() for a in edges.arrays()), strict=True):
            got.append(circuit.trial(("head", wl, wh), (READ_TYPES[x].lower(), rl, rh)))
            circuit.settle(False)
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
    def first_order(self, final):
        h = E.final_state(self.model, final[:, None])
        p = self.clean_logp.exp()
        w = self.model.wte.weight
        lse = torch.logsumexp((h @ w.T).double(), -1)
        kl = (p * self.clean_logp).sum(-1) - (h.double() * (p @ w.double())).sum(-1) + lse
        return float(kl.mean())

    monkeypatch.setattr(A.Circuit, "kl", first_order)
    old = A.acdc(model, clean, ref, threshold=1e-3, n_checks=0)
    assert [d[4] for d in old.decisions] == [d[4] for d in result.decisions]
    assert set(old.kept) == set(result.kept)
    drift = max(abs(a[3] - b[3]) for a, b in zip(old.decisions, result.decisions, strict=True))
    # They differ only in the rounding of the unembedding of one final state (Σ p·b rounded or
    # not, and the log-sum-exp's product): 2 stages at the weight bound on every logit
    # (Cauchy–Schwarz, whatever the circuit)
    tol = rounding_tolerance(model_dtype(model), E.logit_scale(model), 2)
    assert 0 < drift <= tol < 1e-3 / 10  # the formulas differ, by far less than the threshold
