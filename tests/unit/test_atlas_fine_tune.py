"""A fine-tuned checkpoint B of one lineage (headgeom.atlas.fine_tune): it learns the
answers, leaves A and the frozen bases as they were, keeps A's architecture, and repeats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from headgeom.atlas import checkpoints as ck
from headgeom.atlas.fine_tune import fine_tune
from headgeom.atlas.tensor_groups import Weights, check_same_architecture
from tests.helpers.models import N_VOCAB, zoo_model


def _task(n: int = 24, seed: int = 0):
    """Random prompts of lengths 5 and 7 with random answer tokens."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, N_VOCAB, 5 + 2 * (i % 2)).tolist() for i in range(n)]
    return prompts, rng.integers(0, N_VOCAB, n).tolist()


@torch.no_grad()
def _mean_nll(model, prompts, answers) -> float:
    """Mean −log p(answer) at each prompt's final position, one prompt at a time."""
    nll = [
        float(F.cross_entropy(model(torch.tensor([p]), last_only=True), torch.tensor([a])))
        for p, a in zip(prompts, answers, strict=True)
    ]
    return float(np.mean(nll))


def test_fine_tune_learns_the_answers_and_leaves_a_unchanged():
    a = zoo_model("write-common", 0)  # frozen bases: buffers no update may touch
    before = {n: t.clone() for n, t in a.state_dict().items()}
    prompts, answers = _task()
    b, losses = fine_tune(a, prompts, answers, steps=40, lr=1e-2, batch_size=8, seed=3)
    assert _mean_nll(b, prompts, answers) < 0.5 * _mean_nll(a, prompts, answers)
    assert losses.shape == (40,) and losses[-5:].mean() < losses[:5].mean()
    assert all(torch.equal(t, before[n]) for n, t in a.state_dict().items())
    wa, wb = Weights.of(a), Weights.of(b)
    check_same_architecture(wa, wb)
    drift = ck.drift(wa, wb)
    frozen = wa.names(lambda r: r.kind == "frozen")
    assert frozen and all(drift[n] == 0.0 for n in frozen)
    assert all(drift[n] > 0 for n in wa.names(lambda r: r.kind == "linear"))


def test_fine_tune_repeats_to_the_byte():
    a = zoo_model("learned", 0)
    prompts, answers = _task()
    b1, l1 = fine_tune(a, prompts, answers, steps=5, lr=1e-3, batch_size=4, seed=1)
    b2, l2 = fine_tune(a, prompts, answers, steps=5, lr=1e-3, batch_size=4, seed=1)
    b3, _ = fine_tune(a, prompts, answers, steps=5, lr=1e-3, batch_size=4, seed=2)
    assert np.array_equal(l1, l2)
    s1, s2, s3 = b1.state_dict(), b2.state_dict(), b3.state_dict()
    assert all(torch.equal(s1[n], s2[n]) for n in s1)
    assert not all(torch.equal(s1[n], s3[n]) for n in s1)


def test_fine_tune_refuses_mismatched_data():
    with pytest.raises(ValueError, match="3 prompts and 2 answers"):
        fine_tune(zoo_model("learned"), [[1], [2], [3]], [1, 2], steps=1, lr=1e-3)
