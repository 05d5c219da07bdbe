"""SAMOE §14.1, §14.4, §14.5: targets, gradient×write (K13) and the ranking metrics."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from headgeom.samoe.capture import capture
from headgeom.samoe.ledger import boundary_pair
from headgeom.samoe.rankings import (
    as_targets,
    check_gradient,
    finite_difference,
    gradient_x_write,
    random_scores,
    ranking_metrics,
    recency_scores,
    select_targets,
)
from tests.helpers import samoe as h


def test_targets_are_first_in_sha256_order_and_distinct_within_a_sequence():
    T, eos = 24, 0
    tokens = np.ones((2, T), dtype=np.int64)
    tokens[0, 5] = eos  # an EOS is never a target
    targets = select_targets("toy", ["prose-0000", "code-0000"], tokens, [3, 4, 3, 4], eos)
    assert len(targets) == 8
    for (b, seq_id), rows in targets.groupby(["seq_index", "seq_id"]):
        assert rows["position"].is_unique
        used = set()
        for row in rows.itertuples():  # by hand: slot by slot, the first free eligible one
            eligible = [t for t in range(T // 8, T - 1) if tokens[b, t] != eos and t not in used]
            key = [hashlib.sha256(f"toy|{seq_id}|{row.slot}|{t}".encode()).hexdigest()
                   for t in eligible]  # fmt: skip
            assert row.position == eligible[int(np.argmin(key))]
            used.add(row.position)
    assert 5 not in set(targets.loc[targets["seq_index"] == 0, "position"])
    assert targets["layer"].tolist() == [3, 4, 3, 4] * 2


def test_targets_read_no_outcome():
    # K12: other (non-EOS) token values, as another variant's effects would be, change nothing
    tokens = np.ones((3, 32), dtype=np.int64)
    other = np.random.default_rng(0).integers(1, 30, size=(3, 32))
    ids = ["a", "b", "c"]
    assert select_targets("toy", ids, tokens, [2, 3], 0).equals(
        select_targets("toy", ids, other, [2, 3], 0)
    )


def test_gradient_x_write_matches_the_finite_difference():
    model = h.random_model("persistent", seed=3, write_std=0.4)
    ids = h.token_ids(batch=3, seq=24, seed=1)
    frame = select_targets("toy", ["s0", "s1", "s2"], ids.numpy(), [4, 5], eos=-1)
    targets = as_targets(frame)
    cap = capture(model, ids)
    e2, e3 = boundary_pair(cap, targets)
    grad = gradient_x_write(model, ids, targets, e2, e3)
    fd, flip = finite_difference(model, ids, targets, e2, e3)
    record = check_gradient(grad, fd, flip)
    assert record["K13.targets"] >= 4
    assert (grad[:, 5:] == 0).all() and (grad[targets.layer == 4][:, 4:] == 0).all()
    assert all(p.requires_grad for p in model.parameters())  # restored


def test_k13_fails_loudly_on_a_wrong_gradient():
    from headgeom.samoe.checks import CheckFailed

    fd = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    with pytest.raises(CheckFailed, match="K13"):
        check_gradient(fd * 1.2, fd, torch.zeros_like(fd, dtype=torch.bool))


def test_ranking_metrics_on_a_hand_built_case():
    nan = np.nan
    scores = np.array([[3.0, 1.0, 2.0], [1.0, 1.0, nan], [2.0, 5.0, nan]])
    effects = np.array([[0.5, 0.9, 0.1], [0.4, 0.4, 0.0], [0.0, 0.0, 0.0]])
    m = ranking_metrics(scores, effects)
    # target 0: top source 0 (E 0.5) is not argmax (1): accuracy 0, regret (0.9 − 0.5)/0.9;
    # Spearman: ranks (3,1,2) vs (2,3,1), d = (1,−2,1), 1 − 6·6/(3·8) = −0.5
    assert m.top_source_accuracy[0] == 0 and m.regret[0] == pytest.approx(0.4 / 0.9)
    assert m.spearman[0] == pytest.approx(-0.5)
    # target 1: a tie in the scores goes to the lower layer (0); a tie in E counts
    assert m.selected[1] == 0 and m.top_source_accuracy[1] == 1 and m.regret[1] == 0
    assert np.isnan(m.spearman[1])  # constant scores: omitted, not 0
    # target 2: max E = 0, regret dropped; constant effects, Spearman omitted
    assert np.isnan(m.regret[2]) and np.isnan(m.spearman[2])


def test_recency_and_random_orders():
    rec = recency_scores(np.array([3, 1]), 4)
    assert np.nanargmax(rec[0]) == 2 and np.nanargmax(rec[1]) == 0
    assert np.isnan(rec[0, 3]) and np.isnan(rec[1, 1:]).all()
    frame = select_targets("toy", ["x"], np.ones((1, 32), dtype=np.int64), [4], 0)
    scores = random_scores("toy", ["x"], frame, 6)
    row = frame.iloc[0]
    keys = [
        hashlib.sha256(f"toy|x|{row.position}|4|{src}".encode()).hexdigest() for src in range(4)
    ]
    assert int(np.nanargmax(scores[0])) == int(np.argmin(keys))
    assert np.isnan(scores[0, 4:]).all()


def test_matched_controls_on_a_hand_built_case():
    from headgeom.samoe.rankings import ledger_control_advantage, matched_controls

    targets = select_targets("toy", ["s"], np.ones((1, 32), dtype=np.int64), [6], 0)
    norms = np.array([[0.1, 0.5, 0.9, 0.48, 0.2, 0.3, 0.0]])
    c = matched_controls("toy", targets, np.array([1]), norms)
    row = targets.iloc[0]
    cands = [0, 2, 3, 4, 5]  # every source but the selected one
    keys = {s: hashlib.sha256(f"toy|s|{row.position}|6|{s}".encode()).hexdigest() for s in cands}
    assert c.random[0] == min(cands, key=keys.get)
    assert c.norm[0] == 3  # |0.48 − 0.5| is the smallest gap
    # depth tercile ⌊3·1/6⌋ = 0 holds sources 0 and 1; 1 is selected, so 0
    assert c.distance[0] == 0
    adv = ledger_control_advantage(np.array([0.9]), np.array([0.3]), np.array([0.6]),
                                   np.array([0.0]))  # fmt: skip
    assert adv[0] == pytest.approx(0.9 - 0.3)
