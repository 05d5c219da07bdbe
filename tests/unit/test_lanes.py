"""Lane score Λ and its permutation test (docs §10.5)."""

from __future__ import annotations

import time
from math import comb

import numpy as np
import pytest

from headgeom.heads.analysis.lanes import lane_permutation_test, lane_score


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def lane_score_brute_force(e: np.ndarray) -> float | None:
    """The definition, pair by pair."""
    w = np.maximum(e, 0.0)
    n_layers, n_heads = w.shape
    same = total = 0.0
    for l in range(n_layers):  # noqa: E741
        for lp in range(l + 1, n_layers):
            for h in range(n_heads):
                for hp in range(n_heads):
                    total += w[l, h] * w[lp, hp]
                    if h == hp:
                        same += w[l, h] * w[lp, hp]
    return None if total == 0.0 else same / total


def test_all_mass_in_one_index_gives_one():
    e = np.zeros((12, 12))
    e[:, 4] = rng(1).uniform(0.1, 2.0, 12)
    assert lane_score(e) == pytest.approx(1.0, rel=1e-15)


def test_uniform_positive_matrix_is_at_chance():
    # numerator H·C(L,2), denominator C(L,2)·H² ⇒ Λ = 1/H exactly
    L, H = 12, 12
    assert comb(L, 2) * H / (comb(L, 2) * H**2) == 1 / H
    assert lane_score(np.full((L, H), 0.37)) == pytest.approx(1 / H, rel=1e-14)
    assert lane_score(np.ones((21, 16))) == pytest.approx(1 / 16, rel=1e-14)


def test_negative_effects_do_not_count():
    e = np.zeros((4, 3))
    e[:, 1] = 1.0
    noisy = e.copy()
    noisy[:, [0, 2]] = -5.0  # helpful patches: w = 0
    assert lane_score(noisy) == lane_score(e) == 1.0


def test_undefined_without_two_positive_layers():
    e = -np.ones((5, 4))
    assert lane_score(e) is None
    e[2, :] = 1.0  # positive effects in one layer only: no cross-layer pairs
    assert lane_score(e) is None
    lam, p, null = lane_permutation_test(e, 10, seed=0)
    assert lam is None and p is None and null.shape == (10,) and np.isnan(null).all()


def assert_same_score(fast: float | None, slow: float | None) -> None:
    """An undefined score on both sides is agreement; a defined one must agree to 1e-12."""
    if slow is None:
        assert fast is None
    else:
        assert fast is not None and fast == pytest.approx(slow, rel=1e-12)


def defined_effects(gen: np.random.Generator) -> np.ndarray:
    """Random effects with positive entries in at least two layers: Λ is defined."""
    e = gen.standard_normal((gen.integers(2, 9), gen.integers(1, 7)))
    first, second = gen.choice(e.shape[0], size=2, replace=False)
    for layer in (first, second):
        e[layer, gen.integers(e.shape[1])] = gen.uniform(0.1, 2.0)
    return e


def undefined_effects(gen: np.random.Generator) -> np.ndarray:
    """Random effects whose positive entries (if any) lie in one layer: Λ is undefined."""
    e = -np.abs(gen.standard_normal((gen.integers(1, 9), gen.integers(1, 7))))
    if gen.random() < 0.5:  # half the draws keep one layer with positive effects
        e[gen.integers(e.shape[0])] = np.abs(gen.standard_normal(e.shape[1]))
    return e


EFFECTS = {"defined": defined_effects, "undefined": undefined_effects}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", sorted(EFFECTS))
def test_vectorised_score_matches_the_double_loop(case, seed):
    e = EFFECTS[case](rng(seed))
    expected = lane_score_brute_force(e)
    assert (expected is None) == (case == "undefined")  # the draw is the case it claims
    assert_same_score(lane_score(e), expected)


def test_tiny_layer_next_to_a_huge_one_is_not_cancelled():
    e = np.zeros((2, 2))
    e[0, 0], e[1, 1] = 1e8, 1e-8  # ((Σr)² − Σr²)/2 would round the denominator to 0
    assert lane_score(e) == 0.0


def test_planted_lane_is_significant():
    gen = rng(2)
    e = 0.05 * gen.standard_normal((12, 12))
    e[:, 6] += gen.uniform(0.5, 1.0, 12)
    lam, p, null = lane_permutation_test(e, 999, seed=3)
    assert lam == pytest.approx(lane_score(e))
    assert lam > 0.5
    assert p <= 0.01
    assert null.shape == (999,) and np.all((null >= 0) & (null <= 1))


def test_p_is_roughly_uniform_for_exchangeable_effects():
    gen = rng(4)
    p_values = [
        lane_permutation_test(gen.standard_normal((8, 8)), 99, seed=s)[1] for s in range(200)
    ]
    assert 0.4 <= np.mean(p_values) <= 0.6


def test_permutation_test_is_reproducible_under_a_seed():
    e = rng(5).standard_normal((12, 12))
    a, b = lane_permutation_test(e, 300, seed=9), lane_permutation_test(e, 300, seed=9)
    assert a[0] == b[0] and a[1] == b[1]
    np.testing.assert_array_equal(a[2], b[2])
    assert not np.array_equal(a[2], lane_permutation_test(e, 300, seed=10)[2])


def test_null_matches_brute_force_on_the_same_shuffles():
    e = rng(6).standard_normal((5, 4))
    _, _, null = lane_permutation_test(e, 20, seed=1)
    # Rebuild the same shuffles: argsort of uniform keys drawn from the same generator.
    keys = np.random.Generator(np.random.PCG64(1)).random((20, 5, 4))
    perms = np.argsort(keys, axis=-1)
    expected = [lane_score_brute_force(np.take_along_axis(e, perm, axis=-1)) for perm in perms]
    np.testing.assert_allclose(null, expected, rtol=1e-12)


def test_5000_permutations_of_12x12_take_well_under_a_second():
    e = rng(7).standard_normal((12, 12))
    start = time.perf_counter()
    lane_permutation_test(e, 5000, seed=0)
    assert time.perf_counter() - start < 1.0
