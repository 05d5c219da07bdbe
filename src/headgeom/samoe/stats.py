"""Seed statistics of the SA-MoE study (SAMOE §17): the training seed is the replication
unit. A quantity's three-seed mean gets the Student-t interval mean ± t_{0.975, n−1} s/√n
(t_{0.975, 2} = 4.302653); a contrast is paired by seed, d_s = f(v, s) − f(ref, s), ratios on
the log scale and back-transformed (``headgeom.samoe.quality.paired_contrast``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` (one per seed); the interval is NaN for one seed."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("a seed mean needs at least one value")
    if v.size < 2:
        return float(v.mean()), math.nan, math.nan
    from scipy import stats  # here: a second to import, and most importers never call this

    half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def sequence_mean(values: np.ndarray, sequence: Sequence[str]) -> float:
    """Mean over targets, each sequence's targets averaged first (targets of one sequence
    are not independent; SAMOE §14.3, §17); NaN values skipped."""
    values = np.asarray(values, dtype=np.float64)
    sequence = np.asarray(sequence)
    means = [np.nanmean(values[sequence == s]) for s in dict.fromkeys(sequence.tolist())
             if np.isfinite(values[sequence == s]).any()]  # fmt: skip
    return float(np.mean(means)) if means else math.nan
