"""Concentration of single-head patching effects (METHODS §10.1–10.4).

An effect matrix ``e`` has shape ``(L, H)``: ``e[l, h]`` is the signed mean drop of head
``(l, h)`` in logit units. Concentration is measured on |e|:

    E = Σ|e|,   p = |e| / E,   N_eff = exp(−Σ p log p)   (natural log; p = 0 terms give 0).

If every effect is zero, E = 0 and p is undefined: p, N_eff, the top-head share and the
index-level quantities are NaN and the top head is None. Nothing is concentrated or spread
in that case, so no number in [1, L·H] would be honest.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import numpy as np
from scipy.special import xlogy

#: Null values within this relative distance of the observed statistic count as ties
#: (as in scipy.stats.permutation_test): a permutation that only relabels heads gives the
#: same statistic mathematically but may differ in the last bits after re-summation.
TIE_RTOL = 100 * np.finfo(np.float64).eps


class Concentration(TypedDict):
    """Result of :func:`concentration`."""

    E: float  # Σ|e|, logit units
    p: np.ndarray  # (L, H) shares |e|/E
    N_eff: float  # exp of the Shannon entropy of p, in [1, L·H]
    top_head_share: float  # max |e| / E
    top_head: tuple[int, int] | None  # (layer, head) of max |e|; first in row-major order on ties


def _effect_matrix(e: np.ndarray) -> np.ndarray:
    e = np.asarray(e, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError(f"effects must be a (layers, heads) matrix, got shape {e.shape}")
    if not np.all(np.isfinite(e)):
        raise ValueError("effects contain NaN or infinite values")
    return e


def _entropy(p: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Shannon entropy (nats) over ``axis``; xlogy makes 0·log 0 = 0."""
    return -np.sum(xlogy(p, p), axis=axis)


def effects_from_drops(d: np.ndarray, axis: int = 0) -> np.ndarray:
    """Effect e = signed mean of the per-example drops d over the example ``axis`` (METHODS §10.1).

    With the default ``axis=0``, ``d`` has shape ``(N, L, H)`` and the result ``(L, H)``.
    The sign is kept: absolute values are taken only after averaging.
    """
    return np.mean(np.asarray(d, dtype=np.float64), axis=axis)


def concentration(e: np.ndarray) -> Concentration:
    """E, p, N_eff, top-head share and top head of an effect matrix ``e`` (L, H) (METHODS §10.2)."""
    e = _effect_matrix(e)
    magnitude = np.abs(e)
    E = float(magnitude.sum())
    if E == 0.0:
        return Concentration(
            E=0.0,
            p=np.full(e.shape, np.nan),
            N_eff=float("nan"),
            top_head_share=float("nan"),
            top_head=None,
        )
    p = magnitude / E
    layer, head = np.unravel_index(int(np.argmax(magnitude)), e.shape)
    return Concentration(
        E=E,
        p=p,
        N_eff=float(np.exp(_entropy(p))),
        top_head_share=float(p[layer, head]),
        top_head=(int(layer), int(head)),
    )


def index_layer_decomposition(e: np.ndarray) -> tuple[float, float]:
    """(N_index, N_layer|index) of an effect matrix ``e`` (L, H) (METHODS §10.3).

    q_h = Σ_l p_{l,h} is the index marginal; N_index = exp H(q) and
    N_layer|index = exp(Σ_h q_h H(layer | h)), the exponential of the conditional entropy.
    By the chain rule N_eff = N_index · N_layer|index. Both are NaN when every effect is 0.
    """
    p = concentration(e)["p"]
    q = p.sum(axis=0)  # (H,)
    # p(l|h) = p_{l,h}/q_h; an index with q_h = 0 carries no weight, so its column is left 0.
    conditional = np.divide(p, q, out=np.zeros_like(p), where=q > 0)
    n_index = np.exp(_entropy(q))
    n_layer_given_index = np.exp(np.sum(q * _entropy(conditional, axis=0)))
    return float(n_index), float(n_layer_given_index)


def within_layer_permutations(
    rng: np.random.Generator, n_permutations: int, n_layers: int, n_heads: int
) -> np.ndarray:
    """Independent uniform permutations π_l of the head indices for every layer and draw.

    Returns ``perm`` of shape ``(n_permutations, n_layers, n_heads)``; the permuted matrix of
    draw k is ``x[l, perm[k, l, h]]``. Argsort of i.i.d. uniform keys gives a uniform
    permutation per row and vectorises over all draws at once.
    """
    keys = rng.random((n_permutations, n_layers, n_heads))
    return np.argsort(keys, axis=-1)


def permute_within_layers(x: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Apply ``perm`` (n, L, H) to ``x`` (L, H); out (n, L, H): [k, l, h] = x[l, perm[k, l, h]]."""
    return np.take_along_axis(x[None, :, :], perm, axis=-1)


def permutation_p_value(
    null: np.ndarray, observed: float, alternative: Literal["less", "greater"]
) -> float:
    """One-sided permutation p-value (1 + #{null ≤ or ≥ observed}) / (1 + n) (METHODS §10.4–10.5).

    Ties are judged with relative tolerance :data:`TIE_RTOL`.
    """
    null = np.asarray(null, dtype=np.float64)
    slack = TIE_RTOL * abs(observed)
    if alternative == "less":
        hits = np.count_nonzero(null <= observed + slack)
    elif alternative == "greater":
        hits = np.count_nonzero(null >= observed - slack)
    else:
        raise ValueError(f"alternative must be 'less' or 'greater', got {alternative!r}")
    return (1 + hits) / (1 + null.size)


def index_permutation_null(
    e: np.ndarray, n_permutations: int = 5000, *, seed: int
) -> tuple[np.ndarray, float]:
    """Null distribution of N_index under within-layer head-index permutations (METHODS §10.4).

    ``e`` has shape (L, H). Each draw permutes the head indices of every layer independently
    (numpy ``Generator(PCG64(seed))``) and recomputes N_index; head-level N_eff is invariant.
    Returns ``(null, p_lower)``: ``null`` has shape ``(n_permutations,)`` and
    p_lower = (1 + #{null ≤ observed}) / (1 + n_permutations). All-zero ``e`` gives NaNs.
    """
    if n_permutations < 1:
        raise ValueError("n_permutations must be at least 1")
    p = concentration(e)["p"]
    if np.isnan(p).any():
        return np.full(n_permutations, np.nan), float("nan")
    rng = np.random.Generator(np.random.PCG64(seed))
    perm = within_layer_permutations(rng, n_permutations, *p.shape)
    q_null = permute_within_layers(p, perm).sum(axis=1)  # (n, H) index marginals
    null = np.exp(_entropy(q_null, axis=-1))
    observed, _ = index_layer_decomposition(e)
    return null, permutation_p_value(null, observed, "less")
