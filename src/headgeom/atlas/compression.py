"""Compression of a model's tensor groups as simulated weights, each with its size in bytes.

* **Round to nearest** with per-group scales (:func:`quantize`): each row of a matrix (its last
  axis: a table's row, a linear layer's input axis) is cut into groups of :data:`GROUP` = 64
  values, the last one ragged when 64 does not divide the row. Scheme ``minmax`` (the
  default): a group's codes are 0 … 2^b − 1 on [min, max], stored with a float16 scale and a
  float16 minimum (4 bytes a group, as GGUF's Q4_1); ``absmax``: symmetric codes
  −(2^(b−1) − 1) … 2^(b−1) − 1 with one float16 scale (absmax / (2^(b−1) − 1), 2 bytes a
  group). The article says "round-to-nearest, per-group scales" and "packed uint8 group-64
  … fp16 scales" without the code range; its sizes fix the bytes per group: E2B's PLE table,
  262,144 × 35 · 256 values, 4.70 GB in bf16, is 1.32 GB at int4 — 4 bits a value plus 4
  bytes a group (2 bytes would give 1.25 GB) — and E4B's 5.64 GB is 1.59 GB at int4 and
  0.88 GB at int2, so ``minmax`` matches the article's bytes (``absmax`` is offered beside).
  The values are quantised in float32 with the float16 scale and minimum, rounded half to
  even (``torch.round``), and returned in the tensor's dtype. A group of equal values (all
  zeros) has scale 0: every code 0, every value the minimum (0 for ``absmax``).
* **Low rank** (:func:`low_rank`): a matrix's best rank-k approximation (truncated SVD;
  Eckart–Young: the Frobenius error is the root of the tail singular values' squares), stored
  as k · (rows + columns) values.
* **Vocabulary pruning** (:func:`prune_vocabulary`): keep the rows of the N most frequent
  tokens of a counting corpus; every other token looks up one fallback row. The article does
  not say what a pruned token reads; we take its rows→mean edit's row, the table's mean row
  over the whole vocabulary (so a pruned token keeps the branch and loses its identity),
  stored as one extra row; ``zero`` is offered beside. The size counts N + 1 rows (the
  article's 128k-token table is half its int4 size: the token → row map is not counted).
* **Mixed precision** (:func:`mixed_precision`): the layers with the largest sensitivity
  scores keep more bits. The scores come from elsewhere (the edit measures) and must have been
  measured on a corpus other than the scored one — the article's caveat, refused here.

Sizes of untouched dense tensors count at :data:`DENSE_BITS` = 16 (the article's bf16).
The PLE table is quantised layer slice by layer slice (its columns are layer-major: layer l
reads columns l·d … (l + 1)·d − 1), so a group never straddles two layers and a layer's slice
can keep its own precision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from headgeom.atlas.tensor_groups import VOCABULARY_GROUPS, Weights

GROUP = 64
DENSE_BITS = 16
SCHEMES = ("minmax", "absmax")
SCALE_BYTES = 2  # float16
#: Kinds a group's compression changes; biases, norms and scales stay dense.
MATRIX_KINDS = ("table", "linear")


def _check(bits: int, group: int, scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if not 2 <= int(bits) <= 8:
        raise ValueError(f"bits must be 2 … 8, got {bits!r}")
    if int(group) < 1:
        raise ValueError(f"group size must be positive, got {group!r}")


def _rows(shape: Sequence[int]) -> tuple[int, int]:
    """(rows, row length) of a tensor grouped along its last axis (a scalar is one value)."""
    n = int(shape[-1]) if len(shape) else 1
    return math.prod(shape) // max(n, 1), n


def quantized_bytes(
    shape: Sequence[int], bits: int, group: int = GROUP, scheme: str = "minmax"
) -> int:
    """Bytes of a tensor of ``shape`` quantised to ``bits``: the codes packed (bits · values,
    rounded up to whole bytes) and per group a float16 scale (and minimum, ``minmax``)."""
    _check(bits, group, scheme)
    rows, n = _rows(shape)
    groups = rows * math.ceil(n / group)
    per_group = SCALE_BYTES * (2 if scheme == "minmax" else 1)
    return math.ceil(rows * n * bits / 8) + groups * per_group


def dense_bytes(shape: Sequence[int], bits: int = DENSE_BITS) -> int:
    return math.ceil(math.prod(shape) * bits / 8)


@dataclass(frozen=True)
class Quantized:
    """A tensor quantised to ``bits``: its simulated values (the tensor's shape and dtype),
    integer codes (same shape), float16 ``scales`` and ``minima`` (``minmax``; None for
    ``absmax``) of shape (rows, groups), and its size in bytes."""

    values: torch.Tensor
    codes: torch.Tensor
    scales: torch.Tensor
    minima: torch.Tensor | None
    nbytes: int


def quantize(w: torch.Tensor, bits: int, group: int = GROUP, scheme: str = "minmax") -> Quantized:
    """Round-to-nearest ``bits``-bit quantisation of ``w`` with per-group scales (module
    docstring): groups of ``group`` values along the last axis, the last one ragged."""
    _check(bits, group, scheme)
    shape = tuple(w.shape)
    rows, n = _rows(shape)
    x = w.detach().to(torch.float32).reshape(rows, n)
    G = math.ceil(n / group)
    xp = F.pad(x, (0, G * group - n)).reshape(rows, G, group)
    inside = (torch.arange(G * group) < n).reshape(G, group)  # the ragged group's real values
    if scheme == "absmax":
        qmax = 2 ** (bits - 1) - 1
        amax = torch.where(inside, xp.abs(), 0.0).amax(-1)
        scale = (amax / qmax).to(torch.float16)
        lo, code_min, code_max = torch.zeros_like(amax), -qmax, qmax
    else:
        lo32 = torch.where(inside, xp, math.inf).amin(-1)
        hi32 = torch.where(inside, xp, -math.inf).amax(-1)
        scale = ((hi32 - lo32) / (2**bits - 1)).to(torch.float16)
        lo, code_min, code_max = lo32.to(torch.float16).float(), 0, 2**bits - 1
    if not torch.isfinite(scale).all() or not torch.isfinite(lo).all():
        raise ValueError(f"{shape} tensor: a group's scale or minimum exceeds float16's range")
    s = scale.float()[..., None]
    ratio = torch.where(s > 0, (xp - lo[..., None]) / torch.where(s > 0, s, 1.0), 0.0)
    codes = torch.round(ratio).clamp(code_min, code_max)
    values = (lo[..., None] + codes * s).reshape(rows, G * group)[:, :n]
    return Quantized(
        values=values.reshape(shape).to(w.dtype),
        codes=codes.reshape(rows, G * group)[:, :n].reshape(shape).to(torch.int16),
        scales=scale,
        minima=lo.to(torch.float16) if scheme == "minmax" else None,
        nbytes=quantized_bytes(shape, bits, group, scheme),
    )


@dataclass(frozen=True)
class Compression:
    """Compressed weights: ``weights`` with the tensors ``names`` changed, their size in
    bytes after (``nbytes``) and dense at :data:`DENSE_BITS` (``dense_nbytes``)."""

    weights: Weights
    names: tuple[str, ...]
    nbytes: int
    dense_nbytes: int


def _matrices(weights: Weights, group: str) -> list[str]:
    names = [n for n in weights.group(group) if weights.roles[n].kind in MATRIX_KINDS]
    if not names:
        raise ValueError(f"the {weights.family} model has no tables or matrices in {group!r}")
    return names


def ple_slices(weights: Weights, name: str) -> list[slice]:
    """Column slices of the PLE table ``name`` per layer (layer-major: layer l reads columns
    l·d … (l + 1)·d − 1, as ``transformers`` reshapes the looked-up row to (layers, d))."""
    n_layers, width = len(weights.layers()), int(weights.tensors[name].shape[-1])
    if n_layers == 0 or width % n_layers:
        raise ValueError(f"{name}: {width} columns do not split into {n_layers} layer slices")
    d = width // n_layers
    return [slice(layer * d, (layer + 1) * d) for layer in range(n_layers)]


def _quantized(
    weights: Weights,
    name: str,
    w: torch.Tensor,
    bits_of: Mapping[int | None, int],
    group_size: int,
    scheme: str,
    stored_rows: int | None = None,
) -> tuple[torch.Tensor, int]:
    """(values, bytes) of ``w``, the tensor ``name`` or its edit, quantised at
    ``bits_of[layer]`` bits (a PLE table slice by slice, at each slice's layer); the bytes
    count ``stored_rows`` rows (pruning stores fewer than it looks up)."""
    role = weights.roles[name]
    rows = int(w.shape[0]) if stored_rows is None else stored_rows
    if role.group != "ple_table":
        q = quantize(w, bits_of[role.layer], group_size, scheme)
        return q.values, quantized_bytes((rows, *w.shape[1:]), bits_of[role.layer], group_size,
                                         scheme)  # fmt: skip
    values, nbytes = w.clone(), 0
    for layer, cols in enumerate(ple_slices(weights, name)):
        values[:, cols] = quantize(w[:, cols], bits_of[layer], group_size, scheme).values
        nbytes += quantized_bytes((rows, cols.stop - cols.start), bits_of[layer], group_size,
                                  scheme)  # fmt: skip
    return values, nbytes


def quantize_group(
    weights: Weights,
    group: str,
    bits: int,
    *,
    layer_bits: Mapping[int, int] | None = None,
    group_size: int = GROUP,
    scheme: str = "minmax",
) -> Compression:
    """The tables and matrices of the tensor ``group`` quantised to ``bits``, except the
    layers of ``layer_bits`` (layer → bits: mixed precision), a PLE table slice by slice."""
    layer_bits = dict(layer_bits or {})
    unknown = set(layer_bits) - set(weights.layers())
    if unknown:
        raise ValueError(f"layer_bits names layers {sorted(unknown)} the model lacks")
    bits_of = {None: bits, **{layer: layer_bits.get(layer, bits) for layer in weights.layers()}}
    changed, nbytes, dense = {}, 0, 0
    for name in _matrices(weights, group):
        w = weights.tensors[name]
        changed[name], n = _quantized(weights, name, w, bits_of, group_size, scheme)
        nbytes, dense = nbytes + n, dense + dense_bytes(w.shape)
    return Compression(weights.replace(changed), tuple(changed), nbytes, dense)


def mixed_precision(
    scores: Mapping[int, float],
    n_sensitive: int,
    high_bits: int,
    *,
    chosen_on: str,
    scored_on: str,
) -> dict[int, int]:
    """Layer → bits for the ``n_sensitive`` layers of largest sensitivity ``scores`` (ties:
    the lower layer), the ``layer_bits`` of :func:`quantize_group`. ``chosen_on`` names the
    corpus the scores were measured on, ``scored_on`` the one the result will be scored on:
    the same corpus is refused (the layers would be picked on the test text)."""
    if chosen_on == scored_on:
        raise ValueError(
            f"the sensitive layers are chosen on corpus {chosen_on!r}, the one scored: "
            "choose them on another corpus"
        )
    if not 0 <= n_sensitive <= len(scores):
        raise ValueError(f"n_sensitive {n_sensitive} is not in 0 … {len(scores)} layers")
    bad = [layer for layer, s in scores.items() if not math.isfinite(s)]
    if bad:
        raise ValueError(f"sensitivity scores of layers {bad} are not finite")
    order = sorted(scores, key=lambda layer: (-scores[layer], layer))
    return {int(layer): int(high_bits) for layer in sorted(order[:n_sensitive])}


# ------------------------------------------------------------------ low rank
def low_rank(w: torch.Tensor, ks: Iterable[int]) -> dict[int, torch.Tensor]:
    """Best rank-k approximations (Frobenius and spectral norm) of the matrices ``w``
    (the last two axes; leading axes are a batch), one SVD for every k, in float64."""
    U, S, Vh = torch.linalg.svd(w.detach().to(torch.float64), full_matrices=False)
    out = {}
    for k in ks:
        if not 0 <= k <= S.shape[-1]:
            raise ValueError(f"rank {k} is not in 0 … {S.shape[-1]} for a {tuple(w.shape)} tensor")
        out[int(k)] = ((U[..., :k] * S[..., None, :k]) @ Vh[..., :k, :]).to(w.dtype)
    return out


def low_rank_bytes(shape: Sequence[int], k: int, bits: int = DENSE_BITS) -> int:
    """Bytes of rank-k factors of matrices of ``shape`` (batch × (m, n)): k · (m + n) values
    per matrix."""
    *batch, m, n = shape
    return dense_bytes((math.prod(batch), k * (m + n)), bits)


def low_rank_group(weights: Weights, group: str, ks: Iterable[int]) -> dict[int, Compression]:
    """For each k, the tables and matrices of ``group`` replaced by their best rank-k
    approximations (one SVD per tensor for every k)."""
    ks = [int(k) for k in ks]
    names = _matrices(weights, group)
    per_name = {n: low_rank(weights.tensors[n], ks) for n in names}
    dense = sum(dense_bytes(weights.tensors[n].shape) for n in names)
    return {
        k: Compression(
            weights.replace({n: per_name[n][k] for n in names}),
            tuple(names),
            sum(low_rank_bytes(weights.tensors[n].shape, k) for n in names),
            dense,
        )
        for k in ks
    }


# ------------------------------------------------------------------ vocabulary pruning
def token_counts(sequences: Iterable[Sequence[int] | np.ndarray], n_vocab: int) -> np.ndarray:
    """How often each token id 0 … n_vocab − 1 occurs in the counting corpus ``sequences``."""
    counts = np.zeros(int(n_vocab), dtype=np.int64)
    for seq in sequences:
        ids = np.asarray(seq, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
            raise ValueError(f"token ids outside 0 … {n_vocab - 1} in the counting corpus")
        counts += np.bincount(ids, minlength=n_vocab)
    return counts


def most_frequent(counts: np.ndarray, n: int) -> np.ndarray:
    """The ids of the ``n`` most frequent tokens (ties: the lower id), ascending."""
    counts = np.asarray(counts)
    if not 0 < n <= counts.size:
        raise ValueError(f"cannot keep {n} of {counts.size} tokens")
    order = np.lexsort((np.arange(counts.size), -counts))  # by count descending, then id
    return np.sort(order[:n])


FALLBACKS = ("mean", "zero")


def prune_vocabulary(
    weights: Weights,
    name: str,
    keep: Sequence[int] | np.ndarray,
    *,
    fallback: str = "mean",
    bits: int = DENSE_BITS,
    group_size: int = GROUP,
    scheme: str = "minmax",
) -> Compression:
    """The vocabulary table ``name`` keeping the rows ``keep``; every other token reads the
    fallback row (``mean``: the whole table's mean row; ``zero``), as simulated weights of the
    full table. Sized as the kept rows plus the fallback row, at ``bits`` (16: dense; fewer:
    quantised as :func:`quantize_group`, a PLE table slice by slice)."""
    role = weights.roles.get(name)
    if role is None or role.group not in VOCABULARY_GROUPS or role.kind != "table":
        raise ValueError(f"{name!r} is not a vocabulary table ({', '.join(VOCABULARY_GROUPS)})")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    table = weights.tensors[name]
    keep = np.unique(np.asarray(keep, dtype=np.int64))
    if keep.size == 0 or keep[0] < 0 or keep[-1] >= table.shape[0]:
        raise ValueError(f"kept token ids must be in 0 … {table.shape[0] - 1}")
    if fallback == "mean":
        row = table.to(torch.float64).mean(0).to(table.dtype)
    else:
        row = torch.zeros_like(table[0])
    pruned = torch.ones(table.shape[0], dtype=torch.bool)
    pruned[torch.from_numpy(keep)] = False
    out = table.clone()
    out[pruned] = row
    if bits == DENSE_BITS:
        nbytes = dense_bytes((keep.size + 1, *table.shape[1:]))
    else:  # the kept rows and the fallback row, each row quantised on its own
        bits_of = {None: bits, **{layer: bits for layer in weights.layers()}}
        out, nbytes = _quantized(weights, name, out, bits_of, group_size, scheme, keep.size + 1)
    return Compression(weights.replace({name: out}), (name,), nbytes, dense_bytes(table.shape))
