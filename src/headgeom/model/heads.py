"""Every attention head's weight maps and reader, as the weight-space and leakage analyses
read them (docs §9, §11), one access object per architecture (the registry's
``Architecture.heads``, :func:`headgeom.model.registry.heads_of`):

* ``write_maps(l)``    -> (head, d_model, d_head): W_O^{l,h} as the forward applies it;
* ``read_maps(l, X)``  -> (n, d_head, d_model): W_X of the n heads that compute X: the query
  heads for Q; for K and V the key/value heads (n = n_kv_head, equal to n_head without
  grouped-query attention); :func:`query_read_maps` attributes them to the query heads that
  read them (``kv_groups``);
* ``read_norm(l)``     -> :class:`ReadNorm`: the gain γ and centring of the one norm all of
  layer l's projections read through, or None where the heads have no shared norm (block
  readers, multiscreen tiles);
* ``read(l, x)``       -> (q, k, v): layer l's projections re-run on a residual ``x``
  (..., d_model), the values of its ``attn.hook_q``/``hook_k``/``hook_v`` sites for that
  residual (the direct response of docs §11.5), without passing those sites' hooks (the
  leakage pass calls it from inside them);
* ``leakage_refusal``  -> why leakage (docs §11) is not defined on the model, or None;
* ``attention_from_sites`` -> whether a head's attention is softmax_s(q·k_s/√d) of its
  ``hook_q``/``hook_k`` values (so the attention total variation of docs §11.6 can be
  recomputed from them): true without rotary positions or norms after the projections.

:class:`BlockHeads` serves our GPT and multiscreen models (``blocks[l].attn.reader`` and
``.writer``, ``headgeom.model.geometries``); ``headgeom.model.hf_weights.HFHeads`` serves a
wrapped ``transformers`` causal LM through its family record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class ReadNorm:
    """The norm before a layer's projections, as its Jacobian's fixed part folds into a read
    space (docs §9.2): diag(γ) P_c with P_c = I − 11ᵀ/D when ``centered`` (LayerNorm), P_c = I
    otherwise (RMSNorm). ``gain`` (d_model,) is γ as the forward multiplies by it."""

    gain: torch.Tensor
    centered: bool


class Heads(Protocol):
    n_layer: int
    n_head: int
    n_kv_head: int
    kv_groups: tuple[tuple[int, ...], ...]
    leakage_refusal: str | None
    attention_from_sites: bool

    def write_maps(self, layer: int) -> torch.Tensor: ...

    def read_maps(self, layer: int, X: str) -> torch.Tensor: ...

    def read_norm(self, layer: int) -> ReadNorm | None: ...

    def read(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]: ...


def free_reader_refusal(geometry: str, reader_kind: str) -> str:
    """Why leakage is not defined on a geometry without a shared LN_1 (docs §11.1)."""
    return (
        f"leakage needs free readers (a shared LN_1 before learned W_Q/W_K/W_V, docs §11.1), "
        f"but geometry {geometry!r} has {reader_kind} readers without one"
    )


def kv_head_of(groups: Sequence[Sequence[int]]) -> list[int]:
    """The key/value head each query head reads, from ``kv_groups`` (query heads per kv head)."""
    owner = {h: j for j, heads in enumerate(groups) for h in heads}
    if sorted(owner) != list(range(len(owner))):
        raise ValueError(f"kv_groups {groups} do not cover the query heads 0..n−1 once each")
    return [owner[h] for h in range(len(owner))]


def query_read_maps(heads: Heads, layer: int, X: str) -> torch.Tensor:
    """W_X of every query head (n_head, d_head, d_model): for K and V the maps of the key/value
    head it reads, repeated over its group (docs §11.8: a shared key/value head's read space
    is attributed to every query head that reads it)."""
    maps = heads.read_maps(layer, X)
    if X == "Q" or heads.n_kv_head == heads.n_head:
        return maps
    return maps[kv_head_of(heads.kv_groups)]


class BlockHeads:
    """Our GPT and multiscreen models: each block's ``attn.reader`` and ``attn.writer``.

    ``shared_ln1``: the geometry's readers share an LN_1 before learned W_{Q,K,V} (the
    registry's geometry record), so a read space folds its gain and centring."""

    attention_from_sites = True  # softmax(q·k/√d) of the hook_q/hook_k values, no rotary

    def __init__(self, model: nn.Module, shared_ln1: bool, geometry: str, reader_kind: str):
        self.model = model
        cfg = model.cfg
        self.n_layer, self.n_head = cfg.n_layer, cfg.n_head
        self.n_kv_head = cfg.n_head
        self.kv_groups = tuple((h,) for h in range(cfg.n_head))
        self._shared_ln1 = shared_ln1
        self.leakage_refusal = None if shared_ln1 else free_reader_refusal(geometry, reader_kind)

    def _attn(self, layer: int) -> nn.Module:
        return self.model.blocks[layer].attn

    def write_maps(self, layer: int) -> torch.Tensor:
        return self._attn(layer).writer.write_maps()

    def read_maps(self, layer: int, X: str) -> torch.Tensor:
        return self._attn(layer).reader.read_maps(X)

    def read_norm(self, layer: int) -> ReadNorm | None:
        if not self._shared_ln1:
            return None
        return ReadNorm(self._attn(layer).reader.ln_1.weight, centered=True)

    def read(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._attn(layer).reader(x)[:3])  # multiscreen's gate g is not read here
