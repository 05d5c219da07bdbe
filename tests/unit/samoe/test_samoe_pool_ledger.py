"""The ledger over every decision of a pool (headgeom.samoe.pool_ledger: SAMOE §10.3's
supplement, K6 over a pool, the clamped coordinates): a hand-built three-layer capture whose
clamp binds, computed by hand; then a random model whose clamp binds, against the targets'
ledger of every decision and a naive count."""

from __future__ import annotations

import math

import pytest
import torch

from headgeom.model.config import ModelConfig
from headgeom.samoe.capture import Capture, capture, captures
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.ledger import Targets, history_metrics, ledger, reconstruction_residual
from headgeom.samoe.model import SAMoE
from headgeom.samoe.pool_ledger import PoolLedger
from tests.helpers.samoe import MOE_CLAMPED, random_model, token_ids

CLAMP = 1.0


def hand_model(variant: str) -> SAMoE:
    """Three layers, three experts, r = 2, clamp 1; W^s of layers 1 and 2 by hand:
    ω_1 = W^s_1[0] − W^s_1[1] = (1, −1), ω_2 = W^s_2[0] − W^s_2[1] = (2, 1)."""
    cfg = ModelConfig(n_layer=3, d_model=8, n_head=2, d_head=4, d_mlp=8, n_ctx=4, n_vocab=5)
    model = SAMoE(cfg, MoEConfig(n_experts=3, top_k=2, state_dim=2, clamp=CLAMP), variant)
    with torch.no_grad():
        for router in model.routers():
            router.W_s.zero_()
        model.routers()[1].W_s[0] = torch.tensor([1.0, 0.0])
        model.routers()[1].W_s[1] = torch.tensor([0.0, 1.0])
        model.routers()[2].W_s[0] = torch.tensor([2.0, 1.0])
    return model


def hand_capture() -> Capture:
    """One token. Persistent writes: u_0 = (0.9, −0.5), u_1 = (0.9, −0.9), u_2 = (0.5, 0):
    s_1 = (0.9, −0.5); s_1 + u_1 = (1.8, −1.4) is clipped to s_2 = (1, −1) (both coordinates
    clamp: Δ_1 = (0.1, −0.5), not u_1); s_2 + u_2 = (1.5, −1) to s_3 = (1, −1) (one coordinate
    clamps; −1 sits on the bound, not beyond it). The clean ranking at every layer is
    e1 = 2, e2 = 0, e3 = 1, so the boundary pair is (0, 1)."""
    s = torch.tensor([[0.0, 0.0], [0.9, -0.5], [1.0, -1.0], [1.0, -1.0]])
    u = torch.tensor([[0.9, -0.5], [0.9, -0.9], [0.5, 0.0]])
    ranked = torch.tensor([2, 0, 1])
    logits = torch.tensor([2.0, 1.0, 3.0])  # z[2] > z[0] > z[1]: ranks 2, 0, 1
    N = 3
    return Capture(
        router_in=torch.zeros(N, 1, 1, 8),
        logits=logits.expand(N, 1, 1, 3).clone(),
        top_ids=ranked.expand(N, 1, 1, 3).clone(),
        top_logits=logits[ranked].expand(N, 1, 1, 3).clone(),
        state=s[:, None, None, :],
        write_proposal=u[:, None, None, :],
    )


def test_the_ledger_stays_exact_where_the_clamp_binds():
    model, cap = hand_model("persistent"), hand_capture()
    led = ledger(model, cap, Targets([0], [0], [2]))
    # c_{0→2} = (2, 1)·(0.9, −0.5) = 1.3; c_{1→2} = (2, 1)·(0.1, −0.5) = −0.3 (the clipped
    # write, not u_1 = (0.9, −0.9), which would give 0.9); Σ = 1.0 = ωᵀ s_2 = (2, 1)·(1, −1)
    assert led.contributions[0].tolist() == pytest.approx([1.3, -0.3, 0.0], abs=1e-6)
    assert float(led.state_term[0]) == pytest.approx(1.0, abs=1e-6)
    assert reconstruction_residual(led) <= 1e-6


def test_pool_ledger_of_the_hand_built_capture():
    pool = PoolLedger(hand_model("persistent"))
    pool.add(hand_capture())
    layer1, layer2 = pool.rows()
    # L = 1: one source, c_{0→1} = (1, −1)·(0.9, −0.5) = 1.4: NR 0, ESS 1, signed 1.4
    assert layer1 == pytest.approx({"layer": 1, "n_decisions": 1, "n_kept": 1, "non_recent": 0.0,
                                    "ess": 1.0, "max_share": 1.0, "signed_state_term": 1.4},
                                   abs=1e-6)  # fmt: skip
    # L = 2: c = (1.3, −0.3), A = 1.6, p = (0.8125, 0.1875): NR = 1 − 0.1875,
    # ESS = 1 / (0.8125² + 0.1875²), largest share 0.8125, signed 1.0
    ess = 1 / (0.8125**2 + 0.1875**2)
    assert layer2 == pytest.approx({"layer": 2, "n_decisions": 1, "n_kept": 1,
                                    "non_recent": 0.8125, "ess": ess, "max_share": 0.8125,
                                    "signed_state_term": 1.0}, abs=1e-6)  # fmt: skip
    assert pool.residual <= 1e-6
    # the clip acted on 2 coordinates at write 1 and 1 at write 2, of 6
    assert (pool.clamped, pool.coordinates) == (3, 6)
    assert pool.check()["check_K6_max_abs_residual"] <= 1e-6


def test_lwo_gets_its_structural_attribution_and_no_clamp():
    pool = PoolLedger(hand_model("latest"))
    pool.add(hand_capture())  # the same numbers read as an LWO record
    layer2 = pool.rows()[1]
    assert (layer2["non_recent"], layer2["ess"], layer2["max_share"]) == (0.0, 1.0, 1.0)
    assert layer2["signed_state_term"] == pytest.approx(1.0, abs=1e-6)
    assert pool.clamped == 0


def test_a_binding_clamp_on_a_random_model_keeps_every_decision_exact():
    model = random_model("persistent", seed=3, moe=MOE_CLAMPED, write_std=1.0, drift=3.0)
    ids = token_ids(4, 24, seed=3)
    pool = PoolLedger(model)
    for _, chunk in captures(model, ids, 2, ("state", "write_proposal")):
        pool.add(chunk)
    cap = capture(model, ids)
    # a naive count of the coordinates the clip acted on, write by write
    s, u, c = cap.state, cap.write_proposal, MOE_CLAMPED.clamp
    naive = sum(int(((s[layer] + u[layer]).abs() > c).sum()) for layer in range(len(u)))
    assert naive > 0 and pool.clamped == naive and pool.coordinates == u.numel()
    assert pool.residual <= 1e-5
    # per layer: the targets' E4 of every decision at that layer, averaged by hand
    N = cap.n_layer
    for row in pool.rows():
        L = row["layer"]
        grid = torch.cartesian_prod(torch.arange(4), torch.arange(24))
        targets = Targets(grid[:, 0], grid[:, 1], torch.full((len(grid),), L))
        hist = history_metrics(ledger(model, cap, targets).contributions, targets.layer)
        assert row["n_decisions"] == len(grid) and row["n_kept"] == int(hist.kept.sum())
        for name in ("non_recent", "ess", "max_share"):
            assert row[name] == pytest.approx(float(getattr(hist, name).double().mean()),
                                              rel=1e-5, abs=1e-6)  # fmt: skip
        assert not math.isnan(row["signed_state_term"]) and L < N
