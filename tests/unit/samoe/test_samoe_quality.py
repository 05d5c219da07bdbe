"""SAMOE §11, §17: perplexity, paired seed contrasts and the non-inferiority decision."""

from __future__ import annotations

import math

import pytest
import torch

from headgeom.samoe import quality as q


class _Uniform(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, ids):
        return torch.zeros(*ids.shape, self.vocab)


def test_a_uniform_model_has_the_vocabulary_as_perplexity():
    ids = torch.randint(0, 50, (5, 17))
    assert q.perplexity(_Uniform(50), ids, batch_size=2) == pytest.approx(50.0, rel=1e-12)


def test_the_paired_contrast_by_hand():
    c = q.paired_contrast([1.0, 2.0, 4.5], [0.5, 1.0, 2.0])  # d = 0.5, 1.0, 2.5
    sd = math.sqrt(((0.5 - 4 / 3) ** 2 + (1 - 4 / 3) ** 2 + (2.5 - 4 / 3) ** 2) / 2)
    half = 4.3026527297494 * sd / math.sqrt(3)
    assert c.per_seed == (0.5, 1.0, 2.5) and c.mean == pytest.approx(4 / 3)
    assert (c.low, c.high) == pytest.approx((4 / 3 - half, 4 / 3 + half), rel=1e-10)
    log = q.relative(q.paired_contrast([10.1, 10.2, 10.3], [10.0, 10.0, 10.0], log=True))
    assert log.per_seed == pytest.approx((0.01, 0.02, 0.03), rel=1e-9)
    with pytest.raises(ValueError, match="≥ 2 seeds"):
        q.paired_contrast([1.0], [1.0])


def test_the_decision_rule_gives_the_papers_verdicts():
    # SmolLM2 P: ΔPPL +0.19% [+0.12, +0.25], Δmacro −0.05 pp [−0.14, +0.04]: supported
    ppl = q.decide(0.0012, 0.0025, q.PPL_REL_BOUND, worse_is_higher=True)
    macro = q.decide(-0.14, 0.04, q.MACRO_PP_BOUND, worse_is_higher=False)
    assert (ppl, macro, q.criterion(ppl, macro)) == ("supported", "supported", "supported")
    # Gemma P: ΔPPL −0.06% [−0.45, +0.32] supported; Δmacro −0.16 pp [−1.66, +1.35]
    # crosses −1 pp: inconclusive, so the full criterion is inconclusive (paper §5.1)
    ppl = q.decide(-0.0045, 0.0032, q.PPL_REL_BOUND, worse_is_higher=True)
    macro = q.decide(-1.66, 1.35, q.MACRO_PP_BOUND, worse_is_higher=False)
    assert (ppl, macro, q.criterion(ppl, macro)) == ("supported", "inconclusive", "inconclusive")
    # wholly outside the bound
    assert q.decide(0.02, 0.03, q.PPL_REL_BOUND, worse_is_higher=True) == "not supported"
    assert q.decide(-3.0, -1.5, q.MACRO_PP_BOUND, worse_is_higher=False) == "not supported"
    assert q.criterion("supported", "not supported") == "not supported"
