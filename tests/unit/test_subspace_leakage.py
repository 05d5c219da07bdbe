"""Subspace geometry and directional leakage against first-principles expectations (docs §9)."""

from __future__ import annotations

import numpy as np
import pytest

from headgeom.heads.analysis.leakage import (
    directional_leakage,
    isotropic_expectation,
    leakage_to_readers,
)
from headgeom.subspace import (
    centering_projector,
    folded_block_read_basis,
    folded_read_basis,
    orthonormal_basis,
    overlap_rho,
    pk_spans,
    principal_cosines,
    projection_kernel,
    shared_dimensions,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def random_orthogonal(D: int, gen: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(gen.standard_normal((D, D)))
    return q * np.sign(np.diag(r))  # sign fix makes the draw Haar-distributed


def random_subspace(D: int, k: int, gen: np.random.Generator) -> np.ndarray:
    return orthonormal_basis(gen.standard_normal((D, k)))


def projector(B: np.ndarray) -> np.ndarray:
    return B @ B.T


# --- orthonormal_basis -------------------------------------------------------------------


def test_basis_is_orthonormal_and_spans_the_column_space():
    gen = rng(1)
    A = gen.standard_normal((20, 3)) @ gen.standard_normal((3, 7))  # rank 3, 7 columns
    B = orthonormal_basis(A)
    assert B.shape == (20, 3)
    np.testing.assert_allclose(B.T @ B, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(projector(B) @ A, A, atol=1e-12)  # every column of A lies in Im B


def test_basis_drops_singular_values_below_rtol():
    gen = rng(2)
    Q = random_orthogonal(10, gen)
    A = Q[:, :3] * np.array([1.0, 1e-3, 1e-8])  # σ = 1, 1e-3, 1e-8
    assert orthonormal_basis(A).shape == (10, 2)  # 1e-8 < 1e-6·σ_max
    assert orthonormal_basis(A, rtol=1e-9).shape == (10, 3)


def test_basis_of_zero_matrix_is_empty():
    assert orthonormal_basis(np.zeros((6, 4))).shape == (6, 0)
    assert orthonormal_basis(np.zeros((6, 0))).shape == (6, 0)


# --- PK, ρ, principal angles -------------------------------------------------------------


def test_pk_of_a_subspace_with_itself_is_its_dimension():
    U = random_subspace(16, 5, rng(3))
    assert projection_kernel(U, U) == pytest.approx(5.0, abs=1e-12)
    assert overlap_rho(U, U) == pytest.approx(1.0, abs=1e-12)


def test_pk_of_orthogonal_subspaces_is_zero():
    Q = random_orthogonal(12, rng(4))
    assert projection_kernel(Q[:, :4], Q[:, 4:9]) == pytest.approx(0.0, abs=1e-12)


def test_pk_equals_trace_of_projector_product_and_sum_of_squared_cosines():
    gen = rng(5)
    U, V = random_subspace(15, 4, gen), random_subspace(15, 6, gen)
    pk = projection_kernel(U, V)
    assert pk == pytest.approx(np.trace(projector(U) @ projector(V)), abs=1e-12)
    assert pk == pytest.approx(np.sum(principal_cosines(U, V) ** 2), abs=1e-12)
    assert overlap_rho(U, V) == pytest.approx(pk / 4, abs=1e-15)


def test_pk_spans_ignores_scale_and_redundant_columns():
    gen = rng(6)
    U, V = random_subspace(10, 3, gen), random_subspace(10, 3, gen)
    A = 0.113 * np.hstack([U, U @ gen.standard_normal((3, 2))])  # g·W with dependent columns
    assert pk_spans(A, V) == pytest.approx(projection_kernel(U, V), abs=1e-12)


def test_principal_cosine_of_a_known_angle():
    theta = 0.3
    U = np.array([[1.0], [0.0], [0.0]])
    V = np.array([[np.cos(theta)], [np.sin(theta)], [0.0]])
    np.testing.assert_allclose(principal_cosines(U, V), [np.cos(theta)], atol=1e-15)
    assert shared_dimensions(U, V) == 0


def test_shared_dimensions_counts_a_planted_intersection():
    Q = random_orthogonal(20, rng(7))
    common, only_u, only_v = Q[:, :3], Q[:, 3:6], Q[:, 6:10]
    U = np.hstack([common, only_u])
    V = orthonormal_basis(np.hstack([common, only_v + 0.5 * only_u[:, :1]]))
    assert shared_dimensions(U, V) == 3
    cosines = principal_cosines(U, V)
    assert np.all((cosines >= 0) & (cosines <= 1)) and np.all(np.diff(cosines) <= 0)


def test_proposition_1_overlap_is_conserved():
    """Σ_i PK(U_i, R) = dim R for an orthogonal decomposition of R^D (docs §9.4)."""
    gen = rng(8)
    D, block = 24, 6
    Q = random_orthogonal(D, gen)
    blocks = [Q[:, i : i + block] for i in range(0, D, block)]
    for dim_r in (1, 5, 6, 13):
        R = random_subspace(D, dim_r, gen)
        total = sum(projection_kernel(U_i, R) for U_i in blocks)
        assert total == pytest.approx(dim_r, abs=1e-10)
        # inter-index exclusivity: the other indices receive dim R − PK(same index)
        others = sum(projection_kernel(U_i, R) for U_i in blocks[1:])
        assert others == pytest.approx(dim_r - projection_kernel(blocks[0], R), abs=1e-10)


def test_expected_pk_of_random_subspaces_is_ab_over_D():
    """E[PK] = ab/D for independent uniform subspaces: 4·4/16 = 1 (docs §9.3)."""
    gen = rng(9)
    draws = [
        projection_kernel(random_subspace(16, 4, gen), random_subspace(16, 4, gen))
        for _ in range(2000)
    ]
    assert np.mean(draws) == pytest.approx(1.0, abs=0.05)  # SE ≈ 0.012


# --- folded read spaces ------------------------------------------------------------------


def test_centering_projector_is_the_projector_off_the_ones_vector():
    P = centering_projector(7)
    np.testing.assert_allclose(P @ P, P, atol=1e-15)
    np.testing.assert_allclose(P @ np.ones(7), 0.0, atol=1e-15)
    assert np.trace(P) == pytest.approx(6.0)


def test_folded_read_space_of_a_free_reader():
    gen = rng(10)
    d, D = 8, 32
    W_X = gen.standard_normal((d, D))
    gamma = gen.uniform(0.5, 1.5, D)
    R = folded_read_basis(W_X, gamma)
    assert R.shape == (D, d)  # generically d-dimensional
    np.testing.assert_allclose(R.T @ np.ones(D), 0.0, atol=1e-12)
    # same subspace as Im Aᵀ with the folded map A = W_X diag(γ) P_c built explicitly
    A = W_X @ np.diag(gamma) @ centering_projector(D)
    np.testing.assert_allclose(projector(R), projector(orthonormal_basis(A.T)), atol=1e-10)


def test_folded_read_space_of_a_full_width_reader_loses_the_mean_direction():
    gen = rng(11)
    D = 12
    R = folded_read_basis(gen.standard_normal((D, D)), gen.uniform(0.5, 1.5, D))
    assert R.shape == (D, D - 1)


def test_zero_gain_coordinates_leave_the_folded_read_space():
    gen = rng(12)
    d, D = 4, 10
    gamma = np.ones(D)
    gamma[:8] = 0.0  # only coordinates 8 and 9 pass the gain
    R = folded_read_basis(gen.standard_normal((d, D)), gamma)
    expected = orthonormal_basis(centering_projector(D) @ np.eye(D)[:, 8:])  # their centred span
    assert R.shape == (D, 2)
    np.testing.assert_allclose(projector(R), projector(expected), atol=1e-12)


def test_folded_block_read_space():
    gen = rng(13)
    D, b, d = 48, 16, 16
    S = random_orthogonal(D, gen)[:, 16:32]
    A_X = gen.standard_normal((d, b))
    gamma_h = gen.uniform(0.5, 1.5, b)
    R = folded_block_read_basis(S, A_X, gamma_h)
    assert R.shape == (D, b - 1)  # the centred block
    np.testing.assert_allclose(R.T @ R, np.eye(b - 1), atol=1e-12)
    np.testing.assert_allclose(projector(S) @ R, R, atol=1e-12)  # inside Im S
    np.testing.assert_allclose(R.T @ (S @ np.ones(b)), 0.0, atol=1e-12)  # ⊥ the block mean
    # independent of the gain and of the (nondegenerate) block map
    R_plain = folded_block_read_basis(S, np.eye(b), np.ones(b))
    assert shared_dimensions(R, R_plain) == b - 1


def test_folded_block_read_space_rejects_a_non_orthonormal_block():
    with pytest.raises(ValueError, match="orthonormal"):
        folded_block_read_basis(2.0 * np.eye(8)[:, :4], np.eye(4), np.ones(4))


# --- leakage -----------------------------------------------------------------------------


def test_leakage_inside_and_orthogonal_to_the_read_space():
    gen = rng(15)
    Q = random_orthogonal(20, gen)
    R, outside = Q[:, :5], Q[:, 5:]
    assert directional_leakage(gen.standard_normal((50, 5)) @ R.T, R) == pytest.approx(1.0)
    assert directional_leakage(gen.standard_normal((50, 15)) @ outside.T, R) == pytest.approx(
        0.0, abs=1e-12
    )


def test_leakage_pools_energy_over_rows_not_ratios():
    e1, e2 = np.eye(3)[0], np.eye(3)[1]
    R = e1[:, None]
    delta = np.stack([3.0 * e1, 1.0 * e2])  # per-row ratios 1 and 0; pooled 9 / 10
    assert directional_leakage(delta, R) == pytest.approx(0.9)
    # (examples, positions, D) pools the same way
    assert directional_leakage(delta.reshape(1, 2, 3), R) == pytest.approx(0.9)


def test_zero_perturbation_has_nan_leakage():
    R = np.eye(4)[:, :2]
    assert np.isnan(directional_leakage(np.zeros((5, 4)), R))
    assert np.isnan(leakage_to_readers(np.zeros((5, 4)), [R, R])).all()


def test_isotropic_perturbation_in_U_leaks_rho():
    """δ isotropic within U ⇒ L → PK(U, R)/dim U = ρ(U, R) for equal dimensions (docs §9.5)."""
    gen = rng(16)
    D, k = 32, 8
    U, R = random_subspace(D, k, gen), random_subspace(D, k, gen)
    delta = gen.standard_normal((20000, k)) @ U.T
    assert isotropic_expectation(U, R) == pytest.approx(overlap_rho(U, R), abs=1e-15)
    assert directional_leakage(delta, R) == pytest.approx(overlap_rho(U, R), abs=0.01)


@pytest.mark.parametrize("n_rows", [10, 200])  # both the direct (N ≤ D) and Gram (N > D) paths
def test_batched_leakage_matches_one_reader_at_a_time(n_rows):
    gen = rng(17)
    D = 40
    delta = gen.standard_normal((n_rows, D))
    readers = [random_subspace(D, k, gen) for k in (1, 6, 6, 12)] + [np.zeros((D, 0))]
    batched = leakage_to_readers(delta, readers)
    one_by_one = [directional_leakage(delta, R) for R in readers]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-12, atol=1e-14)
    assert batched[-1] == 0.0  # a zero-dimensional reader captures nothing


def test_batched_leakage_accepts_a_stack():
    gen = rng(18)
    D = 16
    stack = np.stack([random_subspace(D, 4, gen) for _ in range(3)])  # (J, D, r)
    delta = gen.standard_normal((3, 7, D))
    np.testing.assert_allclose(
        leakage_to_readers(delta, stack),
        [directional_leakage(delta, R) for R in stack],
        rtol=1e-12,
    )
