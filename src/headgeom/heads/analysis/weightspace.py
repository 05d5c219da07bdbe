"""Weight-space geometry of a model's heads (docs §9.1, §9.3–9.4, §14.1, §14.3).

Everything here is a function of the matrices the forward pass uses, read through the
registry's heads access (``headgeom.model.heads``: our geometries' ``writer.write_maps()`` and
``reader.read_maps(X)``, a transformers model's projections through its family record), so it
covers every (reader, writer) pair and architecture without knowing its name:

* write space      U^{l,h}     = Im W_O^{l,h}                     (D, r) orthonormal basis
* read space       R_{X,0}^{l,h} = Im (W_X^{l,h})ᵀ, X ∈ {Q, K, V}   (normalisation not folded in;
  K, V of grouped-query attention: the maps of the key/value head query head h reads)

Bases come from a rank-revealing SVD (singular values above 1e-6·σ_max, docs §9.1) in
float64. On top of them:

* :func:`write_write_pk`  PK(U^{l,h}, U^{l',k}) for l < l' (Figure 1; PK is symmetric);
* :func:`write_read_pk`   PK(U^{l,h}, R_{X,0}^{l',h'}) for l' > l, with ρ = PK / min(dim);
* :func:`proposition1`    check C14 where every layer's writes decompose R^D orthogonally;
* :func:`self_alignment`  own-best test and ρ_self of V read spaces (§14.1);
* :func:`scaled_idempotence` P(T_h) of T_h = O_h V_hᵀ (§14.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headgeom.model import registry
from headgeom.model.geometries import READ_TYPES
from headgeom.model.heads import query_read_maps
from headgeom.subspace import RANK_RTOL, orthonormal_basis

#: [CHOICE] Own-best needs the own PK to beat every other by more than this (PK units): a
#: designed tie (e.g. all-rotated, where every same-layer PK is d²/D) is not decided by
#: rounding noise. Learned gaps are many orders of magnitude larger.
OWN_BEST_TIE_TOLERANCE = 1e-9

#: docs §18 C14 tolerance; also the tolerance of Σ_h P_U = I when detecting that
#: Proposition 1 applies.
PROP1_TOLERANCE = 1e-8

PK_COLUMNS = [
    "source_layer",
    "source_head",
    "target_layer",
    "target_head",
    "read_type",
    "pk",
    "rho",
    "source_dim",
    "target_dim",
    "same_index",
]


@dataclass(frozen=True)
class HeadMaps:
    """The weight-space maps of every head, float64.

    ``write``: (layer, head, d_model, d_head) W_O^{l,h} as the forward pass applies it (for
    frozen writes this includes the gain g). ``read[X]``: (layer, head, d_head, d_model)
    W_X^{l,h} for X ∈ {Q, K, V}.
    """

    write: np.ndarray
    read: dict[str, np.ndarray]

    @property
    def n_layer(self) -> int:
        return self.write.shape[0]

    @property
    def n_head(self) -> int:
        return self.write.shape[1]

    @property
    def d_model(self) -> int:
        return self.write.shape[2]


@dataclass(frozen=True)
class HeadSpaces:
    """Orthonormal bases, ``write[l][h]`` = U^{l,h} and ``read[X][l][h]`` = R_{X,0}^{l,h},
    each (d_model, rank)."""

    write: list[list[np.ndarray]]
    read: dict[str, list[list[np.ndarray]]]
    d_model: int

    @property
    def n_layer(self) -> int:
        return len(self.write)

    @property
    def n_head(self) -> int:
        return len(self.write[0])


def _numpy64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float64).numpy()


def head_maps(model: torch.nn.Module) -> HeadMaps:
    """W_O and W_{Q,K,V} of every (query) head, from the registry's heads access."""
    heads = registry.heads_of(model)
    write, read = [], {X: [] for X in READ_TYPES}
    with torch.no_grad():
        for layer in range(heads.n_layer):
            write.append(_numpy64(heads.write_maps(layer)))  # (H, D, d)
            for X in READ_TYPES:
                read[X].append(_numpy64(query_read_maps(heads, layer, X)))  # (H, d, D)
    return HeadMaps(np.stack(write), {X: np.stack(v) for X, v in read.items()})


def head_spaces(maps: HeadMaps, rtol: float = RANK_RTOL) -> HeadSpaces:
    """Write spaces Im W_O and weight-space read spaces Im W_Xᵀ (docs §9.1)."""
    write = [[orthonormal_basis(W, rtol) for W in layer] for layer in maps.write]
    read = {
        X: [[orthonormal_basis(W.T, rtol) for W in layer] for layer in stack]
        for X, stack in maps.read.items()
    }
    return HeadSpaces(write, read, maps.d_model)


# --------------------------------------------------------------------------- PK
def pk_matrix(first: Sequence[np.ndarray], second: Sequence[np.ndarray]) -> np.ndarray:
    """PK(first[i], second[j]) for all i, j, shape (len(first), len(second)).

    Bases are orthonormal (D, r_i); ranks may differ and may be 0 (PK 0). One product of
    the concatenated bases gives every block of UᵀV; the squares are then summed block by
    block along both axes.
    """
    if not first or not second:
        return np.zeros((len(first), len(second)))
    a = np.concatenate(first, axis=1)
    b = np.concatenate(second, axis=1)
    squares = np.square(a.T @ b)  # (Σr_i, Σr_j)
    rows = _sum_blocks(squares, [basis.shape[1] for basis in first], axis=0)
    return _sum_blocks(rows, [basis.shape[1] for basis in second], axis=1)


def _sum_blocks(matrix: np.ndarray, widths: Sequence[int], axis: int) -> np.ndarray:
    """Sum consecutive blocks of ``widths`` entries along ``axis``; an empty block sums to 0."""
    widths = np.asarray(widths, dtype=np.int64)
    shape = list(matrix.shape)
    shape[axis] = len(widths)
    n = matrix.shape[axis]
    if n == 0:
        return np.zeros(shape)
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]])
    # reduceat returns the single entry at `start` for an empty block: zero those after
    summed = np.add.reduceat(matrix, np.minimum(starts, n - 1), axis=axis)
    index = [slice(None)] * matrix.ndim
    index[axis] = widths == 0
    summed[tuple(index)] = 0.0
    return summed


def _rho(pk: np.ndarray, dim_a: np.ndarray, dim_b: np.ndarray) -> np.ndarray:
    m = np.minimum(dim_a, dim_b).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m > 0, pk / np.where(m > 0, m, 1.0), np.nan)


def _pairs_frame(
    pk: np.ndarray,
    source: Sequence[tuple[int, int, int]],
    target: Sequence[tuple[int, int, int]],
    read_type: str | None,
) -> pd.DataFrame:
    """Tidy rows for a (source × target) PK block; ``source``/``target`` are (layer, head, dim)."""
    s = np.asarray(source, dtype=np.int64).reshape(-1, 3)
    t = np.asarray(target, dtype=np.int64).reshape(-1, 3)
    si, ti = np.meshgrid(np.arange(len(s)), np.arange(len(t)), indexing="ij")
    si, ti = si.ravel(), ti.ravel()
    values = pk.ravel()
    return pd.DataFrame(
        {
            "source_layer": s[si, 0],
            "source_head": s[si, 1],
            "target_layer": t[ti, 0],
            "target_head": t[ti, 1],
            "read_type": read_type,
            "pk": values,
            "rho": _rho(values, s[si, 2], t[ti, 2]),
            "source_dim": s[si, 2],
            "target_dim": t[ti, 2],
            "same_index": s[si, 1] == t[ti, 1],
        },
        columns=PK_COLUMNS,
    )


def _labels(bases: list[list[np.ndarray]], layers: range) -> list[tuple[int, int, int]]:
    return [(i, h, bases[i][h].shape[1]) for i in layers for h in range(len(bases[i]))]


def _flat(bases: list[list[np.ndarray]], layers: range) -> list[np.ndarray]:
    return [bases[i][h] for i in layers for h in range(len(bases[i]))]


def _concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: [] for c in PK_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def write_write_pk(spaces: HeadSpaces) -> pd.DataFrame:
    """PK(U^{l,h}, U^{l',k}) for every pair of heads in different layers, once per pair
    (source layer l < target layer l'; PK is symmetric). ``read_type`` is null."""
    frames = []
    for layer in range(spaces.n_layer - 1):
        here, later = range(layer, layer + 1), range(layer + 1, spaces.n_layer)
        pk = pk_matrix(_flat(spaces.write, here), _flat(spaces.write, later))
        frames.append(
            _pairs_frame(pk, _labels(spaces.write, here), _labels(spaces.write, later), None)
        )
    return _concat_frames(frames)


def write_read_pk(spaces: HeadSpaces) -> pd.DataFrame:
    """PK(U^{l,h}, R_{X,0}^{l',h'}) for every source head, every reader head in a strictly
    later layer l' > l and X ∈ {Q, K, V}; ρ = PK / min(dim U, dim R) (docs §9.3)."""
    frames = []
    for layer in range(spaces.n_layer - 1):
        here, later = range(layer, layer + 1), range(layer + 1, spaces.n_layer)
        writes = _flat(spaces.write, here)
        for X in READ_TYPES:
            pk = pk_matrix(writes, _flat(spaces.read[X], later))
            source, target = _labels(spaces.write, here), _labels(spaces.read[X], later)
            frames.append(_pairs_frame(pk, source, target, X))
    return _concat_frames(frames)


def index_stats(pairs: pd.DataFrame) -> dict[str, float]:
    """Mean/min/max PK over same-index and other-index pairs (the §9.4 designed-geometry
    table); NaN where there are no such pairs."""
    out = {}
    for name, mask in (("same_index", pairs["same_index"]), ("other_index", ~pairs["same_index"])):
        values = pairs.loc[mask.astype(bool), "pk"].to_numpy(dtype=np.float64)
        for stat, fn in (("mean", np.mean), ("min", np.min), ("max", np.max)):
            out[f"{name}_{stat}"] = float(fn(values)) if values.size else float("nan")
    return out


# --------------------------------------------------------------------------- Proposition 1
@dataclass(frozen=True)
class Proposition1:
    """Check C14 (docs §9.4, §18).

    ``applies``: every layer has H·d == D and Σ_h P_{U^{l,h}} = I within 1e-8.
    ``decomposition_residual``: max over layers of max|Σ_h P_{U^{l,h}} − I|.
    ``max_residual``: max over layers l and every read space R (all heads, all layers,
    X ∈ {Q, K, V}) of |Σ_h PK(U^{l,h}, R) − dim R|; NaN when the proposition does not apply.
    """

    applies: bool
    decomposition_residual: float
    max_residual: float


def decomposition_residual(layer_writes: Sequence[np.ndarray], d_model: int) -> float:
    """max|Σ_h P_{U_h} − I_D| for one layer's write bases."""
    stacked = np.concatenate(layer_writes, axis=1)  # (D, Σr)
    return float(np.max(np.abs(stacked @ stacked.T - np.eye(d_model))))


def proposition1(spaces: HeadSpaces, d_head: int, tol: float = PROP1_TOLERANCE) -> Proposition1:
    """Detect an orthogonal decomposition of R^D by every layer's writes and, where there is
    one, measure Σ_h PK(U^{l,h}, R) − dim R for every layer and every read space R."""
    residuals = [decomposition_residual(layer, spaces.d_model) for layer in spaces.write]
    worst = max(residuals)
    applies = spaces.n_head * d_head == spaces.d_model and worst <= tol
    if not applies:
        return Proposition1(False, worst, float("nan"))
    readers = [R for X in READ_TYPES for R in _flat(spaces.read[X], range(spaces.n_layer))]
    dims = np.array([R.shape[1] for R in readers], dtype=np.float64)
    max_residual = 0.0
    for layer_writes in spaces.write:
        totals = pk_matrix(layer_writes, readers).sum(axis=0)  # Σ_h PK(U^{l,h}, R)
        max_residual = max(max_residual, float(np.max(np.abs(totals - dims))))
    return Proposition1(True, worst, max_residual)


# --------------------------------------------------------------------------- self-alignment
def self_alignment(spaces: HeadSpaces) -> pd.DataFrame:
    """Own-best test of V read spaces (docs §14.1), one row per head (every layer).

    For head (l, h): PK(R_{V,0}^{l,h}, U^{l,h'}) over the heads h' of the same layer.
    ``own_best`` is True when the own write space's PK exceeds every other head's by more
    than ``OWN_BEST_TIE_TOLERANCE`` (= argmax_{h'} is h; a tie within rounding is not
    own-best). ``rho_self`` =
    PK(R_V, U^{l,h}) / min(dim). Callers take layers ≥ 1 as the reader set and report
    layer 0 separately.
    """
    rows = []
    for layer in range(spaces.n_layer):
        pk = pk_matrix(spaces.read["V"][layer], spaces.write[layer])  # (reader h, writer h')
        for head in range(spaces.n_head):
            own = pk[head, head]
            others = np.delete(pk[head], head)
            dim_r = spaces.read["V"][layer][head].shape[1]
            dim_u = spaces.write[layer][head].shape[1]
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "pk_self": own,
                    "pk_best_other": float(others.max()) if others.size else float("nan"),
                    "own_best": bool(
                        others.size == 0 or own > others.max() + OWN_BEST_TIE_TOLERANCE
                    ),
                    "rho_self": float(_rho(np.array(own), np.array(dim_r), np.array(dim_u))),
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- idempotence
def scaled_idempotence(W_O: np.ndarray, W_V: np.ndarray) -> float:
    """P(T) = ⟨T², T⟩_F² / (‖T²‖_F² ‖T‖_F²) for T = W_O W_V (docs §14.3).

    ``W_O`` is the head's (D, d) write block O_h, ``W_V`` its (d, D) value block (so
    V_h = W_Vᵀ and T = O_h V_hᵀ). Computed from d×d matrices only: with K = W_V W_O,
    G_O = W_Oᵀ W_O and G_V = W_V W_Vᵀ, ⟨T², T⟩ = tr(Kᵀ G_O G_V), ‖T‖² = tr(G_O G_V) and
    ‖T²‖² = tr(Kᵀ G_O K G_V).
    P is scale-invariant, so the write gain g of frozen writes does not change it
    (METHODS defines O_h without g). NaN when T² = 0 (P is undefined).
    """
    W_O = np.asarray(W_O, dtype=np.float64)
    W_V = np.asarray(W_V, dtype=np.float64)
    K = W_V @ W_O  # (d, d) core: T² = W_O K W_V
    G_O, G_V = W_O.T @ W_O, W_V @ W_V.T
    inner = float(np.trace(K.T @ G_O @ G_V))
    norm_t = float(np.trace(G_O @ G_V))
    norm_t2 = float(np.trace(K.T @ G_O @ K @ G_V))
    if norm_t2 <= 0.0 or norm_t <= 0.0:
        return float("nan")
    return inner**2 / (norm_t2 * norm_t)


def idempotence(maps: HeadMaps) -> pd.DataFrame:
    """P(T_h) for every head, one row per (layer, head)."""
    rows = [
        {
            "layer": layer,
            "head": head,
            "idempotence": scaled_idempotence(maps.write[layer, head], maps.read["V"][layer, head]),
        }
        for layer in range(maps.n_layer)
        for head in range(maps.n_head)
    ]
    return pd.DataFrame(rows)
