"""KL(P ‖ Q) of next-token distributions from float64 log-probabilities, with its float64
summation floor: the one divergence every study's edits are measured by (the head-geometry
study's edges and block ablations, the edit atlas).

Both arguments are normalised distributions, so the sum is ≥ 0 up to the rounding of the sum
itself (:func:`summation_floor`, ~1e-13 at V = 50,257): a KL in [−floor, 0) reads 0, one
below −floor raises (a bug, never silently changed).
"""

from __future__ import annotations

import math

import torch

EPS64 = torch.finfo(torch.float64).eps


def summation_floor(clean_logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """(R,) bound on the float64 rounding of Σ_v p_v (log p_v − log q_v): every log-prob is
    exact to a few eps₆₄ of its size and the V-term sum adds log₂V·eps₆₄ of Σ|terms|, so
    (8 + log₂V)·eps₆₄·(1 + max|log p| + max|log q|); about 1e-13 at V = 50,257."""
    V = clean_logp.shape[-1]
    size = 1.0 + clean_logp.abs().amax(-1) + logq.abs().amax(-1)
    return (8 + math.log2(V)) * EPS64 * size


def kl_of_logp(
    clean_logp: torch.Tensor, logq: torch.Tensor, clean_p: torch.Tensor | None = None
) -> torch.Tensor:
    """KL(P ‖ Q) (...) float64 = Σ_v p_v (log p_v − log q_v) over the last axis, from
    float64 log-probabilities (any leading axes, broadcast); ``clean_p`` is exp(clean_logp)
    where the caller keeps it (one exponential less per call). Both are normalised
    distributions, so the sum is ≥ 0 up to :func:`summation_floor`: values in [−floor, 0)
    are float64 summation noise and read 0; a value below −floor is a bug and raises (never
    silently changed)."""
    p = clean_logp.exp() if clean_p is None else clean_p
    kl = (p * (clean_logp - logq)).sum(-1)
    if (kl < 0).any():
        floor = summation_floor(clean_logp, logq).expand_as(kl)
        bad = kl < -floor
        if bad.any():
            raise ArithmeticError(
                f"KL {float(kl[bad][0]):.3e} is below −{float(floor[bad][0]):.1e}, its float64 "
                "summation floor: the distributions are not normalised"
            )
        kl = kl.clamp_min(0.0)
    return kl
