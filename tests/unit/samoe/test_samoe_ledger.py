"""The routing ledger (SAMOE §10): the telescoping identity on random models of each state
variant (clamp active or not), logit reconstruction (K6, K7), LWO's structural attribution,
E4 on a hand-computed case, and state-only replay (K8)."""

import math

import pytest
import torch

from headgeom.checks import CheckFailed
from headgeom.samoe.capture import capture
from headgeom.samoe.ledger import (
    Targets,
    check_ledger,
    check_replay,
    history_metrics,
    ledger,
    logit_reconstruction_residual,
    margin_residual,
    reconstruction_residual,
    replay_residual,
    state_only_replay,
    structural_attribution,
)
from tests.helpers.samoe import CFG, MOE, MOE_CLAMPED, random_model, token_ids

N = CFG.n_layer


def every_target(B: int, T: int, first_layer: int = 1) -> Targets:
    """Every decision at layers ≥ ``first_layer``."""
    grid = torch.cartesian_prod(torch.arange(B), torch.arange(T), torch.arange(first_layer, N))
    return Targets(grid[:, 0], grid[:, 1], grid[:, 2])


CASES = {  # name: (variant, moe, random_model kwargs)
    "latest": ("latest", MOE, {"write_std": 0.8}),
    "persistent": ("persistent", MOE, {"write_std": 0.8}),
    "persistent-clamped": ("persistent", MOE_CLAMPED, {"write_std": 1.0, "drift": 3.0}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_ledger_identity(case, dtype, tol):
    variant, moe, kwargs = CASES[case]
    model = random_model(variant, seed=5, moe=moe, dtype=dtype, **kwargs)
    ids = token_ids(3, 24, seed=5)
    cap = capture(model, ids, dtype=dtype)
    assert cap.delta.abs().max() > 0.1  # writes are not trivial
    if case.endswith("clamped"):  # the clamp acts on states that routers read
        assert (cap.state[1:N].abs() == moe.clamp).float().mean() > 0.05
        assert not torch.allclose(cap.delta, cap.write_proposal)
    targets = every_target(3, 24)
    led = ledger(model, cap, targets)
    k6, margin, k7 = (reconstruction_residual(led), margin_residual(led),
                      logit_reconstruction_residual(model, cap))  # fmt: skip
    print(f"\n{case} {dtype}: K6 {k6:.3g}  E3 margin {margin:.3g}  K7 {k7:.3g}")
    assert k6 <= tol and margin <= tol and k7 <= tol
    assert (led.margin >= 0).all()  # e2 is selected, e3 excluded
    assert led.state_term.abs().max() > 0.1
    assert torch.count_nonzero(led.contributions[~led.eligible]) == 0
    check_ledger(model, cap, led)


def test_ledger_check_names_residual_and_tolerance():
    model = random_model("persistent", seed=6)
    cap = capture(model, token_ids(2, 24))
    led = ledger(model, cap, every_target(2, 24))
    led.contributions[0, 0] += 1e-3
    with pytest.raises(
        CheckFailed, match=r"K6 failed.*residual\| 0\.00\d+ > tolerance 0\.0001 \(SAMOE §10\.4"
    ):
        check_ledger(model, cap, led)


def test_ordinary_has_no_ledger():
    model = random_model("ordinary")
    cap = capture(model, token_ids(1, 24))
    assert cap.state is None
    assert logit_reconstruction_residual(model, cap) <= 1e-5
    with pytest.raises(ValueError, match="state variant"):
        ledger(model, cap, every_target(1, 24))


def test_history_metrics_by_hand():
    c = torch.zeros(4, N)
    c[0, :3] = torch.tensor([1.0, -2.0, 1.0])  # L = 3
    c[1, :1] = 3.0  # L = 1: one source
    # c[2] = 0 at L = 4: A = 0, dropped
    c[3, :4] = torch.tensor([0.0, 0.5, 0.0, -0.5])  # L = 4
    h = history_metrics(c, torch.tensor([3, 1, 4, 4]))
    assert h.kept.tolist() == [True, True, False, True]
    assert h.mass.tolist() == [4.0, 3.0, 1.0]
    assert h.share[0, :3].tolist() == [0.25, 0.5, 0.25]
    assert h.non_recent.tolist() == [0.75, 0.0, 0.5]
    assert h.ess.tolist() == pytest.approx([1 / (1 / 16 + 1 / 4 + 1 / 16), 1.0, 2.0])
    assert h.max_share.tolist() == [0.5, 1.0, 0.5]
    assert h.signed.tolist() == [0.0, 3.0, 0.0]


def test_lwo_structural_attribution():
    model = random_model("latest", seed=7, write_std=0.8)
    cap = capture(model, token_ids(2, 24))
    targets = every_target(2, 24)
    led = ledger(model, cap, targets)
    struct = structural_attribution(led, targets)
    rows = torch.arange(len(targets))
    assert torch.equal(struct[rows, targets.layer - 1], led.state_term)
    assert torch.count_nonzero(struct.sum(-1) - struct[rows, targets.layer - 1]) == 0
    h = history_metrics(struct, targets.layer)
    assert h.kept.all()
    assert (h.non_recent == 0).all() and (h.ess == 1).all() and (h.max_share == 1).all()


def test_state_only_replay_without_clamps_is_minus_c():
    """K8: s_{l+1} ← s_l replayed to L changes the margin by exactly −c_{l→L}."""
    model = random_model("persistent", seed=8, write_std=0.8)
    cap = capture(model, token_ids(3, 24, seed=8))
    assert cap.state.abs().max() < MOE.clamp  # no clamp anywhere
    targets = every_target(3, 24)
    led = ledger(model, cap, targets)
    rep = state_only_replay(model, cap, targets, led)
    assert not rep.clamp_touched.any()
    k8 = replay_residual(led, rep)
    print(f"\nK8 replay residual {k8:.3g}")
    assert k8 <= 1e-5
    assert rep.margin_change.abs().max() > 0.1
    check_replay(led, rep)


def test_state_only_replay_with_clamps():
    """Where a later clip acts, removal is not −c; elsewhere it still is."""
    model = random_model("persistent", seed=9, moe=MOE_CLAMPED, write_std=1.0, drift=3.0)
    cap = capture(model, token_ids(3, 24, seed=9))
    targets = every_target(3, 24)
    led = ledger(model, cap, targets)
    rep = state_only_replay(model, cap, targets, led)
    assert rep.clamp_touched.any() and (led.eligible & ~rep.clamp_touched).any()
    assert replay_residual(led, rep) <= 1e-5
    gap = (rep.margin_change + led.contributions)[rep.clamp_touched].abs()
    assert gap.max() > 1e-3


def test_lwo_replay_only_moves_the_last_source():
    model = random_model("latest", seed=10, write_std=0.8)
    cap = capture(model, token_ids(2, 24))
    targets = every_target(2, 24, first_layer=2)
    led = ledger(model, cap, targets)
    rep = state_only_replay(model, cap, targets, led)
    rows = torch.arange(len(targets))
    last = targets.layer - 1
    assert torch.allclose(rep.margin_change[rows, last], -led.contributions[rows, last],
                          atol=1e-5)  # fmt: skip
    earlier = led.eligible.clone()
    earlier[rows, last] = False
    assert torch.count_nonzero(rep.margin_change[earlier]) == 0
    assert math.isfinite(replay_residual(led, rep))
