"""Source suppression (SAMOE E7, §14.2–14.3; K11) against a hand-written forward that is
re-run once per (target, source), and the local attenuation set-change rate (E5, §12; K9)."""

import pytest
import torch
from torch.nn import functional as F

from headgeom.checks import CheckFailed
from headgeom.samoe.capture import capture
from headgeom.samoe.ledger import Targets, boundary_pair
from headgeom.samoe.model import site
from headgeom.samoe.suppression import (
    Rows,
    attenuated_logits,
    check_hook_no_op,
    check_unit_lambda,
    jaccard_distance,
    set_change,
    set_change_rates,
    suppressed_forward,
    suppression_hooks,
    suppression_outcomes,
)
from headgeom.samoe.upcycle import upcycle
from tests.helpers.samoe import (
    CFG,
    MOE,
    MOE_CLAMPED,
    dense_gpt,
    random_model,
    reference_forward,
    token_ids,
)

N = CFG.n_layer
TARGETS = Targets(batch=[0, 1, 2, 1], position=[5, 17, 23, 0], layer=[5, 3, 4, 2])


def _rows():
    return Rows(batch=[0, 1, 2, 2, 0], position=[3, 9, 20, 0, 23], source=[0, 2, 4, 1, 5])


@pytest.mark.parametrize("variant", ["latest", "persistent"])
def test_alpha_one_is_bitwise_the_clean_forward(variant):
    """K11: with the hooks attached at α = 1 nothing changes, to the bit."""
    model = random_model(variant, seed=11, write_std=0.8)
    ids, rows = token_ids(3, 24, seed=11), _rows()
    z, out = suppressed_forward(model, ids, rows, alpha=1.0)
    with torch.no_grad():
        plain = model(ids[rows.batch])
    assert torch.equal(out, plain)
    assert torch.count_nonzero(z) > 0
    assert check_hook_no_op(model, ids, rows)["check_K11_mismatches"] == 0
    with pytest.raises(CheckFailed, match="K11"):  # real writes: α = 0 changes the logits
        check_hook_no_op(model, ids, rows, alpha=0.0)


@pytest.mark.parametrize("variant", ["latest", "persistent"])
def test_suppressing_a_zero_write_is_a_no_op(variant):
    """K11: at step 0 every write is 0, so s_{l+1} ← s_l changes nothing."""
    model = upcycle(dense_gpt().state_dict(), CFG, MOE, variant, 42).eval()
    ids, rows = token_ids(3, 24), _rows()
    _, out = suppressed_forward(model, ids, rows, alpha=0.0)
    with torch.no_grad():
        assert torch.equal(out, model(ids[rows.batch]))
    check_hook_no_op(model, ids, rows, alpha=0.0)
    res = suppression_outcomes(model, ids, capture(model, ids), TARGETS)
    assert res.margin_change.abs().max() <= 1e-6
    assert res.output_kl.abs().max() <= 1e-6
    assert torch.nan_to_num(res.jaccard_downstream).abs().max() == 0


def test_suppression_replaces_the_outgoing_state_by_the_incoming_one():
    """In the engine's own forward, router l + 1 reads s_l at the selected token only."""
    model = random_model("persistent", seed=12, write_std=0.8)
    ids = token_ids(3, 24, seed=12)
    rows = Rows(batch=[1], position=[7], source=[2])
    fns = suppression_hooks(rows, N, alpha=0.0)
    seen = {}
    for layer in (2, 3):
        keep = fns[site(layer, "hook_state_in")]
        fns[site(layer, "hook_state_in")] = lambda s, k=keep, i=layer: (
            seen.__setitem__(i, s.clone()), k(s))[1]  # fmt: skip
    with torch.no_grad(), model.hooks(fns):
        model(ids[rows.batch])
    clean = capture(model, ids[rows.batch])
    assert torch.equal(seen[3][0, 7], seen[2][0, 7])  # Δ_2 removed at the token
    others = torch.ones(24, dtype=torch.bool)
    others[7] = False
    assert torch.allclose(seen[3][0, others], clean.state[3][0, others], atol=1e-6)
    assert not torch.allclose(clean.state[3][0, 7], clean.state[2][0, 7])


def _naive_outcomes(model, ids, cap, targets):
    """The full model re-run by hand once per (target, source)."""
    e2, e3 = boundary_pair(cap, targets)
    rows = []
    for i in range(len(targets)):
        b, t, L = (int(v[i]) for v in (targets.batch, targets.position, targets.layer))
        for src in range(L):
            ref = reference_forward(model, ids[b : b + 1], suppress=(0, t, src), alpha=0.0)
            z = ref["z"][:, 0, t]  # (N, E)
            zc = cap.logits[:, b, t]
            dm = (z[L, e2[i]] - z[L, e3[i]]) - (zc[L, e2[i]] - zc[L, e3[i]])
            top_int = torch.topk(z, 2).indices
            top_clean = torch.topk(zc, 2).indices
            jac = [len(set(top_int[i].tolist()) & set(top_clean[i].tolist())) for i in range(N)]
            jac = [1 - j / (4 - j) for j in jac]
            down = sum(jac[src + 1 :]) / (N - 1 - src) if src < N - 1 else float("nan")
            p = F.log_softmax(cap.output_logits[b, t], -1)
            q = F.log_softmax(ref["logits"][0, t], -1)
            kl = (p.exp() * (p - q)).sum()
            rows.append((float(dm), down, float(kl), bool(ref["clipped_after"][0])))
    return rows


@pytest.mark.parametrize(
    "variant, moe, kwargs",
    [("latest", MOE, {"write_std": 0.8}),
     ("persistent", MOE, {"write_std": 0.8}),
     ("persistent", MOE_CLAMPED, {"write_std": 1.0, "drift": 3.0})],
    ids=["latest", "persistent", "persistent-clamped"],
)  # fmt: skip
def test_engine_equals_a_naive_rerun_per_suppression(variant, moe, kwargs):
    model = random_model(variant, seed=13, moe=moe, dtype=torch.float64, **kwargs)
    ids = token_ids(3, 24, seed=13)
    cap = capture(model, ids, dtype=torch.float64)
    res = suppression_outcomes(model, ids, cap, TARGETS, rows_per_forward=5)
    naive = _naive_outcomes(model, ids, cap, TARGETS)
    assert len(naive) == len(res.margin_change) == int(TARGETS.layer.sum())
    dm, down, kl, clipped = (
        torch.tensor(col, dtype=torch.float64) for col in zip(*naive, strict=True)
    )
    print("\nmax |Δm engine − naive|", float((res.margin_change.double() - dm).abs().max()))
    assert torch.allclose(res.margin_change.double(), dm, atol=1e-5, rtol=0)
    assert torch.allclose(res.jaccard_downstream.double(), down, atol=1e-6, equal_nan=True)
    assert torch.allclose(res.output_kl.double(), kl, atol=1e-6)
    assert res.margin_change.abs().max() > 1e-3  # suppressions matter
    assert (res.output_kl >= -1e-7).all()
    if moe is MOE_CLAMPED:
        # later clamps act on the changed state: some suppressed trajectories are clipped
        assert clipped.bool().any()


def test_sources_must_lie_below_the_target():
    model = random_model("persistent")
    ids = token_ids(3, 24)
    with pytest.raises(ValueError, match="below its target"):
        suppression_outcomes(model, ids, capture(model, ids), TARGETS, sources=[[5], [], [], []])


def test_jaccard_distance_by_hand():
    a = torch.tensor([[1, 2], [1, 2], [1, 2]])
    b = torch.tensor([[2, 3], [2, 1], [4, 5]])
    assert jaccard_distance(a, b).tolist() == pytest.approx([2 / 3, 0.0, 1.0])


def test_set_change_rate():
    model = random_model("persistent", seed=14, write_std=1.0)
    cap = capture(model, token_ids(3, 24, seed=14))
    rates = set_change_rates(model, cap, [1.0, 0.5, 0.0])
    assert rates[1.0] == 0.0  # K9, exactly
    check_unit_lambda(model, cap)
    assert rates[0.0] > 0
    # layer 0 (s_0 = 0) never changes: including it rescales the rate by (N − 1)/N
    with_0 = set_change_rates(model, cap, [0.0], skip_layer0=False)[0.0]
    assert with_0 == pytest.approx(rates[0.0] * (N - 1) / N)
    # E5 by hand at λ = 0: Top-2 of W^x x alone against Top-2 of the clean logits
    change = set_change(model, cap, 0.0)
    for layer in range(N):
        w_x = model.blocks[layer].moe.router.W_x.detach()
        hidden = cap.router_in[layer] @ w_x.T
        a = torch.topk(hidden, 2).indices.sort(-1).values
        b = torch.topk(cap.logits[layer], 2).indices.sort(-1).values
        assert torch.equal(change[layer], (a != b).any(-1))
    assert torch.allclose(attenuated_logits(model, cap, 1.0), cap.logits, atol=1e-6)
