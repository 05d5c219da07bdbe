"""Two checkpoints of one lineage (A: base or early, B: fine-tuned or late), viewed through
their weights (the article's instruction-strength dial, grafts, drift and partial changes).

* **Blend dial** (:func:`blend`): W = (1 − α)·A + α·B for every tensor, α over
  :data:`ALPHAS` (−0.25 … 1.5); exact at α = 0 and 1; a tensor equal in A and B (a frozen
  basis) is kept as it is.
* **Grafts** (:func:`graft`): B's tensors of a selection put into A (or A's into B);
  :func:`group_grafts` selects each tensor group, :func:`layer_grafts` one layer's norms or
  its linear weights at a time.
* **Drift** (:func:`drift`): ‖W_B − W_A‖ / ‖W_A‖ (Frobenius) per tensor, and of a group of
  tensors as a whole (:func:`group_drift`); it counts rescaling as change.
* **Is it a low-rank change** (:func:`partial_change`): per linear layer (kind ``linear``) A
  plus the top-k singular directions of ΔW = W_B − W_A (``top``), plus a random k-dimensional
  slice of ΔW (``random``: ΔW Q Qᵀ for Q a seeded Haar-random orthonormal basis of k
  directions of the layer's input space — the same rank as ``top``), plus a fraction f of ΔW
  (``fraction``), or B minus the top-k directions of ΔW (``minus_top``); every other tensor
  (norms, tables, biases, scales) is B's, as the article keeps "norms and tables IT".
* **Special-token rows** (:func:`with_rows`): the rows of named tokens in the vocabulary
  tables taken from another checkpoint (A's into B, B's into A, or either into a blend), and
  the **lead** (:func:`lead`): a token's logit minus the best other token's.

Every view refuses two checkpoints of different architectures (another family, or a tensor
missing or of another shape, named in the message).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from headgeom.atlas.tensor_groups import VOCABULARY_GROUPS, Weights, check_same_architecture

#: The article's dial: from −0.25 (past the base) to 1.5 (where its blend breaks).
ALPHAS = (-0.25, 0.0, 0.25, 0.4, 0.5, 0.75, 1.0, 1.25, 1.5)
PARTIAL_MODES = ("top", "random", "fraction", "minus_top")


def blend(a: Weights, b: Weights, alpha: float) -> Weights:
    """W = (1 − α)·A + α·B for every floating tensor (exactly A at α = 0 and B at α = 1);
    tensors equal in A and B, and non-floating ones (which must be equal), are A's."""
    check_same_architecture(a, b)
    out = {}
    for name, x in a.tensors.items():
        y = b.tensors[name]
        if torch.equal(x, y):
            out[name] = x
        elif not x.is_floating_point():
            raise ValueError(f"tensor {name!r}: non-floating {x.dtype} values differ in A and B")
        else:
            out[name] = (1.0 - alpha) * x + alpha * y
    return a.replace(out)


def graft(base: Weights, donor: Weights, names: Iterable[str]) -> Weights:
    """``base`` with the tensors ``names`` taken from ``donor`` (same architecture)."""
    check_same_architecture(base, donor, ("the base", "the donor"))
    names = list(names)
    missing = [n for n in names if n not in base.tensors]
    if missing:
        raise KeyError(f"graft of tensors the model lacks: {missing}")
    return base.replace({n: donor.tensors[n] for n in names})


def group_grafts(weights: Weights) -> dict[str, list[str]]:
    """Each tensor group present → its tensors (a graft of every group is the donor)."""
    return {g: weights.group(g) for g in weights.groups()}


def layer_grafts(weights: Weights) -> dict[tuple[int, str], list[str]]:
    """(layer, ``norms`` or ``linear``) → that layer's norm tensors or its linear weights
    (the article's Puzzle 6: one layer's norms or linear weights at a time)."""
    out = {}
    for layer in weights.layers():
        for part, kinds in (("norms", ("norm",)), ("linear", ("linear",))):
            names = weights.names(lambda r, lay=layer, k=kinds: r.layer == lay and r.kind in k)
            if names:
                out[layer, part] = names
    return out


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.to(torch.float64)))


def _ratio(change: float, base: float) -> float:
    """change / base, with 0/0 = 0 (nothing moved) and x/0 = inf (a zero tensor moved)."""
    if base == 0.0:
        return 0.0 if change == 0.0 else float("inf")
    return change / base


def drift(a: Weights, b: Weights) -> dict[str, float]:
    """‖W_B − W_A‖ / ‖W_A‖ (Frobenius, float64) of every tensor."""
    check_same_architecture(a, b)
    return {
        n: _ratio(_norm(b.tensors[n].double() - x.double()), _norm(x)) for n, x in a.tensors.items()
    }


def group_drift(a: Weights, b: Weights, names: Iterable[str]) -> float:
    """The drift of the tensors ``names`` taken together: √Σ‖ΔW‖² / √Σ‖W_A‖²."""
    check_same_architecture(a, b)
    names = list(names)
    change = sum(_norm(b.tensors[n].double() - a.tensors[n].double()) ** 2 for n in names)
    base = sum(_norm(a.tensors[n]) ** 2 for n in names)
    return _ratio(change**0.5, base**0.5)


def drift_by_group(a: Weights, b: Weights) -> dict[str, float]:
    """:func:`group_drift` of each tensor group present, in the order of ``GROUPS``."""
    return {g: group_drift(a, b, names) for g, names in group_grafts(a).items()}


def _top(delta: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k singular directions of ``delta`` (float64; batched over leading axes)."""
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    return (U[..., :k] * S[..., None, :k]) @ Vh[..., :k, :]


def _random_slice(delta: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """ΔW Q Qᵀ: ΔW on a Haar-random k-dimensional subspace of its input space (float64)."""
    n = delta.shape[-1]
    g = torch.randn((*delta.shape[:-2], n, k), generator=gen, dtype=torch.float64)
    Q, R = torch.linalg.qr(g)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]  # Haar, not QR's bias
    return delta @ Q @ Q.transpose(-1, -2)


def partial_change(
    a: Weights,
    b: Weights,
    mode: str,
    *,
    k: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
) -> Weights:
    """A partial step from A to B on the linear layers (module docstring: ``top``, ``random``
    and ``minus_top`` take rank ``k``, ``fraction`` takes f); every other tensor is B's.
    ``k`` above a layer's rank counts as its rank (full rank: ``top`` is B, ``minus_top`` A).
    The random slices are drawn in state-dict order from one generator seeded ``seed``."""
    check_same_architecture(a, b)
    if mode not in PARTIAL_MODES:
        raise ValueError(f"mode must be one of {PARTIAL_MODES}, got {mode!r}")
    if mode == "fraction" and fraction is None:
        raise ValueError("mode 'fraction' needs fraction=f")
    if mode != "fraction" and (k is None or k < 0):
        raise ValueError(f"mode {mode!r} needs a rank k ≥ 0, got {k!r}")
    gen = torch.Generator().manual_seed(int(seed))
    out = dict(b.tensors)
    for name in a.names(lambda role: role.kind == "linear"):
        x, y = a.tensors[name].double(), b.tensors[name].double()
        delta = y - x
        if mode == "fraction":
            w = x + float(fraction) * delta
        elif mode == "random":
            w = x + _random_slice(delta, min(k, delta.shape[-1]), gen)
        elif mode == "top":
            w = x + _top(delta, k)
        else:
            w = y - _top(delta, k)
        out[name] = w.to(a.tensors[name].dtype)
    return a.replace(out)


# ------------------------------------------------------------------ special-token rows
def vocabulary_tables(weights: Weights, groups: Sequence[str] = VOCABULARY_GROUPS) -> list[str]:
    """The tables indexed by token id among ``groups`` (token embedding, PLE table, an untied
    unembedding; a tied one is the embedding)."""
    bad = [g for g in groups if g not in VOCABULARY_GROUPS]
    if bad:
        raise ValueError(f"{bad} are not vocabulary groups ({', '.join(VOCABULARY_GROUPS)})")
    return weights.names(lambda r: r.group in groups and r.kind == "table")


def token_ids(vocab: Mapping[str, int], tokens: Iterable[str]) -> list[int]:
    """The ids of the named tokens in a tokenizer's vocabulary (token → id); refused when one
    is not a single token of it (a tokenizer would map it to its unknown token)."""
    tokens = list(tokens)
    missing = [t for t in tokens if t not in vocab]
    if missing:
        raise KeyError(f"tokens {missing} are not in the vocabulary")
    return [int(vocab[t]) for t in tokens]


def with_rows(
    weights: Weights,
    donor: Weights,
    ids: Sequence[int],
    groups: Sequence[str] = VOCABULARY_GROUPS,
) -> Weights:
    """``weights`` whose rows ``ids`` of every vocabulary table of ``groups`` are the
    ``donor``'s (same architecture): the article's turn-token swap, alone (``weights`` is A
    or B) or inside a blend. A tied unembedding follows its embedding."""
    check_same_architecture(weights, donor, ("the model", "the donor"))
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    out = {}
    for name in vocabulary_tables(weights, groups):
        table = weights.tensors[name]
        if ids_t.numel() and (ids_t.min() < 0 or ids_t.max() >= table.shape[0]):
            raise ValueError(f"{name}: token ids must be in 0 … {table.shape[0] - 1}")
        t = table.clone()
        t[ids_t] = donor.tensors[name][ids_t]
        out[name] = t
    return weights.replace(out)


def lead(logits: torch.Tensor, token: int) -> torch.Tensor:
    """The token's logit minus the best other token's (..., V) → (...): above 0, greedy
    decoding picks it (the article's Puzzle 7)."""
    others = logits.clone()
    others[..., token] = -torch.inf
    return logits[..., token] - others.amax(-1)
