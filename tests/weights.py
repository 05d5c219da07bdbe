"""Large random weights for tiny test models: every head, LayerNorm and embedding matters."""

from __future__ import annotations

import torch


@torch.no_grad()
def large_random_weights(model: torch.nn.Module) -> torch.nn.Module:
    """In place, from torch's global generator in parameter order: LayerNorm gains
    1 + 0.3·N(0, 1) (nontrivial γ), token and position embeddings N(0, 1), every other
    parameter N(0, 0.3²). Works for our GPT and for transformers' GPT2LMHeadModel."""
    for name, p in model.named_parameters():
        if "ln" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
        elif "wte" in name or "wpe" in name:
            p.normal_(0.0, 1.0)
        else:
            p.normal_(0.0, 0.3)
    return model
