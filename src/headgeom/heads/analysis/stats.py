"""Concentration of single-head patching effects and its robustness (docs §10.1–10.4, §12).

An effect matrix ``e`` has shape ``(L, H)``: ``e[l, h]`` is the signed mean drop of head
``(l, h)`` in logit units. Concentration is measured on |e|:

    E = Σ|e|,   p = |e| / E,   N_eff = exp(−Σ p log p)   (natural log; p = 0 terms give 0).

If every effect is zero, E = 0 and p is undefined: p, N_eff, the top-head share and the
index-level quantities are NaN and the top head is None. Nothing is concentrated or spread
in that case, so no number in [1, L·H] would be honest.

The robustness analyses of §12 recompute N_eff on reweighted examples: a weight matrix ``W``
(K, N) over the N examples gives K effect matrices ``W @ d / W.sum(1)`` at once. A bootstrap
resample is a row of multiplicities, leaving a group out a 0/1 row, so bootstrap, paired
bootstrap, within-condition and leave-one-group-out share one vectorised path.
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
    """Effect e = signed mean of the per-example drops d over the example ``axis`` (docs §10.1).

    With the default ``axis=0``, ``d`` has shape ``(N, L, H)`` and the result ``(L, H)``.
    The sign is kept: absolute values are taken only after averaging.
    """
    return np.mean(np.asarray(d, dtype=np.float64), axis=axis)


def concentration(e: np.ndarray) -> Concentration:
    """E, p, N_eff, top-head share and top head of an effect matrix ``e`` (L, H) (docs §10.2)."""
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
    """(N_index, N_layer|index) of an effect matrix ``e`` (L, H) (docs §10.3).

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
    """One-sided permutation p-value (1 + #{null ≤ or ≥ observed}) / (1 + n) (docs §10.4–10.5).

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
    """Null distribution of N_index under within-layer head-index permutations (docs §10.4).

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


# --------------------------------------------------------------------------- §12 robustness
def effects_abs_from_drops(d: np.ndarray, axis: int = 0) -> np.ndarray:
    """Per-example-absolute effect E_x|d_{l,h}(x)| over the example ``axis`` (docs §12.3)."""
    return np.mean(np.abs(np.asarray(d, dtype=np.float64)), axis=axis)


def n_eff_batch(e: np.ndarray) -> np.ndarray:
    """N_eff of a stack of effect matrices ``e`` (..., L, H) → (...); NaN where E = 0.

    The same formula as :func:`concentration`, vectorised over the leading axes.
    """
    e = np.asarray(e, dtype=np.float64)
    if e.ndim < 2:
        raise ValueError(f"effects must be (..., layers, heads), got shape {e.shape}")
    magnitude = np.abs(e).reshape(*e.shape[:-2], -1)
    total = magnitude.sum(axis=-1, keepdims=True)
    p = np.divide(magnitude, total, out=np.zeros_like(magnitude), where=total > 0)
    out = np.exp(_entropy(p, axis=-1))
    return np.where(total[..., 0] > 0, out, np.nan)


def _drops_matrix(d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 3:
        raise ValueError(f"drops must be an (examples, layers, heads) array, got shape {d.shape}")
    if d.shape[0] == 0:
        raise ValueError("drops have no examples")
    if not np.all(np.isfinite(d)):
        raise ValueError("drops contain NaN or infinite values")
    return d


def weighted_effects(weights: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Effects of K example weightings: ``weights`` (K, N) and ``d`` (N, L, H) → (K, L, H).

    Row k gives e_k = Σ_x w_kx d(x) / Σ_x w_kx, the signed mean over the weighted examples.
    """
    d = _drops_matrix(d)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[1] != d.shape[0]:
        raise ValueError(f"weights must be (K, {d.shape[0]}), got shape {weights.shape}")
    mass = weights.sum(axis=1)
    if np.any(mass <= 0):
        raise ValueError("every weighting must give some example a positive weight")
    flat = weights @ d.reshape(d.shape[0], -1)
    return (flat / mass[:, None]).reshape(weights.shape[0], *d.shape[1:])


def resample_counts(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    """Multiplicities (n_resamples, n) of bootstrap resamples of n examples with replacement.

    Row b counts how often each example appears among n indices drawn uniformly from
    ``rng`` (``rng.integers(0, n, (n_resamples, n))``), so resample b is the weighting
    ``counts[b]`` of :func:`weighted_effects`.
    """
    if n_resamples < 1 or n < 1:
        raise ValueError(f"need n_resamples ≥ 1 and n ≥ 1, got {n_resamples} and {n}")
    index = rng.integers(0, n, size=(n_resamples, n))
    flat = index + n * np.arange(n_resamples)[:, None]
    return np.bincount(flat.ravel(), minlength=n_resamples * n).reshape(n_resamples, n)


def _chunked_n_eff(weights: np.ndarray, d: np.ndarray, chunk: int = 512) -> np.ndarray:
    """N_eff of each weighting, ``chunk`` rows at a time so memory stays K·L·H / chunk-bounded."""
    return np.concatenate(
        [
            n_eff_batch(weighted_effects(weights[i : i + chunk], d))
            for i in range(0, len(weights), chunk)
        ]
    )


def bootstrap_n_eff(d: np.ndarray, n_resamples: int = 2000, *, seed: int) -> np.ndarray:
    """N_eff on ``n_resamples`` bootstrap resamples of the examples of ``d`` (N, L, H) (§12.4).

    Resamples come from ``Generator(PCG64(seed))`` via :func:`resample_counts`, so the same
    seed and N give the same resampled indices as :func:`paired_bootstrap_n_eff_difference`.
    """
    d = _drops_matrix(d)
    counts = resample_counts(np.random.Generator(np.random.PCG64(seed)), n_resamples, len(d))
    return _chunked_n_eff(counts, d)


def paired_bootstrap_n_eff_difference(
    d_a: np.ndarray, d_b: np.ndarray, n_resamples: int = 2000, *, seed: int
) -> np.ndarray:
    """N_eff(A) − N_eff(B) on bootstrap resamples shared by both models (docs §12.4).

    ``d_a`` (N, L_a, H_a) and ``d_b`` (N, L_b, H_b) must hold the same N examples in the same
    order (the caller aligns them by example id); each resample applies the same example
    multiplicities to both models.
    """
    d_a, d_b = _drops_matrix(d_a), _drops_matrix(d_b)
    if len(d_a) != len(d_b):
        raise ValueError(f"paired bootstrap needs the same examples, got {len(d_a)} and {len(d_b)}")
    counts = resample_counts(np.random.Generator(np.random.PCG64(seed)), n_resamples, len(d_a))
    return _chunked_n_eff(counts, d_a) - _chunked_n_eff(counts, d_b)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap ``samples``: the (1−level)/2 and (1+level)/2 quantiles
    (numpy's default linear interpolation), e.g. the 2.5 and 97.5 percentiles for 95%."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size == 0 or np.isnan(samples).any():
        return float("nan"), float("nan")
    low, high = np.quantile(samples, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def group_weights(
    labels: np.ndarray, mode: Literal["within", "leave_out"]
) -> tuple[list, np.ndarray]:
    """0/1 weightings (G, N), one per distinct label in order of first appearance.

    ``within``: only the examples of the group (§12.5); ``leave_out``: every example but
    the group's (§12.6). Returns ``(groups, weights)``.
    """
    labels = np.asarray(labels)
    groups = list(_unique_in_order(labels))
    member = np.stack([labels == g for g in groups]).astype(np.float64)
    if mode == "within":
        return groups, member
    if mode == "leave_out":
        return groups, 1.0 - member
    raise ValueError(f"mode must be 'within' or 'leave_out', got {mode!r}")


def _unique_in_order(values: np.ndarray) -> list:
    """Distinct values in order of first appearance (like pandas.unique, without pandas)."""
    _, first = np.unique(values, return_index=True)
    return [values[i] for i in np.sort(first)]


def leave_one_group_out_n_eff(d: np.ndarray, labels: np.ndarray) -> tuple[list, np.ndarray]:
    """N_eff with each lexical group's examples dropped in turn (docs §12.6).

    Returns ``(groups, n_eff)``; leaving out the only group raises (no examples remain).
    """
    groups, weights = group_weights(labels, "leave_out")
    return groups, _chunked_n_eff(weights, d)


def within_group_n_eff(d: np.ndarray, labels: np.ndarray) -> tuple[list, np.ndarray]:
    """N_eff on each group's examples alone, e.g. per task condition (docs §12.5)."""
    groups, weights = group_weights(labels, "within")
    return groups, _chunked_n_eff(weights, d)


# --------------------------------------------------------------------------- §12.3, §12.7
def spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman ρ and its two-sided p (``scipy.stats.spearmanr``, average ranks for ties).

    NaN pairs are dropped; fewer than 3 pairs or a constant variable give (NaN, NaN).
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman needs two equal-length vectors, got {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan")
    from scipy.stats import spearmanr  # here: scipy.stats costs ~0.8 s of every job's start

    result = spearmanr(x, y)
    return float(result.statistic), float(result.pvalue)


def geometric_mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Geometric mean over ``axis`` (docs §12.7: of N_eff over the three tasks); NaN if
    any value is missing or not positive."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.exp(np.mean(np.log(values), axis=axis))
    bad = np.any(~np.isfinite(values) | (values <= 0), axis=axis)
    return np.where(bad, np.nan, out)
