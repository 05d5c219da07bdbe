"""SAMOE §15: post-hoc component attribution on the Ordinary MoE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.samoe import li
from headgeom.samoe.capture import capture
from headgeom.samoe.ledger import Targets, boundary_pair
from headgeom.samoe.model import site
from tests.helpers import samoe as h


@pytest.fixture(scope="module")
def setup():
    model = h.random_model("ordinary", seed=4)
    ids = h.token_ids(batch=3, seq=24, seed=2)
    targets = Targets([0, 1, 2, 0], [10, 15, 20, 21], [3, 5, 4, 2])
    cap = capture(model, ids)
    e2, e3 = boundary_pair(cap, targets)
    return model, ids, targets, cap, e2, e3


def test_the_parts_rebuild_the_router_input_and_logits(setup):
    model, ids, targets, cap, e2, e3 = setup
    att = li.attribute(model, ids, cap, targets, e2, e3)
    record = li.check_reconstruction(att)
    assert att.input_residual <= 1e-5 and att.logit_residual <= 1e-5, record
    # 3 components per earlier layer, none beyond
    assert (~torch.isnan(att.norm)).sum(-1).tolist() == [3 * L for L in targets.layer.tolist()]
    # the boundary score is |α_j[e2] − α_j[e3]| by hand for one component
    j = li.component_index(1, "shared")
    want = (att.alpha[0, j, e2[0]] - att.alpha[0, j, e3[0]]).abs()
    assert att.boundary[0, j] == want
    assert att.variance[0, j] == pytest.approx(att.alpha[0, j].var(unbiased=False).item())


def test_the_oracle_equals_a_naive_rerun(setup):
    model, ids, targets, _, e2, e3 = setup
    effects = li.oracle_effects(model, ids, targets, e2, e3)
    i, layer, kind = 1, 2, "routed"
    b, t, L = 1, 15, 5

    def zero(a):
        a = a.clone()
        a[:, t] = 0
        return a

    z = {}
    fns = {
        site(layer, "hook_routed_out"): zero,
        site(L, "hook_router_logits"): lambda a: z.setdefault("z", a),
    }
    with torch.no_grad(), model.hooks(fns):
        model(ids[b : b + 1])
    clean = capture(model, ids).logits[L, b, t]
    m0 = clean[e2[i]] - clean[e3[i]]
    m1 = z["z"][0, t, e2[i]] - z["z"][0, t, e3[i]]
    assert effects[i, li.component_index(layer, kind)].item() == pytest.approx(
        abs(float(m1 - m0)), rel=1e-5, abs=1e-6
    )
    assert torch.isnan(effects[i, 3 * L :]).all()


def test_gradient_x_component_matches_the_finite_difference(setup):
    model, ids, targets, _, e2, e3 = setup
    grad = li.gradient_x_component(model, ids, targets, e2, e3)
    eps = 1e-3
    rel = []
    for i in range(len(targets)):
        b, t, L = (int(v[i]) for v in (targets.batch, targets.position, targets.layer))
        fd = []
        for j in range(3 * L):
            z = {}
            fns = li._scaled(torch.tensor([1 - eps]), [(0, j, t)])
            fns[site(L, "hook_router_logits")] = lambda a, z=z: z.setdefault("z", a)
            with torch.no_grad(), model.hooks(fns):
                model(ids[b : b + 1])
            clean = capture(model, ids[b : b + 1]).logits[L, 0, t]
            m0, m1 = clean[e2[i]] - clean[e3[i]], z["z"][0, t, e2[i]] - z["z"][0, t, e3[i]]
            fd.append(abs(float(m0 - m1)) / eps)
        fd = np.array(fd)
        rel.append(np.linalg.norm(grad[i, : 3 * L].numpy() - fd) / np.linalg.norm(fd))
    assert np.median(rel) < 0.05, rel
    assert all(p.requires_grad for p in model.parameters())


def test_recency_orders_components_within_and_across_layers():
    rec = li.recency_scores(np.array([2]), 4)
    order = np.argsort(-rec[0][~np.isnan(rec[0])])
    expected = [(1, "routed"), (1, "shared"), (1, "attention"),
                (0, "routed"), (0, "shared"), (0, "attention")]  # fmt: skip
    assert order.tolist() == [li.component_index(layer, kind) for layer, kind in expected]
    assert np.isnan(rec[0, 6:]).all()
    scores = li.random_scores("toy", ["s"], [10], [2], 4)
    assert sorted(scores[0, :6].tolist()) == [1, 2, 3, 4, 5, 6] and np.isnan(scores[0, 6:]).all()


def test_state_variants_are_refused(setup):
    _, ids, targets, _, e2, e3 = setup
    model = h.random_model("persistent", seed=4)
    with pytest.raises(ValueError, match="ordinary"):
        li.attribute(model, ids, capture(model, ids), targets, e2, e3)
