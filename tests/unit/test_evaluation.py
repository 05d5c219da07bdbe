"""Clean logit differences (docs §8.6) against a direct full-logit computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.heads.analysis.evaluation import clean_performance, length_groups, logit_differences
from headgeom.heads.analysis.tolerance import forward_tolerance
from headgeom.model.gpt import GPT, ModelConfig


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_vocab=13, n_ctx=12, n_layer=2, n_head=2, d_model=16, d_head=8, d_mlp=32)
    return GPT(cfg).eval()


def test_logit_differences_match_full_logits_for_mixed_lengths(model):
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 13, n).tolist() for n in (5, 7, 5, 3, 7, 5)]
    correct = rng.integers(0, 13, len(ids))
    incorrect = (correct + 1) % 13
    got = logit_differences(model, ids, correct, incorrect, batch_size=2)
    with torch.no_grad():
        for i, seq in enumerate(ids):
            logits = model(torch.tensor([seq]))[0, -1].double()
            # batched against alone: the routes part at block 0, L + 1 stages at |logit|
            tol = forward_tolerance(model, float(logits.abs().max()))
            assert got[i] == pytest.approx(
                (logits[correct[i]] - logits[incorrect[i]]).item(), abs=tol
            )
    assert got.dtype == np.float64
    assert {n: g.tolist() for n, g in length_groups(ids).items()} == {
        3: [3],
        5: [0, 2, 5],
        7: [1, 4],
    }


def test_logit_differences_checks_lengths(model):
    with pytest.raises(ValueError, match="2 prompts but 1 correct"):
        logit_differences(model, [[1, 2], [3, 4]], [1], [2, 3])


def test_clean_performance():
    perf = clean_performance(np.array([1.0, -2.0, 0.0, 3.0]))
    assert perf == {"n": 4, "accuracy": 0.5, "margin": 0.5}  # LD = 0 is not correct
    with pytest.raises(ValueError, match="no examples"):
        clean_performance(np.array([]))
