"""How attention heads read and write: small strategy modules a block is given.

A geometry is a pair (reader, writer). Readers map the residual stream x (batch, position,
d_model) to per-head q, k, v (batch, position, head, d_head); writers map the head outputs
z (batch, position, head, d_head) back to the residual stream. Each also exposes its
weight-space maps so geometric analyses read the same matrices the forward pass uses:

* ``writer.write_maps()``        -> (head, d_model, d_head): W_O^{l,h} (METHODS §0, §9.1)
* ``reader.read_maps(X)``         -> (head, d_head, d_model): W_X^{l,h}
* ``reader.folded_read_maps(X)``  -> (head, d_head, d_model): W_X diag(γ) P_c (METHODS §9.2)

A configuration (``learned``, ``write-common-axis``, ...) is registered in ``GEOMETRIES``
as a factory ``(cfg, layer) -> (reader, writer)``; the block never branches on its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from headgeom.model import ModelConfig

READ_TYPES = ("Q", "K", "V")


def write_scale(cfg: ModelConfig) -> float:
    """g = 0.02·sqrt(D / 2L): the RMS gain of an initial learned W_O (METHODS §4.2, §5.6)."""
    return cfg.init_std * math.sqrt(cfg.d_model / (2 * cfg.n_layer))


def coordinate_blocks(cfg: ModelConfig) -> torch.Tensor:
    """[E_0 | E_1 | ... | E_{H-1}] as a float64 (d_model, head·d_head) matrix (METHODS §0)."""
    if cfg.n_head * cfg.d_head != cfg.d_model:
        raise ValueError(
            f"axis geometries need n_head·d_head == d_model, got {cfg.n_head}·{cfg.d_head} "
            f"!= {cfg.d_model}"
        )
    return torch.eye(cfg.d_model, dtype=torch.float64)


# --------------------------------------------------------------------------- writers
class LearnedWriter(nn.Module):
    """Attention output Σ_h W_O^h z^h + b_O with a trained W_O (GPT-2's ``c_proj``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.c_proj = nn.Linear(cfg.n_head * cfg.d_head, cfg.d_model)
        self.c_proj.residual_projection = True  # GPT-2 init: std 0.02/sqrt(2L)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.c_proj(z.flatten(-2))  # (B, T, H·d) -> (B, T, D)

    def write_maps(self) -> torch.Tensor:
        w = self.c_proj.weight  # (D, H·d)
        return w.reshape(w.shape[0], self.n_head, self.d_head).permute(1, 0, 2)


class FrozenWriter(nn.Module):
    """W_O^h = g·B·E_h frozen as a float64 buffer; the output bias b_O stays learned (§4.3).

    ``basis`` holds the columns [B E_0 | ... | B E_{H-1}] (d_model, head·d_head). It is a
    persistent buffer: saved in the checkpoint, never trained, never counted as a parameter.
    """

    def __init__(self, cfg: ModelConfig, basis: torch.Tensor, scale: float, bias: bool = True):
        super().__init__()
        if basis.shape != (cfg.d_model, cfg.n_head * cfg.d_head):
            raise ValueError(
                f"frozen basis has shape {tuple(basis.shape)}, expected "
                f"({cfg.d_model}, {cfg.n_head * cfg.d_head})"
            )
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.register_buffer("basis", basis.to(torch.float64).contiguous())
        self.scale = float(scale)
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model)) if bias else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        w = (self.scale * self.basis).to(z.dtype)  # cast at use (METHODS §5.4 step 8)
        return nn.functional.linear(z.flatten(-2), w, self.b_O)

    def write_maps(self) -> torch.Tensor:
        w = self.scale * self.basis
        return w.reshape(w.shape[0], self.n_head, self.d_head).permute(1, 0, 2)


# --------------------------------------------------------------------------- readers
class FreeReader(nn.Module):
    """Shared pre-attention LayerNorm LN_1 then learned W_{Q,K,V} (GPT-2's ``c_attn``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.n_head * cfg.d_head)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.c_attn(self.ln_1(x))  # (B, T, 3·H·d), GPT-2 order q | k | v
        q, k, v = qkv.split(self.n_head * self.d_head, dim=-1)
        shape = (*x.shape[:-1], self.n_head, self.d_head)
        return q.view(shape), k.view(shape), v.view(shape)

    def read_maps(self, X: str) -> torch.Tensor:
        i = READ_TYPES.index(X)
        hd = self.n_head * self.d_head
        w = self.c_attn.weight[i * hd : (i + 1) * hd]  # (H·d, D)
        return w.reshape(self.n_head, self.d_head, -1)

    def folded_read_maps(self, X: str) -> torch.Tensor:
        w = self.read_maps(X).double() * self.ln_1.weight.double()  # W_X diag(γ)
        return w - w.mean(dim=-1, keepdim=True)  # · P_c (centering acts on the D axis)


# --------------------------------------------------------------------------- registry
GeometryFactory = Callable[["ModelConfig", int], tuple[nn.Module, nn.Module]]


def _learned(cfg: ModelConfig, layer: int) -> tuple[nn.Module, nn.Module]:
    return FreeReader(cfg), LearnedWriter(cfg)


def _write_common_axis(cfg: ModelConfig, layer: int) -> tuple[nn.Module, nn.Module]:
    return FreeReader(cfg), FrozenWriter(cfg, coordinate_blocks(cfg), write_scale(cfg))


GEOMETRIES: dict[str, GeometryFactory] = {
    "learned": _learned,
    "write-common-axis": _write_common_axis,
}


def make_geometry(cfg: ModelConfig, layer: int) -> tuple[nn.Module, nn.Module]:
    try:
        factory = GEOMETRIES[cfg.geometry]
    except KeyError:
        raise ValueError(
            f"unknown geometry {cfg.geometry!r}; known: {sorted(GEOMETRIES)}"
        ) from None
    return factory(cfg, layer)
