"""Within-checkpoint intervals (SAMOE §17): paired sequence-level bootstrap.

Targets of one sequence are not independent, so a within-checkpoint quantity is first
averaged within each sequence, then resampled over sequences: 2,000 draws of S sequences
with replacement from ``default_rng(bootstrap_seed)``, the same indices for every method and
variant (so their differences are paired), and the percentile interval [CHOICE]. Bootstrap
draws are not training replicates: seeds are the replication unit (quality.paired_contrast).
"""

from __future__ import annotations

import numpy as np

#: SAMOE §19.1 ``interventions``: resamples and their seed.
N_RESAMPLES, BOOTSTRAP_SEED = 2000, 2000


def sequence_means(values: np.ndarray, sequence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence means of ``values`` (n, ...) grouped by ``sequence`` (n,): (ids, means)
    with NaN entries left out of their sequence's mean."""
    ids, inverse = np.unique(np.asarray(sequence), return_inverse=True)
    v = np.asarray(values, dtype=np.float64)
    sums = np.zeros((len(ids), *v.shape[1:]))
    counts = np.zeros((len(ids), *v.shape[1:]))
    ok = ~np.isnan(v)
    np.add.at(sums, inverse, np.where(ok, v, 0.0))
    np.add.at(counts, inverse, ok)
    with np.errstate(invalid="ignore"):
        return ids, sums / counts


def resample_indices(
    n_sequences: int, n: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> np.ndarray:
    """(n, S) sequence indices drawn with replacement: one matrix shared by every method."""
    return np.random.default_rng(seed).integers(0, n_sequences, size=(n, n_sequences))


def percentile_interval(
    per_sequence: np.ndarray, indices: np.ndarray, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) of the mean over sequences of ``per_sequence`` (S, ...), from
    the resamples ``indices`` (n, S); NaN sequences are ignored within a resample."""
    x = np.asarray(per_sequence, dtype=np.float64)
    draws = np.nanmean(x[indices], axis=1)  # (n, ...)
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(draws, [tail, 100 - tail], axis=0)
    return np.nanmean(x, axis=0), low, high
