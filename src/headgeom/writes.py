"""Two weight-free descriptors of a block's write w_t into the residual stream, shared by the
head-geometry study's block ablation atlas and the edit atlas:

    size           = RMS_t(w_t) / RMS_t(x_t),   x_t the stream entering the layer
    constant part  = ‖mean_t w_t‖² / mean_t ‖w_t‖²  ∈ [0, 1]   (1: a fixed bias)

A block whose write is nearly a fixed vector looks important when it is removed (zero) and
not when it is replaced by its mean: size is not importance.
"""

from __future__ import annotations

import numpy as np
import torch


def constant_from(sum_w: torch.Tensor, sum_sq: float, n: int) -> float:
    """The constant part from streamed moments: Σ_t w_t (D,), Σ_t ‖w_t‖² and the count n."""
    return float((sum_w / n).pow(2).sum()) / (sum_sq / n) if sum_sq > 0 else float("nan")


def constant_part(writes: torch.Tensor) -> float:
    """‖mean w‖² / mean ‖w‖² of writes (N, D) (float64): 1 for a constant write, 1/n for n
    equally frequent orthogonal writes of equal norm; NaN for an all-zero write."""
    w = writes.double().reshape(-1, writes.shape[-1])
    return constant_from(w.sum(dim=0), float(w.pow(2).sum()), len(w))


def size_ratio(writes: torch.Tensor, resid: torch.Tensor) -> float:
    """RMS of the writes ÷ RMS of the residual entering the layer, over the same positions."""
    num = float(writes.double().pow(2).sum(-1).mean())
    den = float(resid.double().pow(2).sum(-1).mean())
    return float(np.sqrt(num / den)) if den > 0 else float("nan")
