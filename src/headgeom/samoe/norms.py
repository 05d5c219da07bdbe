"""A residual-stream norm read as an affine map once its statistic is frozen (SAMOE §15).

With σ fixed at its clean value, every norm the SA-MoE hosts use is affine in its input, so
it splits over the input's parts: φ(Σ_j v_j) = Σ_j φ(v_j) and norm(m) = φ(m) + β.

* ``nn.LayerNorm`` (the workspace GPT): φ(v) = γ ⊙ (v − mean v) / σ, σ = √(var m + ε), + β
* Llama's ``LlamaRMSNorm`` (SmolLM2): φ(v) = γ ⊙ v / σ, σ = √(mean m² + ε)
* Gemma 3's ``Gemma3RMSNorm``: as Llama's with the scale stored as γ − 1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FrozenNorm:
    gamma: torch.Tensor  # (d,)
    beta: torch.Tensor | None  # (d,) or None (RMS norms have no offset)
    eps: float
    centred: bool  # LayerNorm subtracts the mean; RMS norms do not

    @classmethod
    def of(cls, module: nn.Module, dtype: torch.dtype = torch.float32) -> FrozenNorm:
        """The frozen view of ``module``; a norm of any other kind is refused by name."""
        weight = module.weight.detach().to(dtype)
        if isinstance(module, nn.LayerNorm):
            bias = None if module.bias is None else module.bias.detach().to(dtype)
            return cls(weight, bias, float(module.eps), centred=True)
        kind = type(module).__name__
        if kind == "LlamaRMSNorm":
            return cls(weight, None, float(module.variance_epsilon), centred=False)
        if kind == "Gemma3RMSNorm":
            return cls(1.0 + weight, None, float(module.eps), centred=False)
        raise ValueError(f"no frozen-statistic view of the norm {kind!r}; known: LayerNorm, "
                         "LlamaRMSNorm, Gemma3RMSNorm")  # fmt: skip

    def sigma(self, m: torch.Tensor) -> torch.Tensor:
        """The statistic at the clean input m (d,)."""
        if self.centred:
            return torch.sqrt(m.var(unbiased=False) + self.eps)
        return torch.sqrt(m.pow(2).mean() + self.eps)

    def phi(self, v: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The linear part at frozen σ, of v (..., d)."""
        if self.centred:
            return self.gamma * (v - v.mean(-1, keepdim=True)) / sigma
        return self.gamma * v / sigma

    def offset(self) -> torch.Tensor:
        """β, or zeros."""
        return self.beta if self.beta is not None else torch.zeros_like(self.gamma)

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        """The norm itself on one vector v (d,), its own statistic: φ(v) at σ(v), + β."""
        return self.phi(v, self.sigma(v)) + self.offset()
