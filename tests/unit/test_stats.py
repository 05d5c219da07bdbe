"""Concentration metrics, index/layer decomposition and the index null (METHODS §10.1–10.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headgeom.stats import (
    concentration,
    effects_from_drops,
    index_layer_decomposition,
    index_permutation_null,
    permutation_p_value,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def test_effects_are_signed_means_over_examples():
    d = np.array([[[1.0, -2.0]], [[3.0, 2.0]]])  # (N=2, L=1, H=2)
    np.testing.assert_array_equal(effects_from_drops(d), [[2.0, 0.0]])  # +2 and −2 cancel
    np.testing.assert_array_equal(effects_from_drops(np.moveaxis(d, 0, -1), axis=-1), [[2.0, 0.0]])


def test_concentration_of_opposite_signed_pair():
    c = concentration(np.array([[1.0, -1.0], [0.0, 0.0]]))
    assert c["E"] == 2.0
    np.testing.assert_array_equal(c["p"], [[0.5, 0.5], [0.0, 0.0]])
    assert c["N_eff"] == pytest.approx(2.0, rel=1e-15)  # zero shares add no entropy
    assert c["top_head_share"] == 0.5
    assert c["top_head"] == (0, 0)  # first in row-major order on a tie


def test_n_eff_of_a_hand_computed_distribution():
    # p = (1/2, 1/4, 1/4): H = ½ln2 + ¼ln4 + ¼ln4 = 1.5 ln2, N_eff = 2^1.5
    c = concentration(np.array([[2.0, 0.0], [-1.0, 1.0]]))
    assert c["E"] == 4.0
    assert c["N_eff"] == pytest.approx(2**1.5, rel=1e-14)
    assert c["top_head_share"] == 0.5 and c["top_head"] == (0, 0)


def test_single_nonzero_effect_gives_n_eff_one():
    e = np.zeros((12, 12))
    e[7, 3] = -0.4
    c = concentration(e)
    assert c["N_eff"] == 1.0
    assert c["top_head_share"] == 1.0 and c["top_head"] == (7, 3)


def test_uniform_magnitudes_give_n_eff_l_times_h():
    e = np.where(rng(1).random((5, 7)) < 0.5, -0.3, 0.3)
    assert concentration(e)["N_eff"] == pytest.approx(35.0, rel=1e-12)


def test_top_head_is_the_largest_magnitude_even_if_negative():
    e = np.array([[0.5, 0.1, 0.0], [0.2, 0.1, -0.9]])
    c = concentration(e)
    assert c["top_head"] == (1, 2)
    assert c["top_head_share"] == pytest.approx(0.9 / 1.8)


def test_all_zero_effects_are_undefined_not_concentrated():
    c = concentration(np.zeros((3, 4)))
    assert c["E"] == 0.0 and c["top_head"] is None
    assert math.isnan(c["N_eff"]) and math.isnan(c["top_head_share"])
    assert np.isnan(c["p"]).all()
    assert all(math.isnan(x) for x in index_layer_decomposition(np.zeros((3, 4))))


def test_non_finite_effects_are_rejected():
    with pytest.raises(ValueError, match="NaN"):
        concentration(np.array([[1.0, np.nan]]))


def test_decomposition_by_hand():
    # index 0 holds 1/2 in one layer, index 1 holds 1/4 + 1/4 in two layers:
    # q = (1/2, 1/2) → N_index = 2; H(layer|0) = 0, H(layer|1) = ln2 → N_layer|index = 2^½
    e = np.array([[2.0, 1.0], [0.0, -1.0]])
    n_index, n_layer = index_layer_decomposition(e)
    assert n_index == pytest.approx(2.0, rel=1e-15)
    assert n_layer == pytest.approx(math.sqrt(2.0), rel=1e-15)
    assert n_index * n_layer == pytest.approx(concentration(e)["N_eff"], rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_decomposition_multiplies_to_n_eff(seed):
    gen = rng(seed)
    e = gen.standard_normal((12, 12)) * (gen.random((12, 12)) < 0.6)  # with exact zeros
    e[:, 4] = 0.0  # an index with no mass
    n_index, n_layer = index_layer_decomposition(e)
    assert n_index * n_layer == pytest.approx(concentration(e)["N_eff"], rel=1e-9)
    assert 1.0 <= n_index <= 11.0 and 1.0 <= n_layer <= 12.0


def test_decomposition_extremes():
    lane = np.zeros((12, 12))
    lane[:, 5] = 1.0  # one index, all layers
    assert index_layer_decomposition(lane) == pytest.approx((1.0, 12.0))
    layer = np.zeros((12, 12))
    layer[3, :] = 1.0  # one layer, all indices
    assert index_layer_decomposition(layer) == pytest.approx((12.0, 1.0))


def test_p_value_counts_ties_and_adds_one():
    null = np.array([1.0, 2.0, 3.0, 3.0 - 1e-15])
    assert permutation_p_value(null, 2.0, "less") == pytest.approx(3 / 5)
    assert permutation_p_value(null, 3.0, "greater") == pytest.approx(3 / 5)  # near-tie counted
    with pytest.raises(ValueError):
        permutation_p_value(null, 2.0, "two-sided")


def test_index_null_detects_a_single_index_lane():
    e = np.zeros((12, 12))
    e[:, 2] = rng(2).uniform(0.5, 1.5, 12)
    null, p_lower = index_permutation_null(e, 999, seed=7)
    assert null.shape == (999,)
    assert p_lower == pytest.approx(1 / 1000)  # N_index = 1 and no shuffle reaches it
    assert np.median(null) > 5.0


def test_index_null_is_reproducible_and_preserves_n_eff():
    e = rng(3).standard_normal((6, 5))
    a = index_permutation_null(e, 200, seed=11)
    b = index_permutation_null(e, 200, seed=11)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]
    assert not np.array_equal(a[0], index_permutation_null(e, 200, seed=12)[0])
    # a within-layer permutation changes N_index but never the head-level N_eff
    e_perm = np.stack([row[rng(4).permutation(5)] for row in e])
    assert concentration(e_perm)["N_eff"] == pytest.approx(concentration(e)["N_eff"], rel=1e-12)


def test_index_null_p_is_roughly_uniform_for_exchangeable_effects():
    gen = rng(5)
    p_values = [
        index_permutation_null(gen.standard_normal((6, 6)), 99, seed=s)[1] for s in range(200)
    ]
    assert 0.4 <= np.mean(p_values) <= 0.6


def test_index_null_of_all_zero_effects_is_nan():
    null, p_lower = index_permutation_null(np.zeros((3, 3)), 10, seed=0)
    assert np.isnan(null).all() and math.isnan(p_lower)
