"""Quality and non-inferiority (SAMOE §11, §17): perplexity on the final pool, paired seed
contrasts against the same seed's Ordinary MoE, and the frozen decision rule.

* Perplexity = exp(mean NLL) over every predicted position of the pool's sequences.
* PPL is compared as the ratio to the seed's Ordinary MoE, analysed on the natural-log
  scale: d_s = log PPL(v, s) − log PPL(ordinary, s), mean ± t_{0.975, n−1} s_d / √n, then
  back-transformed to a relative change exp(·) − 1. Accuracy differences stay arithmetic
  (percentage points).
* [DERIVED] Decision, against the bound b (PPL: +1% relative; macro accuracy: −1 pp):
  **supported** when the whole 95% interval lies inside the bound, **not supported** when
  it lies wholly outside, else **inconclusive**; a family's criterion needs both metrics
  supported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from headgeom.runtime import module_device
from headgeom.samoe.stats import t_interval

#: The paper's frozen bounds (SAMOE §11): PPL may rise by at most 1% relative, macro fall
#: by at most 1 pp.
PPL_REL_BOUND, MACRO_PP_BOUND = 0.01, 1.0


#: Sequences per perplexity forward unless told (the toy's; ``capture.batch_sequences``).
PERPLEXITY_BATCH = 8


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, sequences: torch.Tensor, batch_size: int = PERPLEXITY_BATCH
) -> float:
    """exp(mean next-token NLL) over every predicted position of ``sequences`` (S, T), on
    the model's device, ``batch_size`` sequences a forward: only that forward's logits and
    its summed NLL (float64) live at a time. Other batch sizes add the same float64 sums in
    another grouping (and run other CPU kernel shapes): equal to ~1e-6 relative, not bitwise."""
    total, count = 0.0, 0
    device = module_device(model)
    for start in range(0, len(sequences), batch_size):
        ids = sequences[start : start + batch_size].to(device)
        logits = model(ids[:, :-1]).double()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                              reduction="sum")  # fmt: skip
        total, count = total + nll.item(), count + ids[:, 1:].numel()
    return math.exp(total / count)


@dataclass(frozen=True)
class Contrast:
    """A paired seed contrast: every seed's difference, their mean and 95% t-interval."""

    per_seed: tuple[float, ...]
    mean: float
    low: float
    high: float


def paired_contrast(values: Sequence[float], reference: Sequence[float], log: bool = False,
                    level: float = 0.95) -> Contrast:  # fmt: skip
    """d_s = f(v, s) − f(ref, s) (on the log scale with ``log``) over the seeds, with the
    Student-t interval mean ± t_{(1+level)/2, n−1} · s_d / √n."""
    v, r = np.asarray(values, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if v.shape != r.shape or v.size < 2:
        raise ValueError(f"paired contrast needs ≥ 2 seeds of both, got {v.size} and {r.size}")
    d = np.log(v) - np.log(r) if log else v - r
    return Contrast(tuple(d.tolist()), *t_interval(d, level))


def relative(c: Contrast) -> Contrast:
    """A log-scale contrast back-transformed to relative changes exp(·) − 1."""
    return Contrast(tuple(math.expm1(x) for x in c.per_seed), math.expm1(c.mean),
                    math.expm1(c.low), math.expm1(c.high))  # fmt: skip


def decide(low: float, high: float, bound: float, worse_is_higher: bool) -> str:
    """supported / not supported / inconclusive for an interval against a one-sided bound
    (PPL: worse is higher, bound +b; accuracy: worse is lower, bound −b)."""
    if worse_is_higher:
        inside, outside = high < bound, low > bound
    else:
        inside, outside = low > -bound, high < -bound
    return "supported" if inside else "not supported" if outside else "inconclusive"


def criterion(ppl: str, macro: str) -> str:
    """A family's non-inferiority criterion: both metrics supported."""
    if ppl == macro == "supported":
        return "supported"
    return "not supported" if "not supported" in (ppl, macro) else "inconclusive"
