"""Each head's weight maps of a wrapped ``transformers`` causal LM, read through its family
record (:mod:`headgeom.model.families`): the :class:`headgeom.model.heads.Heads` access of
:class:`headgeom.model.hf.HFCausalLM` (docs §9, §11.8).

* W_O^{l,h} (d_model, d_head): the columns h·d … (h+1)·d of the output projection (its input
  z is head-major in every family);
* W_Q^{l,h} (d_head, d_model): the rows of query head h in the q projection; W_K^{l,j}, W_V^{l,j}
  the rows of key/value head j (``read_maps``; ``heads.query_read_maps`` repeats them over
  the query heads of ``cfg.kv_groups[j]``). A fused projection is split by the family's
  ``qkv_layout`` ("blocks": [q | k | v]; "per_head": per head [q_h k_h v_h]); GPT-2's
  ``Conv1D`` stores (in, out), transposed here;
* the norm before the projections (``attn_norm``): its gain γ = ``norm_gain_offset`` + weight
  (Gemma's RMSNorm scales by 1 + w) and whether it centres (LayerNorm) or not (RMSNorm).

Rotary positions, and Qwen3's and Gemma 3's q/k norms, act on the projections' outputs, so
Im W_Xᵀ is what the key or query reads from the residual; the rotation only changes how the
read coordinates are compared, not which residual directions are read (docs §11.8).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from headgeom.model.families import FAMILIES, Family, UnsupportedFamilyError
from headgeom.model.heads import ReadNorm

_PART = {"Q": 0, "K": 1, "V": 2}


def config_leakage_refusal(model_config: Mapping) -> str | None:
    """:func:`leakage_refusal` of a wrapped model's config dict (its ``family``), for the
    workflow, which decides before any model is built."""
    return leakage_refusal(FAMILIES[model_config["family"]])


def leakage_refusal(family: Family) -> str | None:
    """Why leakage (docs §11.2) is not defined on a family's models, or None."""
    if family.writes_residual_directly:
        return None
    return (
        f"leakage needs a head's patch to add δ = W_O^h (z_ref − z) to the residual (docs "
        f"§11.2), but family {family.name!r} passes the attention output through "
        f"{family.attn_out!r} (a norm after the output projection) before adding it, so the "
        "residual change is not linear in z and checks C8/C9 do not hold; missing: a "
        "definition of the perturbation and its write space through that norm"
    )


def plain_attention(family: Family, hf_config: Mapping) -> bool:
    """Whether a head's attention is softmax(q·k/√d) of its hook_q/hook_k values: the family
    declares the config values under which it is (GPT-2), and the config has them; never
    where rotary positions or q/k norms act after the projections."""
    wanted = family.plain_attention
    return wanted is not None and all(hf_config.get(k) == v for k, v in wanted.items())


class HFHeads:
    """:class:`headgeom.model.heads.Heads` of an :class:`~headgeom.model.hf.HFCausalLM`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.family = model.family
        cfg = model.cfg
        self.n_layer, self.n_head, self.n_kv_head = cfg.n_layer, cfg.n_head, cfg.n_kv_head
        self.d_head, self.d_model = cfg.d_head, cfg.d_model
        self.kv_groups = cfg.kv_groups
        self.leakage_refusal = leakage_refusal(self.family)
        self.attention_from_sites = plain_attention(self.family, cfg.hf_config)
        self._module(0, self.family.attn_norm)  # a missing norm is refused now

    # ------------------------------------------------------------------ modules
    def _module(self, layer: int, path: str) -> nn.Module:
        full = f"{self.family.layers}.{layer}.{path}"
        try:
            return self.model.hf.get_submodule(full)
        except AttributeError:
            raise UnsupportedFamilyError(
                f"{type(self.model.hf).__name__}: family {self.family.name!r} declares module "
                f"{full!r}, which the model lacks"
            ) from None

    def _weight(self, module: nn.Module) -> torch.Tensor:
        """The (out, in) weight of a projection (GPT-2's Conv1D stores (in, out))."""
        return module.weight.T if self.family.conv1d else module.weight

    def _project(self, module: nn.Module, u: torch.Tensor) -> torch.Tensor:
        """The projection's forward on ``u`` without its hooks (the sites sit on its output),
        with the same kernel as the module: Linear's F.linear, Conv1D's addmm."""
        if self.family.conv1d:
            flat = torch.addmm(module.bias, u.reshape(-1, u.shape[-1]), module.weight)
            return flat.view(*u.shape[:-1], -1)
        return nn.functional.linear(u, module.weight, module.bias)

    def _n(self, X: str) -> int:
        return self.n_head if X == "Q" else self.n_kv_head

    def _split(self, out: torch.Tensor, X: str) -> torch.Tensor:
        """The rows (…, n, d) of X in a fused projection's output (…, 3·n·d)."""
        n, d = self._n(X), self.d_head
        part = _PART[X]
        if self.family.qkv_layout == "blocks":
            return out[..., part * n * d : (part + 1) * n * d].unflatten(-1, (n, d))
        return out.unflatten(-1, (n, 3 * d))[..., part * d : (part + 1) * d]

    # ------------------------------------------------------------------ Heads
    def write_maps(self, layer: int) -> torch.Tensor:
        w = self._weight(self._module(layer, self.family.o_proj))  # (D, H·d)
        return w.reshape(w.shape[0], self.n_head, self.d_head).permute(1, 0, 2)

    def read_maps(self, layer: int, X: str) -> torch.Tensor:
        f = self.family
        if f.qkv is not None:
            w = self._weight(self._module(layer, f.qkv))  # (3·n·d, D)
            return self._split(w.T, X).permute(1, 2, 0)  # rows of X: (n, d, D)
        proj = {"Q": f.q_proj, "K": f.k_proj, "V": f.v_proj}[X]
        w = self._weight(self._module(layer, proj))  # (n·d, D)
        return w.reshape(self._n(X), self.d_head, w.shape[-1])

    def read_norm(self, layer: int) -> ReadNorm:
        norm = self._module(layer, self.family.attn_norm)
        weight = getattr(norm, "weight", None)  # None: a norm without a gain multiplies by 1
        gain = torch.ones(self.d_model) if weight is None else weight + self.family.norm_gain_offset
        return ReadNorm(gain, centered=self.family.norm_centered)

    def read(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q (…, H, d), k and v (…, H_kv, d): the projections of layer ``layer`` on the
        normed residual ``x``, the values its hook_q/k/v sites would see."""
        f = self.family
        u = self._module(layer, f.attn_norm)(x)
        if f.qkv is not None:
            out = self._project(self._module(layer, f.qkv), u)
            return tuple(self._split(out, X) for X in _PART)
        paths = (f.q_proj, f.k_proj, f.v_proj)
        return tuple(
            self._project(self._module(layer, p), u).unflatten(-1, (self._n(X), self.d_head))
            for p, X in zip(paths, _PART, strict=True)
        )
