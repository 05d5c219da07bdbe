"""Lane score Λ and its within-layer permutation test (docs §10.5).

A lane is the set of heads that share an index h across layers. With harmful-patch mass
w_{l,h} = max(e_{l,h}, 0) for an effect matrix e of shape (L, H),

    Λ = Σ_h Σ_{l<l'} w_{l,h} w_{l',h}  /  Σ_{(l,h),(l',h'): l<l'} w_{l,h} w_{l',h'},

the fraction of cross-layer pair mass that lies in same-index pairs (chance ≈ 1/H).

Both sums are "Σ_{l<l'} a_l b_{l'}" sums, computed as Σ_l a_l · (Σ_{l'>l} b_{l'}) with
strict suffix sums. That is the same O(L·H) count as the ((Σa)² − Σa²)/2 identity but
adds only nonnegative terms, so a tiny layer total next to a huge one is not lost to
cancellation (which could turn a positive denominator into 0).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headgeom import results
from headgeom.heads.analysis.effects import effect_matrix
from headgeom.heads.analysis.stats import (
    permutation_p_value,
    permute_within_layers,
    within_layer_permutations,
)

IDENTITY = ("model", "seed", "task")


def _strict_suffix_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """s[l] = Σ_{l' > l} x[l'] along ``axis``, by a reversed cumulative sum shifted by one."""
    x = np.moveaxis(x, axis, -1)
    inclusive = np.flip(np.cumsum(np.flip(x, axis=-1), axis=-1), axis=-1)
    strict = np.zeros_like(inclusive)
    strict[..., :-1] = inclusive[..., 1:]
    return np.moveaxis(strict, -1, axis)


def _harmful_mass(e: np.ndarray) -> np.ndarray:
    e = np.asarray(e, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError(f"effects must be a (layers, heads) matrix, got shape {e.shape}")
    if not np.all(np.isfinite(e)):
        raise ValueError("effects contain NaN or infinite values")
    return np.maximum(e, 0.0)


def _same_index_mass(w: np.ndarray) -> np.ndarray:
    """Numerator Σ_h Σ_{l<l'} w_{l,h} w_{l',h} for ``w`` of shape (..., L, H)."""
    return np.sum(w * _strict_suffix_sum(w, axis=-2), axis=(-2, -1))


def _cross_layer_mass(w: np.ndarray) -> float:
    """Denominator Σ_{l<l'} r_l r_{l'} with layer totals r_l = Σ_h w_{l,h}, for ``w`` (L, H)."""
    r = w.sum(axis=1)
    return float(np.sum(r * _strict_suffix_sum(r, axis=0)))


def lane_score(e: np.ndarray) -> float | None:
    """Λ of an effect matrix ``e`` (L, H); None when no two layers carry positive effects."""
    w = _harmful_mass(e)
    denominator = _cross_layer_mass(w)
    if denominator == 0.0:
        return None
    return float(_same_index_mass(w)) / denominator


def lane_permutation_test(
    e: np.ndarray, n_permutations: int = 5000, *, seed: int
) -> tuple[float | None, float | None, np.ndarray]:
    """Λ with its one-sided upper permutation p-value (docs §10.5).

    Head labels of ``e`` (L, H) are shuffled within each layer independently
    (numpy ``Generator(PCG64(seed))``), ``n_permutations`` times, all at once. Layer totals,
    hence the denominator, are invariant under these shuffles, so only the numerator is
    recomputed. Returns ``(lambda_obs, p_upper, null)`` with
    p_upper = (1 + #{null ≥ lambda_obs}) / (1 + n_permutations) and ``null`` of shape
    ``(n_permutations,)``. If Λ is undefined it is undefined for every shuffle too:
    returns ``(None, None, all-NaN null)``.
    """
    if n_permutations < 1:
        raise ValueError("n_permutations must be at least 1")
    w = _harmful_mass(e)
    denominator = _cross_layer_mass(w)
    if denominator == 0.0:
        return None, None, np.full(n_permutations, np.nan)
    rng = np.random.Generator(np.random.PCG64(seed))
    perm = within_layer_permutations(rng, n_permutations, *w.shape)
    null = _same_index_mass(permute_within_layers(w, perm)) / denominator
    observed = float(_same_index_mass(w)) / denominator
    return observed, permutation_p_value(null, observed, "greater"), null


def lane_rows(
    heads: pd.DataFrame, split: str, n_permutations: int, seed: int, where: str
) -> pd.DataFrame:
    """One lanes row per (model, seed, task) of a heads table (heads/stages/concentration.py) on
    ``split``: Λ, its permutation p, and the chance level 1/H."""
    available = list(pd.unique(heads["split"]))
    if split not in available:
        raise ValueError(f"{where}: split {split!r} not present (has {available})")
    heads = heads[heads["split"] == split]
    records = []
    for key, rows in heads.groupby(list(IDENTITY), sort=True):
        identity = dict(zip(IDENTITY, key, strict=True))
        e = effect_matrix(rows, "e", f"{where} {identity}")
        lam, p_value, _ = lane_permutation_test(e, n_permutations, seed=seed)
        records.append(
            {
                **identity,
                "split": split,
                "lambda_score": lam,
                "p_value": p_value,
                "n_permutations": n_permutations,
                "permutation_seed": seed,
                "chance": 1.0 / e.shape[1],
                "n_layers": e.shape[0],
                "n_heads": e.shape[1],
            }
        )
    return pd.DataFrame(records, columns=results.LANES.names)
