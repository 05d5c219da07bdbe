"""Tolerances of the checks that compare two routes to one floating-point value (docs §18).

Two evaluations of the same function that differ only in the order of their floating-point
operations (a resumed forward against a full one, a batched engine against a loop, one CPU's
vector kernels against another's) differ by rounding alone. Every rounded result is off by at
most half an ulp of its own magnitude, and the roundings that reach an output are those of
the sums along the path from where the two routes part to the output, so their difference
is a small multiple of

    eps(dtype) · scale,

``scale`` the largest magnitude on the compared path (the largest |logit| for logits and
logit differences, the largest |activation| for an activation). The multiple grows with the
number of sequential rounded stages between the point where the routes part and the output
(a block each, plus the unembedding). A check's tolerance is therefore

    tol = ULPS_PER_STAGE · stages · eps(dtype) · max(scale, 1),

with the floor 1 on the scale so that a compared quantity near zero keeps the tolerance of
order-one values. ``ULPS_PER_STAGE`` = 4: on 3-layer test models of every geometry the
observed residuals were at most 1.1 ulp of the largest logit (C12 on AVX2 kernels: 1.91e-6
with |logit| ≤ 14.2, i.e. 1.13 · eps · scale, over 4 stages), so the tolerance leaves a
margin of about 14× over rounding, while a real error (a wrong clamp or patch) moves logits
by the size of the effects, orders of magnitude more. In float32 a 12-layer model with
logits of 30 gets 4 · 13 · 1.19e-7 · 30 ≈ 1.9e-4; in float64 the same is 3.5e-13.

The paper states absolute float32 tolerances (C8, C9 1e-5; C12 1e-6; C13 four decimals):
they hold for one machine's kernels and model size and not for another's, so the pipeline's
gates and the tests use this derivation, and each check records the tolerance it applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: ulps of the largest magnitude allowed per rounded stage (see the module docstring).
ULPS_PER_STAGE = 4


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (float32: 2^-23 ≈ 1.19e-7)."""
    return float(torch.finfo(dtype).eps)


def rounding_tolerance(dtype: torch.dtype, scale: float, stages: int) -> float:
    """The tolerance of a check comparing two routes through ``stages`` rounded stages to
    values of magnitude up to ``scale``, computed in ``dtype`` (module docstring)."""
    if stages < 1:
        raise ValueError(f"rounding_tolerance: stages must be at least 1, got {stages}")
    if not scale == scale:  # NaN: the compared values are not finite
        raise ValueError("rounding_tolerance: the scale of the compared values is NaN")
    return ULPS_PER_STAGE * stages * eps(dtype) * max(abs(float(scale)), 1.0)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype the model computes in (its first floating parameter's)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    raise ValueError(f"{type(model).__name__} has no floating-point parameters")


def forward_tolerance(model: torch.nn.Module, scale: float, from_layer: int = 0) -> float:
    """The tolerance of two routes through ``model`` that part at block ``from_layer``: one
    stage per block from there on, plus the unembedding."""
    return rounding_tolerance(model_dtype(model), scale, model.cfg.n_layer - from_layer + 1)


@dataclass(frozen=True)
class Residual:
    """A check's observed residual and the tolerance it is held to."""

    value: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.value <= self.tolerance  # NaN fails

    @property
    def ratio(self) -> float:
        return self.value / self.tolerance

    def worst(self, other: Residual) -> Residual:
        """Of two residuals of one check (e.g. two tasks), the one nearest failing."""
        return other if not other.ratio <= self.ratio else self
