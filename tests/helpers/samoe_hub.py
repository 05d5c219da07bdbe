"""Tiny Hub models for the SA-MoE wrap's tests (random configs of the two paper families, no
download), random SA-MoE wraps with nonzero writes, and a reference forward that shares no
routing, state or hook code with ``headgeom.samoe.hub`` or ``headgeom.samoe.model``: a fresh
Hub model whose MLPs are replaced by a hand-written dense mixture."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

N_VOCAB = 53
N_LAYER = 4


def tiny_config(family: str):
    """A random-init-sized config of ``family`` ("llama": SmolLM2's; "gemma": Gemma 3's)."""
    from transformers import Gemma3TextConfig, LlamaConfig

    common = dict(vocab_size=N_VOCAB, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=N_LAYER, num_attention_heads=4, max_position_embeddings=64,
                  tie_word_embeddings=True)  # fmt: skip
    if family == "llama":
        return LlamaConfig(num_key_value_heads=2, **common)
    # sliding layers first, then one full layer, as Gemma 3's 5:1 pattern
    return Gemma3TextConfig(num_key_value_heads=1, head_dim=16, sliding_window=6,
                            layer_types=["sliding_attention"] * (N_LAYER - 1) + ["full_attention"],
                            **common)  # fmt: skip


def dense_lm(family: str, seed: int = 0):
    """The dense source: the Hub model's own random init, from a fixed seed, in eval mode."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.float32).eval()


def randomise_moe(model, seed: int, write_std: float = 0.8):
    """Nonzero routers and writes on an upcycled wrap: W^s ~ N(0, 1/r), write heads
    N(0, write_std²), W^x ~ N(0, 1/d) so routing is not degenerate."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".router." in name or ".write." in name:
                noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
                scale = write_std if ".write." in name else 1 / math.sqrt(p.shape[-1])
                p.copy_(noise * scale)
    return model


class _RefMoE(nn.Module):
    """SAMOE E1/E2 by hand for one layer: every expert on every token, masked by the Top-k
    of the softmax; the state in ``holder["s"]``, the logits appended to ``holder["z"]``."""

    def __init__(self, tensors: dict, prefix: str, n_experts: int, k: int, variant: str,
                 clamp: float, make_mlp, holder: dict):  # fmt: skip
        super().__init__()
        self.shared = make_mlp()
        self.shared.load_state_dict(_sub(tensors, prefix + "moe.shared."))
        self.experts = nn.ModuleList(make_mlp() for _ in range(n_experts))
        for e, expert in enumerate(self.experts):
            expert.load_state_dict(_sub(tensors, f"{prefix}moe.experts.{e}."))
        self.w_x = tensors[prefix + "moe.router.W_x"]
        self.w_s = tensors.get(prefix + "moe.router.W_s")
        self.a = tensors.get(prefix + "write.proj.weight")
        self.b = tensors.get(prefix + "write.proj.bias")
        self.k, self.variant, self.clamp, self.holder = k, variant, clamp, holder

    def forward(self, x):
        s = self.holder["s"]
        z = x @ self.w_x.T if self.w_s is None else x @ self.w_x.T + s @ self.w_s.T
        self.holder["z"].append(z)
        chosen = torch.topk(z, self.k, dim=-1).indices  # random logits: no ties
        probs = torch.softmax(z, dim=-1)
        y = self.shared(x)
        for e, expert in enumerate(self.experts):
            on = (chosen == e).any(-1, keepdim=True).to(x.dtype)
            y = y + on * probs[..., e : e + 1] * expert(x)
        if self.w_s is not None:
            u = torch.tanh(F.linear(y, self.a, self.b))
            self.holder["s"] = (s + u).clamp(-self.clamp, self.clamp) if (
                self.variant == "persistent") else u  # fmt: skip
            self.holder["states"].append(self.holder["s"])
        return y


def _sub(tensors: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


@torch.no_grad()
def reference_forward(model, family: str, ids: torch.Tensor) -> dict:
    """Router logits (N, B, T, E), states s_1..s_N (N, B, T, r) or None and output logits of
    the wrap ``model``, recomputed on a fresh Hub model of ``family`` loaded from the wrap's
    tensors by plain renaming."""
    from transformers import AutoModelForCausalLM

    tensors = model.state_dict()
    lm = AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.float32).eval()
    dense = {}
    for name, t in tensors.items():
        if name.startswith("lm."):
            dense[name[3:]] = t
        elif ".layer." in name:  # blocks.l.layer.X -> model.layers.l.X
            head, rest = name.split(".layer.", 1)
            dense[f"model.layers.{head.split('.')[1]}.{rest}"] = t
    holder = {"s": None, "z": [], "states": []}
    moe = model.moe_cfg
    for layer, block in enumerate(lm.model.layers):
        make = lambda mlp=block.mlp: type(mlp)(mlp.config)  # noqa: E731
        block.mlp = _RefMoE(tensors, f"blocks.{layer}.", moe.n_experts, moe.top_k,
                            model.variant, moe.clamp, make, holder)  # fmt: skip
    missing, unexpected = lm.load_state_dict(dense, strict=False)
    assert not unexpected and all(".mlp." in k or k == "lm_head.weight" for k in missing)
    # a tied head shares the embedding's Parameter, which load_state_dict copied into
    B, T = ids.shape
    if model.has_state:
        holder["s"] = torch.zeros(B, T, moe.state_dim)
    logits = lm(input_ids=ids, use_cache=False).logits
    states = torch.stack(holder["states"]) if holder["states"] else None
    return {"z": torch.stack(holder["z"]), "state": states, "logits": logits}
