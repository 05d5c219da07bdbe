"""What the leakage pass sums over batches (docs §11.2–11.6), shared by its two routes
(:func:`headgeom.heads.analysis.leakage._batch_pass` with the KV-prefix forward, and
:func:`headgeom.heads.analysis.leakage_hooked.hooked_pass` through the hook sites alone), and the
attention distribution and total variation the TV conditions of §11.6 compare."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.model.geometries import READ_TYPES

#: The four conditions of docs §11.6 (query only, keys only, both direct, the patched forward).
TV_CONDITIONS = ("query", "keys", "direct", "total")


def attention_final(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Attention distribution of the final query ``q`` (..., H, d) over keys ``k``
    (..., T, H, d): softmax_s(q·k_s/√d), shape (..., H, T). The final position sees every
    key (causal mask is a no-op there)."""
    scores = torch.einsum("...hd,...thd->...ht", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TV = ½ Σ_s |a_s − b_s| over the last axis."""
    return 0.5 * (a - b).abs().sum(dim=-1)


@dataclass
class Sums:
    """Sums over batches (float64): perturbation energy, captured energy per reader
    column, response inner products and TV sums, [source layer][...]."""

    n_layer: int
    n_head: int
    energy: np.ndarray  # (L, H) Σ‖δ‖²
    gram: list  # [l][h] (dim U, dim U) Σ cᵀc with c = U^{l,h}ᵀ δ (δ ∈ Im U exactly)
    dot: np.ndarray  # (L, H, L, 3, H): source (l, h), reader (l', X, h')
    direct_sq: np.ndarray
    total_sq: np.ndarray
    tv: np.ndarray  # (L, H, L, H, 4) Σ_examples TV

    @classmethod
    def empty(cls, n_layer: int, n_head: int, write_dims: list[list[int]]) -> Sums:
        shape = (n_layer, n_head, n_layer, len(READ_TYPES), n_head)
        return cls(
            n_layer,
            n_head,
            np.zeros((n_layer, n_head)),
            [[np.zeros((r, r)) for r in dims] for dims in write_dims],
            np.zeros(shape),
            np.zeros(shape),
            np.zeros(shape),
            np.zeros((n_layer, n_head, n_layer, n_head, len(TV_CONDITIONS))),
        )

    def add_energies(self, layer: int, delta: torch.Tensor, U: list[torch.Tensor]) -> None:
        """Σ‖δ‖² and the write-space Gram of every head of ``layer``, pooled over all
        positions: ``delta`` (B, T, H, D) float64, ``U`` the layer's write bases."""
        rows = delta.flatten(0, 1)  # (B·T, H, D)
        self.energy[layer] += torch.sum(torch.square(rows), dim=(0, 2)).cpu().numpy()
        for head in range(self.n_head):
            c = rows[:, head] @ U[head]  # (B·T, dim U)
            self.gram[layer][head] += (c.T @ c).cpu().numpy()

    def add_responses(
        self, layer: int, j: int, c: int, d_d: torch.Tensor, d_t: torch.Tensor
    ) -> None:
        """Σ⟨Δ_direct, Δ_total⟩, Σ‖Δ_direct‖², Σ‖Δ_total‖² of every source head of ``layer``
        at reader layer ``j``, X = READ_TYPES[c]: ``d_d``, ``d_t`` (H_source, B, S, H, d)
        float64 (per reader head, key/value heads already attributed to their query heads)."""
        self.dot[layer, :, j, c] += torch.einsum("gbshd,gbshd->gh", d_d, d_t).cpu().numpy()
        self.direct_sq[layer, :, j, c] += torch.einsum("gbshd->gh", d_d**2).cpu().numpy()
        self.total_sq[layer, :, j, c] += torch.einsum("gbshd->gh", d_t**2).cpu().numpy()
