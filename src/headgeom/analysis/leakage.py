"""Directional leakage of a patch perturbation into later readers (METHODS §9.5, §11.3).

L_{i→j} = Σ‖P_R δ_i‖² / Σ‖δ_i‖², pooled over every row of ``delta`` (rows are
examples × positions). With an orthonormal reader basis ``R`` (D, r), ‖P_R δ‖ = ‖Rᵀδ‖,
so the numerator is one matrix product and never needs the D×D projector.

A perturbation with no energy (Σ‖δ‖² = 0, e.g. a head whose reference and clean outputs
coincide) has no direction; its leakage is NaN, never 0, so it cannot pass as "no leakage".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from headgeom.analysis.subspace import projection_kernel


def _rows(delta: np.ndarray) -> np.ndarray:
    """Flatten ``(..., D)`` perturbations to ``(N, D)`` float64 rows."""
    delta = np.asarray(delta, dtype=np.float64)
    if delta.ndim < 1:
        raise ValueError("delta must have a trailing residual axis D")
    return delta.reshape(-1, delta.shape[-1])


def directional_leakage(delta: np.ndarray, R: np.ndarray) -> float:
    """L = Σ‖Rᵀδ‖² / Σ‖δ‖² for perturbations ``delta`` (N, D) and reader basis ``R`` (D, r).

    ``delta`` may also be ``(examples, positions, D)``; all leading axes are pooled.
    ``R`` must have orthonormal columns. Returns NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return float("nan")
    return float(np.sum(np.square(rows @ R))) / total


def leakage_to_readers(delta: np.ndarray, readers: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """L for one source perturbation and many readers at once, shape ``(J,)``.

    ``delta``: ``(N, D)`` or ``(..., D)``, the source head's perturbation rows.
    ``readers``: a sequence of J orthonormal bases ``(D, r_j)`` (ranks may differ, r_j = 0
    gives 0), or a stack ``(J, D, r)``.

    All bases are concatenated into one ``(D, Σr_j)`` matrix so a single product gives every
    column's captured energy. When there are more rows than residual dimensions (N > D) the
    energies come from the Gram matrix G = δᵀδ instead (column k: r_kᵀ G r_k), which needs
    N·D² + D²·Σr operations and a D×Σr buffer rather than N·D·Σr and an N×Σr buffer.
    Returns all-NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    bases = list(readers)
    if not bases:
        return np.zeros(0)
    widths = np.array([basis.shape[1] for basis in bases])
    stacked = np.concatenate([np.asarray(basis, dtype=np.float64) for basis in bases], axis=1)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return np.full(len(bases), np.nan)
    if rows.shape[0] > rows.shape[1]:
        gram = rows.T @ rows  # (D, D)
        column_energy = np.einsum("dk,dk->k", gram @ stacked, stacked)
    else:
        column_energy = np.sum(np.square(rows @ stacked), axis=0)  # (Σr,)
    owner = np.repeat(np.arange(len(bases)), widths)  # which reader each column belongs to
    captured = np.bincount(owner, weights=column_energy, minlength=len(bases))
    # The Gram form can round a zero energy to -1e-17; energies are nonnegative by definition.
    return np.maximum(captured, 0.0) / total


def isotropic_expectation(U: np.ndarray, R: np.ndarray) -> float:
    """PK(U, R) / dim U: the leakage of a perturbation isotropic within U (METHODS §9.5).

    ``U`` (D, a) is the source write space, ``R`` (D, r) the reader's folded read space, both
    orthonormal. When dim U = dim R this equals ρ(U, R); NaN if dim U = 0.
    """
    if U.shape[1] == 0:
        return float("nan")
    return projection_kernel(U, R) / U.shape[1]
