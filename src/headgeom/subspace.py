"""Subspaces of the residual stream: bases, projection kernel, folded read spaces (docs §9).

Every subspace is carried as an orthonormal basis matrix with one column per dimension,
shape ``(D, r)``. Functions that take ``U``/``V``/``R`` assume orthonormal columns (as
returned by :func:`orthonormal_basis`) and do not re-check it; :func:`pk_spans` is the
one entry point that accepts arbitrary spanning matrices.
"""

from __future__ import annotations

import numpy as np

#: Relative singular-value cut-off for rank decisions (docs §9.1).
RANK_RTOL = 1e-6
#: A principal cosine above ``1 - SHARED_TOL`` counts as a shared dimension (docs §9.3).
SHARED_TOL = 1e-9


def orthonormal_basis(A: np.ndarray, rtol: float = RANK_RTOL) -> np.ndarray:
    """Orthonormal basis of the column space ``Im A``, shape ``(D, r)``.

    ``A`` has shape ``(D, k)``. Rank-revealing SVD: keep left singular vectors whose
    singular value exceeds ``rtol * sigma_max`` (docs §9.1). A zero matrix gives an
    empty ``(D, 0)`` basis.
    """
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {A.shape}")
    if A.size == 0:
        return np.zeros((A.shape[0], 0))
    left, sigma, _ = np.linalg.svd(A, full_matrices=False)
    if sigma[0] == 0.0:
        return np.zeros((A.shape[0], 0))
    return left[:, sigma > rtol * sigma[0]]


def orthonormal_bases(A: np.ndarray, rtol: float = RANK_RTOL) -> list[np.ndarray]:
    """:func:`orthonormal_basis` of every matrix of a stack ``A`` (n, D, k) by one batched
    SVD (same rank rule per matrix). Returns n bases (D, r_i)."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 3:
        raise ValueError(f"expected a stack (n, D, k), got shape {A.shape}")
    if A.size == 0:
        return [np.zeros((A.shape[1], 0)) for _ in range(A.shape[0])]
    left, sigma, _ = np.linalg.svd(A, full_matrices=False)
    return [
        u[:, s > rtol * s[0]] if s[0] > 0.0 else np.zeros((A.shape[1], 0))
        for u, s in zip(left, sigma, strict=True)
    ]


def projection_kernel(U: np.ndarray, V: np.ndarray) -> float:
    """PK(U, V) = ||UᵀV||_F² = tr(P_U P_V) = Σ cos²θ_i, orthonormal ``U`` (D, a), ``V`` (D, b)."""
    return float(np.sum(np.square(U.T @ V)))


def pk_spans(A: np.ndarray, B: np.ndarray, rtol: float = RANK_RTOL) -> float:
    """PK(Im A, Im B) for arbitrary spanning matrices ``A (D, k)``, ``B (D, m)``.

    Orthonormalises both with :func:`orthonormal_basis` first; scale (e.g. the write gain g)
    therefore does not matter.
    """
    return projection_kernel(orthonormal_basis(A, rtol), orthonormal_basis(B, rtol))


def overlap_rho(U: np.ndarray, V: np.ndarray) -> float:
    """ρ(U, V) = PK(U, V) / min(dim U, dim V) ∈ [0, 1]; NaN if either subspace is {0}."""
    m = min(U.shape[1], V.shape[1])
    if m == 0:
        return float("nan")
    return projection_kernel(U, V) / m


def principal_cosines(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Cosines of the principal angles, shape ``(min(a, b),)``, descending (angles ascending).

    Singular values of ``UᵀV`` clipped to [0, 1]: rounding can push a shared direction's
    cosine a few ulps above 1, which would make ``arccos`` return NaN.
    """
    cosines = np.linalg.svd(U.T @ V, compute_uv=False)
    return np.clip(cosines, 0.0, 1.0)


def shared_dimensions(U: np.ndarray, V: np.ndarray, tol: float = SHARED_TOL) -> int:
    """dim(U ∩ V) counted numerically: principal cosines above ``1 - tol`` (docs §9.3)."""
    return int(np.count_nonzero(principal_cosines(U, V) > 1.0 - tol))


def centering_projector(D: int) -> np.ndarray:
    """P_c = I − 11ᵀ/D, shape ``(D, D)``: LayerNorm's mean removal as a projector."""
    return np.eye(D) - np.full((D, D), 1.0 / D)


def folded_read_basis(W_X: np.ndarray, gamma: np.ndarray, rtol: float = RANK_RTOL) -> np.ndarray:
    """Folded read space of a free reader, R_X = Im(P_c diag(γ) W_Xᵀ) (docs §9.2).

    ``W_X`` is the reader matrix, shape ``(d, D)`` (column-vector convention, q = W_Q LN(x));
    ``gamma`` is the gain of the reader's pre-attention LayerNorm, shape ``(D,)``.
    Returns an orthonormal basis, shape ``(D, r)``; generically ``r = d`` (for ``d < D``)
    and always orthogonal to the all-ones vector.
    """
    W_X = np.asarray(W_X, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    if gamma.shape != (W_X.shape[1],):
        raise ValueError(f"gamma has shape {gamma.shape}, expected ({W_X.shape[1]},)")
    scaled = gamma[:, None] * W_X.T  # diag(γ) W_Xᵀ, (D, d)
    centred = scaled - scaled.mean(axis=0, keepdims=True)  # P_c without forming the D×D matrix
    return orthonormal_basis(centred, rtol)


def folded_block_read_basis(
    S: np.ndarray, A_X: np.ndarray, gamma_h: np.ndarray, rtol: float = RANK_RTOL
) -> np.ndarray:
    """Folded read space of a block reader, R_X = S · Im(P_c^(b) diag(γ_h) A_Xᵀ) (docs §9.2).

    ``S`` is the read block, shape ``(D, b)`` with orthonormal columns (b = 64 in the paper);
    ``A_X`` the learned block map, shape ``(d, b)``; ``gamma_h`` the per-head LayerNorm gain,
    shape ``(b,)``. Centering acts within the block, so the result has at most ``b − 1``
    dimensions (exactly ``b − 1`` when ``A_X`` and ``gamma_h`` are nondegenerate), lies in
    ``Im S`` and is orthogonal to ``S·1``. Returns an orthonormal basis, shape ``(D, r)``.
    """
    S = np.asarray(S, dtype=np.float64)
    b = S.shape[1]
    # S·Q is orthonormal only if S is; a non-orthonormal S would silently give a wrong basis.
    if not np.allclose(S.T @ S, np.eye(b), rtol=0.0, atol=1e-8):
        raise ValueError("S must have orthonormal columns")
    inner = folded_read_basis(A_X, gamma_h, rtol)  # (b, r): the free-reader fold in block coords
    return S @ inner


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-random n×n orthogonal matrix: QR of a standard Gaussian matrix with the signs
    of R's diagonal moved into Q (Mezzadri 2007), float64."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))[None, :]
