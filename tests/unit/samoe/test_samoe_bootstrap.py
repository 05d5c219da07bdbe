"""SAMOE §17: the paired sequence-level bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from headgeom.samoe import bootstrap as bs


def test_sequence_means_average_targets_within_their_sequence():
    ids, means = bs.sequence_means(
        np.array([1.0, 3.0, np.nan, 10.0]), np.array(["a", "a", "b", "b"])
    )
    assert ids.tolist() == ["a", "b"] and means.tolist() == [2.0, 10.0]


def test_the_resamples_are_shared_and_seeded():
    a, b = bs.resample_indices(24), bs.resample_indices(24)
    assert a.shape == (2000, 24) and np.array_equal(a, b)
    assert not np.array_equal(a, bs.resample_indices(24, seed=1))


def test_percentile_interval_against_a_naive_loop():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 2))  # two methods, paired over the same sequences
    idx = bs.resample_indices(24, n=500, seed=3)
    est, low, high = bs.percentile_interval(x, idx)
    draws = np.array([[x[row, m].mean() for m in range(2)] for row in idx])
    assert est == pytest.approx(x.mean(0))
    assert low == pytest.approx(np.percentile(draws, 2.5, axis=0))
    assert high == pytest.approx(np.percentile(draws, 97.5, axis=0))
    # paired: the interval of the difference uses the same draws
    _, dl, dh = bs.percentile_interval(x[:, 0] - x[:, 1], idx)
    diff = draws[:, 0] - draws[:, 1]
    assert (dl, dh) == pytest.approx(tuple(np.percentile(diff, [2.5, 97.5])))
