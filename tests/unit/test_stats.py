"""Concentration metrics, the index null and the §12 resampling statistics (docs §10, §12)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import kstest

from headgeom.heads.analysis.stats import (
    bootstrap_n_eff,
    concentration,
    effects_abs_from_drops,
    effects_from_drops,
    geometric_mean,
    index_layer_decomposition,
    index_permutation_null,
    leave_one_group_out_n_eff,
    n_eff_batch,
    paired_bootstrap_n_eff_difference,
    percentile_interval,
    permutation_p_value,
    resample_counts,
    spearman,
    weighted_effects,
    within_group_n_eff,
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


def test_index_null_p_of_exchangeable_effects_passes_a_uniformity_test():
    # Under exchangeability the observed index labelling is one more uniform draw, so
    # P(p ≤ k/(n+1)) = k/(n+1): the p-values of independent replicates are uniform.
    gen = rng(6)
    p_values = np.array(
        [index_permutation_null(gen.standard_normal((4, 5)), 199, seed=s)[1] for s in range(300)]
    )
    assert kstest(p_values, "uniform").pvalue > 0.01
    assert 0.03 <= np.mean(p_values <= 0.1) <= 0.17  # ≈ 0.1 of them at level 0.1


def test_index_null_p_is_small_for_a_planted_concentrated_index_under_noise():
    gen = rng(7)
    p_values = []
    for s in range(20):
        e = 0.05 * gen.standard_normal((12, 12))
        e[:, 3] += gen.uniform(0.5, 1.0, 12)  # index 3 carries most effect in every layer
        p_values.append(index_permutation_null(e, 5000, seed=s)[1])
    assert max(p_values) <= 0.001


# --------------------------------------------------------------------------- §12 resampling
def test_n_eff_batch_matches_concentration_per_matrix():
    gen = rng(8)
    stack = gen.standard_normal((5, 3, 4))
    stack[2] = 0.0
    out = n_eff_batch(stack)
    for k in (0, 1, 3, 4):
        assert out[k] == pytest.approx(concentration(stack[k])["N_eff"], rel=1e-13)
    assert math.isnan(out[2])


def test_per_example_absolute_effect():
    d = np.array([[[1.0, -2.0]], [[-3.0, 2.0]]])
    np.testing.assert_array_equal(effects_abs_from_drops(d), [[2.0, 2.0]])
    np.testing.assert_array_equal(effects_from_drops(d), [[-1.0, 0.0]])


def test_resample_counts_are_the_multiplicities_of_uniform_index_draws():
    counts = resample_counts(rng(9), 50, 7)
    index = rng(9).integers(0, 7, size=(50, 7))  # the same draws, made independently
    expected = np.stack([np.bincount(row, minlength=7) for row in index])
    np.testing.assert_array_equal(counts, expected)
    assert (counts.sum(axis=1) == 7).all()


def test_weighted_effects_equal_means_over_explicit_resamples():
    gen = rng(10)
    d = gen.standard_normal((9, 2, 3))
    index = gen.integers(0, 9, size=(4, 9))
    counts = np.stack([np.bincount(row, minlength=9) for row in index])
    got = weighted_effects(counts, d)
    for b in range(4):
        np.testing.assert_allclose(got[b], d[index[b]].mean(axis=0), rtol=1e-12, atol=1e-14)


def test_bootstrap_is_reproducible_and_matches_a_loop():
    gen = rng(11)
    d = gen.standard_normal((30, 3, 3)) + np.linspace(0.0, 2.0, 9).reshape(3, 3)
    a = bootstrap_n_eff(d, 40, seed=5)
    np.testing.assert_array_equal(a, bootstrap_n_eff(d, 40, seed=5))
    assert not np.array_equal(a, bootstrap_n_eff(d, 40, seed=6))
    index = np.random.Generator(np.random.PCG64(5)).integers(0, 30, size=(40, 30))
    loop = [concentration(d[i].mean(axis=0))["N_eff"] for i in index]
    np.testing.assert_allclose(a, loop, rtol=1e-12)


def test_bootstrap_interval_is_tight_around_n_eff_for_nearly_constant_drops():
    e0 = np.array([[3.0, 1.0, 0.0], [0.5, -2.0, 0.25]])
    d = e0 + 1e-4 * rng(12).standard_normal((240, 2, 3))
    low, high = percentile_interval(bootstrap_n_eff(d, 500, seed=1))
    target = concentration(e0)["N_eff"]
    assert low < concentration(d.mean(axis=0))["N_eff"] < high
    assert target - 1e-3 < low <= high < target + 1e-3


def test_percentile_interval_takes_the_two_tail_quantiles():
    samples = rng(13).permutation(np.arange(101.0))  # quantile q of 0..100 is 100q
    assert percentile_interval(samples, 0.95) == pytest.approx((2.5, 97.5))
    assert percentile_interval(samples, 0.5) == pytest.approx((25.0, 75.0))
    with pytest.raises(ValueError):
        percentile_interval(samples, 1.0)


def test_paired_bootstrap_of_a_model_with_itself_is_exactly_zero():
    d = rng(14).standard_normal((60, 4, 4))
    diff = paired_bootstrap_n_eff_difference(d, d.copy(), 300, seed=3)
    assert np.all(diff == 0.0)
    assert percentile_interval(diff) == (0.0, 0.0)


def test_paired_bootstrap_applies_the_same_resamples_to_both_models():
    gen = rng(15)
    d_a = gen.standard_normal((40, 3, 4)) + 1.0
    d_b = gen.standard_normal((40, 2, 6))  # another shape: pairing is over examples only
    diff = paired_bootstrap_n_eff_difference(d_a, d_b, 100, seed=9)
    np.testing.assert_allclose(
        diff, bootstrap_n_eff(d_a, 100, seed=9) - bootstrap_n_eff(d_b, 100, seed=9), rtol=1e-12
    )
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap_n_eff_difference(d_a, d_b[:39], 10, seed=9)


def test_leave_one_group_out_and_within_group_by_hand():
    # One layer, two heads, one example per group: a = (2, 0), b = (0, 2), c = (1, 1).
    d = np.array([[[2.0, 0.0]], [[0.0, 2.0]], [[1.0, 1.0]]])
    labels = np.array(["a", "b", "c"])
    groups, n_eff = leave_one_group_out_n_eff(d, labels)
    # without a: e = (0.5, 1.5), p = (1/4, 3/4); without c: e = (1, 1), p = (1/2, 1/2)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert groups == ["a", "b", "c"]
    np.testing.assert_allclose(n_eff, [math.exp(h), math.exp(h), 2.0], rtol=1e-14)
    groups, n_eff = within_group_n_eff(d, labels)
    np.testing.assert_allclose(n_eff, [1.0, 1.0, 2.0], rtol=1e-14)
    with pytest.raises(ValueError, match="positive weight"):
        leave_one_group_out_n_eff(d, np.array(["a", "a", "a"]))


def test_geometric_mean():
    assert geometric_mean(np.array([2.0, 8.0])) == pytest.approx(4.0)
    np.testing.assert_allclose(geometric_mean(np.array([[1.0, 9.0], [4.0, 0.0]])), [3.0, np.nan])


# Paper Table 6 N_eff (SVA, quote, plural) and §6.1 validation losses of the 9 corpus-S
# models of paper Figure 4; the last three are the 16-head write-routed models.
PAPER_S_MODELS = {
    "learned": (3.508, (10.4, 12.0, 9.2)),
    "write-rotated": (3.563, (16.2, 22.2, 22.2)),
    "read-common": (3.610, (8.1, 11.0, 10.0)),
    "all-common-axis": (3.698, (8.1, 12.7, 3.9)),
    "all-rotated": (3.751, (9.1, 11.4, 3.6)),
    "all-rotated-self": (3.753, (8.8, 7.9, 3.9)),
    "write-routed A": (3.542, (18.9, 31.6, 20.3)),
    "write-routed B": (3.543, (29.1, 29.0, 21.6)),
    "write-routed C": (3.553, (31.1, 39.7, 15.8)),
}


def test_c16_spearman_of_the_paper_loss_and_n_eff():
    loss = np.array([v[0] for v in PAPER_S_MODELS.values()])
    n_eff = geometric_mean(np.array([v[1] for v in PAPER_S_MODELS.values()]))
    rho_all, _ = spearman(loss, n_eff)
    rho_12, _ = spearman(loss[:6], n_eff[:6])
    assert round(rho_all, 3) == -0.767  # docs §12.7, C16
    assert round(rho_12, 3) == -0.943
    # By hand for the six 12-head models: loss ranks 1..6, N_eff ranks 5, 6, 4, 3, 2, 1
    # (geometric means 10.5, 20.1, 9.6, 7.4, 7.2, 6.6): Σd² = 68, ρ = 1 − 6·68 / (6·35).
    assert rho_12 == pytest.approx(1 - 6 * 68 / (6 * 35), abs=1e-12)


def test_spearman_is_undefined_for_too_few_or_constant_values():
    assert all(math.isnan(x) for x in spearman(np.array([1.0, 2.0]), np.array([2.0, 1.0])))
    assert math.isnan(spearman(np.ones(4), np.arange(4.0))[0])
    assert spearman(np.arange(5.0), np.arange(5.0) ** 3)[0] == pytest.approx(1.0)
