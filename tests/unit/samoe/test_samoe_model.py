"""The three SA-MoE architectures (SAMOE §5, §9): Top-k ties, gates, dispatch against a dense
mixture, step-0 equalities (K1), state bounds (K2), aux losses and the named sites."""

import math

import pytest
import torch

from headgeom.checks import CheckFailed
from headgeom.samoe.capture import capture, check_state_bounds, check_step0
from headgeom.samoe.config import VARIANTS, MoEConfig
from headgeom.samoe.model import (
    SITE_AXES,
    STATE_SITES,
    gate_weights,
    load_balance_loss,
    site,
    top_k,
    z_loss,
)
from headgeom.samoe.upcycle import upcycle
from tests.helpers.samoe import CFG, MOE, dense_gpt, random_model, reference_forward, token_ids


def test_top_k_breaks_ties_to_the_lower_index():
    z = torch.tensor([
        [0.0, 3.0, 1.0, 3.0, 3.0],  # three-way tie at the top: 1, 3 (4 excluded)
        [2.0, 2.0, 2.0, 2.0, 2.0],  # all equal: 0, 1, 2
        [1.0, 0.5, 7.0, 0.5, -1.0],  # 2 first, then 0; tie for third between 1 and 3
    ])  # fmt: skip
    ids, logits = top_k(z, 3)
    assert ids.tolist() == [[1, 3, 4], [0, 1, 2], [2, 0, 1]]
    assert logits.tolist() == [[3.0, 3.0, 3.0], [2.0, 2.0, 2.0], [7.0, 1.0, 0.5]]


def test_gates_are_the_full_softmax_kept_for_the_selected():
    z = torch.tensor([[1.0, 2.0, 0.0, -1.0]])
    ids, _ = top_k(z, 2)
    e = [math.exp(v) for v in (1.0, 2.0, 0.0, -1.0)]
    g = gate_weights(z, ids, "softmax_topk_unnormalised")[0]
    assert g.tolist() == pytest.approx([e[1] / sum(e), e[0] / sum(e)])
    g = gate_weights(z, ids, "softmax_topk_renormalised")[0]
    assert g.tolist() == pytest.approx([e[1] / (e[0] + e[1]), e[0] / (e[0] + e[1])])


@pytest.mark.parametrize("variant", ["latest", "persistent"])
def test_dispatch_equals_a_dense_mixture(variant):
    """Dropless per-expert dispatch = every expert on every token masked by the Top-2."""
    model = random_model(variant, seed=1, write_std=0.7, dtype=torch.float64)
    ids = token_ids(2, 24, seed=1)
    ref = reference_forward(model, ids)
    with torch.no_grad():
        out = model(ids)
    cap = capture(model, ids, dtype=torch.float64)
    assert torch.allclose(out, ref["logits"], atol=1e-12, rtol=0)
    assert torch.allclose(cap.logits, ref["z"], atol=1e-12, rtol=0)
    assert torch.allclose(cap.state, ref["state"], atol=1e-12, rtol=0)


def _upcycled(variant, moe=MOE, seed=42):
    return upcycle(dense_gpt().state_dict(), CFG, moe, variant, seed).eval()


def test_step0_writes_are_zero_and_state_variants_agree_bitwise():
    """K1: at step 0 every realised write is exactly 0, and P and LWO logits are equal."""
    ids = token_ids(2, 24)
    caps = {v: capture(_upcycled(v), ids) for v in ("latest", "persistent")}
    for cap in caps.values():
        assert torch.count_nonzero(cap.state) == 0 and torch.count_nonzero(cap.delta) == 0
    assert torch.equal(caps["latest"].logits, caps["persistent"].logits)
    assert torch.equal(caps["latest"].output_logits, caps["persistent"].output_logits)
    record = check_step0(caps["latest"], caps["persistent"])
    assert record["check_K1.writes_mismatches"] == record["check_K1.logits_mismatches"] == 0
    moving = capture(random_model("persistent", seed=1), ids)
    with pytest.raises(CheckFailed, match="K1.writes"):
        check_step0(caps["latest"], moving)


def test_step0_ordinary_is_bitwise_the_state_variants_with_a_shared_w_x():
    """With ``router_x_init: state_block`` and s = 0 all three variants compute the same."""
    moe = MoEConfig(**{**MOE.to_dict(), "router_x_init": "state_block"})
    ids = token_ids(2, 24)
    caps = {v: capture(_upcycled(v, moe), ids) for v in VARIANTS}
    for v in ("latest", "persistent"):
        assert torch.equal(caps[v].logits, caps["ordinary"].logits)
        assert torch.equal(caps[v].output_logits, caps["ordinary"].output_logits)


def test_step0_ordinary_logits_are_rescaled_with_their_own_fan_in():
    """Default ``own_fan_in``: the ordinary W^x is the same draw at fan-in d, so its step-0
    logits are sqrt((d + r)/d) × the state variants' and the Top-2 sets agree."""
    ids = token_ids(2, 24)
    ordinary, persistent = (
        capture(_upcycled("ordinary"), ids),
        capture(_upcycled("persistent"), ids),
    )
    d, r = CFG.d_model, MOE.state_dim
    ratio = math.sqrt((d + r) / d)
    # layer 0 reads the same x in both (experts and gates differ only after it)
    assert torch.allclose(ordinary.logits[0], ratio * persistent.logits[0], atol=1e-6)
    assert torch.equal(ordinary.top_ids[0, ..., :2], persistent.top_ids[0, ..., :2])


@pytest.mark.parametrize("variant, bound", [("latest", 1.0), ("persistent", 5.0)])
def test_state_bounds(variant, bound):
    """K2: |s| ≤ 5 (P, the clamp reached by drifting writes) and |s| ≤ 1 (LWO)."""
    cap = capture(random_model(variant, seed=2, write_std=1.0, drift=4.0), token_ids(3, 24))
    assert cap.state.abs().max() <= bound
    assert check_state_bounds(cap, variant, 5.0)["check_K2_max_abs_residual"] == 0.0
    if variant == "persistent":
        assert (cap.state.abs() == bound).float().mean() > 0.05  # the clamp is active
        with pytest.raises(CheckFailed, match="K2"):  # a P state read as LWO's breaks |s| ≤ 1
            check_state_bounds(cap, "latest", 5.0)


def test_named_sites_and_axes():
    for variant in VARIANTS:
        points = random_model(variant).hook_points()
        for layer in range(CFG.n_layer):
            for name in SITE_AXES:
                if name == "hook_resid_final":
                    continue
                present = site(layer, name) in points
                assert present == (variant != "ordinary" or name not in STATE_SITES)
        assert "hook_resid_final" in points
    assert SITE_AXES["hook_state_out"] == ("batch", "position", "state")
    assert SITE_AXES["hook_router_logits"] == ("batch", "position", "expert")
    with pytest.raises(KeyError):
        site(0, "hook_mlp_out")


def test_a_hook_replaces_the_state_the_next_router_reads():
    model = random_model("persistent", seed=3)
    ids = token_ids(1, 24)
    seen = {}
    fns = {site(2, "hook_state_out"): lambda s: torch.zeros_like(s),
           site(3, "hook_state_in"): lambda s: seen.setdefault("s", s.clone())}  # fmt: skip
    with torch.no_grad(), model.hooks(fns):
        model(ids)
    assert torch.count_nonzero(seen["s"]) == 0


def test_aux_losses_by_hand():
    # two tokens, two experts, top-1: token 0 -> expert 0, token 1 -> expert 0
    z = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # probs (3/4, 1/4), (1/2, 1/2)
    ids = torch.tensor([[0], [0]])
    # f = (1, 0), P = (5/8, 3/8): E Σ f P = 2 · 5/8
    assert load_balance_loss(z, ids).item() == pytest.approx(1.25)
    assert z_loss(z).item() == pytest.approx((math.log(4.0) ** 2 + math.log(2.0) ** 2) / 2)
    uniform = torch.zeros(4, 4)
    assert load_balance_loss(uniform, torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]])).item() == 1.0


def test_forward_returns_layer_mean_aux_losses():
    model = random_model("ordinary", seed=4)
    ids = token_ids(2, 24)
    _, aux = model(ids, return_aux=True)
    cap = capture(model, ids)
    zl = sum(z_loss(cap.logits[i]) for i in range(CFG.n_layer)) / CFG.n_layer
    assert aux.z_loss.item() == pytest.approx(zl.item(), rel=1e-6)
    assert aux.load_balance.item() > 0


def test_state_geometry_by_hand():
    from headgeom.samoe.capture import Capture, state_geometry

    state = torch.zeros(3, 1, 2, 2)  # (N + 1, B, T, r) with N = 2
    state[1, 0, 0] = torch.tensor([3.0, 4.0])  # norm 5, one coordinate below the clamp
    state[1, 0, 1] = torch.tensor([5.0, -5.0])  # both at the clamp
    empty = torch.zeros(2, 1, 2, 4)
    cap = Capture(router_in=empty, logits=empty, top_ids=empty.long(), top_logits=empty,
                  attn_out=empty, shared_out=empty, routed_out=empty, resid_final=empty[0],
                  output_logits=empty[0], state=state)  # fmt: skip
    rows = state_geometry(cap, clamp=5.0)
    assert rows[0] == {"layer": 0, "mean_norm": 0.0, "clamp_fraction": 0.0}
    assert rows[1]["mean_norm"] == pytest.approx((5.0 + 50**0.5) / 2)
    assert rows[1]["clamp_fraction"] == pytest.approx(2 / 4)
