"""The toy downstream suite's scoring (SAMOE §11): summed conditional log-likelihood per
choice, acc = argmax, acc_norm divides by the choice's character length, ties to the lowest
index; checked on a hand-built bigram model whose probabilities are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.data.tokenizer import load_gpt2_tokenizer
from headgeom.samoe import downstream


class Table(torch.nn.Module):
    """logits[b, t] = L[ids[b, t]]: a bigram model with a fixed log-probability table."""

    def __init__(self, logp: torch.Tensor):
        super().__init__()
        self.logp = logp

    def forward(self, ids):
        return self.logp[ids]


def test_loglik_is_the_sum_of_the_choice_tokens():
    V = 5
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    model = Table(logp)
    frame = pd.DataFrame([
        {"task": "t", "example_id": 0, "context": [1, 2], "choices": [[3], [4, 0]],
         "choice_texts": ["a", "b"], "label": 0},
        {"task": "t", "example_id": 1, "context": [0], "choices": [[1, 1, 1], [2]],
         "choice_texts": ["a", "b"], "label": 0},
    ])  # fmt: skip
    # batch size 1 and one batch of all four sequences (padded) give the same numbers
    got, other = (downstream.choice_logliks(model, frame, list, batch_size=b) for b in (1, 4))
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(other))
    assert got[1][0] == pytest.approx((logp[0, 1] + 2 * logp[1, 1]).item(), abs=1e-12)
    got = got[0]
    # by hand: p(3 | 2); p(4 | 2) · p(0 | 4)
    assert got[0] == pytest.approx(logp[2, 3].item(), abs=1e-12)
    assert got[1] == pytest.approx((logp[2, 4] + logp[4, 0]).item(), abs=1e-12)


def test_acc_norm_divides_by_characters_and_ties_go_low():
    V = 4
    logp = torch.full((V, V), math.log(0.25), dtype=torch.float64)
    logp[0, 1], logp[0, 2] = math.log(0.1), math.log(0.4)
    model = Table(logp)
    frame = pd.DataFrame([
        # choice 0: one token p=0.1 ("x", 1 char); choice 1: two tokens 0.4·0.25 = 0.1 (2 chars)
        {"task": "t", "example_id": 0, "context": [0], "choices": [[1], [2, 3]],
         "choice_texts": ["x", "yy"], "label": 1},
        # equal log-likelihood and length: the tie goes to index 0
        {"task": "t", "example_id": 1, "context": [3], "choices": [[1], [2]],
         "choice_texts": ["a", "b"], "label": 0},
    ])  # fmt: skip
    scored = downstream.score(model, frame, lambda ids: list(ids))
    # acc: log 0.1 == log 0.1 → tie → index 0 ≠ label 1; acc_norm: −2.30 vs −1.15 → index 1
    assert scored["acc"].tolist() == [0.0, 1.0]
    assert scored["acc_norm"].tolist() == [1.0, 1.0]


def test_examples_are_well_formed():
    tok = load_gpt2_tokenizer()
    frame = downstream.examples(tok, ["sva", "arith"], n_per_task=8, arith_n=20, arith_seed=104)
    assert frame.groupby("task").size().to_dict() == {"arith": 20, "sva": 8}
    arith = frame[frame.task == "arith"]
    for ex in arith.itertuples():
        values = [int(t) for t in ex.choice_texts]
        assert len(set(values)) == 4 and values == sorted(values)
        a, op, b, _ = tok.decode(ex.context).split()
        truth = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert values[ex.label] == truth
        # the distractors include the result ±1 and ±10
        assert {truth - 1, truth + 1} & set(values) and {truth - 10, truth + 10} & set(values)
    sva = frame[frame.task == "sva"]
    assert all(len(c) == 2 and all(len(x) == 1 for x in c) for c in sva.choices)
    # choice order does not depend on the answer: sorted by token id
    assert all(c[0][0] < c[1][0] for c in sva.choices)
    assert sorted(set(sva.label)) == [0, 1]
    # deterministic
    again = downstream.examples(tok, ["sva", "arith"], 8, 20, 104)
    pd.testing.assert_frame_equal(frame, again)
    with pytest.raises(ValueError, match="hellaswag.*toy tasks"):
        downstream.examples(tok, ["hellaswag"], 8, 20, 104)
    assert np.isin(frame.task.unique(), downstream.TOY_TASKS).all()
