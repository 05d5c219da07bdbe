"""Tiny SA-MoE models the SA-MoE unit tests share: a dense workspace GPT to upcycle, random
models of each variant with nonzero writes, and a hand-written reference forward that
shares no routing, state or hook code with ``headgeom.samoe.model``."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from headgeom.model.gpt import GPT
from headgeom.samoe.config import DenseConfig, MoEConfig
from headgeom.samoe.model import SAMoE

N_VOCAB = 37
DENSE = DenseConfig(n_layer=6, d_model=32, n_head=2, d_head=16, d_mlp=48, n_ctx=24, steps=10,
                    warmup_steps=1)  # fmt: skip
CFG = DENSE.model_config(N_VOCAB)
MOE = MoEConfig(n_experts=8, top_k=2, state_dim=8)
#: A low clamp, reached within a few layers by ``random_model(..., drift=…)``.
MOE_CLAMPED = MoEConfig(n_experts=8, top_k=2, state_dim=8, clamp=2.0)


def dense_gpt(seed: int = 0) -> GPT:
    """The dense source: the workspace GPT's own init, from a fixed seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT(CFG)


def random_init(model: SAMoE, generator: torch.Generator, write_std: float = 0.0) -> SAMoE:
    """Fill every parameter with small Gaussian draws (tests and toy checks): weights
    N(0, 0.02²) (routers ~ N(0, 1/d) so the routing is not degenerate), LayerNorm at (1, 0)
    plus small noise, and write heads N(0, write_std²) — nonzero writes when write_std > 0.
    Not the study's initialisation: that is ``headgeom.samoe.upcycle``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            if ".write." in name:
                p.copy_(noise * write_std)
            elif ".router." in name:
                p.copy_(noise / math.sqrt(model.cfg.d_model))
            elif "ln" in name.split(".")[-2]:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.05 * noise)
            else:
                p.copy_(0.02 * noise if p.dim() >= 2 else 0.01 * noise)
    return model


def random_model(
    variant: str,
    seed: int = 0,
    write_std: float = 0.5,
    moe: MoEConfig = MOE,
    dtype: torch.dtype = torch.float32,
    drift: float = 0.0,
) -> SAMoE:
    """A random SA-MoE with nonzero writes (``write_std`` > 0), in ``dtype``; ``drift`` is
    added to the write bias of the first half of the state coordinates, so P's state there
    grows by about tanh(drift) a layer and reaches the clamp."""
    model = SAMoE(CFG, moe, variant)
    random_init(model, torch.Generator().manual_seed(seed), write_std=write_std)
    if drift:
        with torch.no_grad():
            for block in model.blocks:
                block.write.proj.bias[: moe.state_dim // 2] += drift
    return model.to(dtype).eval()


def token_ids(batch: int = 3, seq: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, N_VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def reference_forward(
    model: SAMoE,
    ids: torch.Tensor,
    suppress: tuple[int, int, int] | None = None,
    alpha: float = 0.0,
) -> dict[str, torch.Tensor]:
    """SAMOE E1/E2 written out by hand for one model: every expert on every token (a dense
    mixture masked by the Top-k), state update and E7 suppression inline. ``suppress`` =
    (row, position, source layer). Returns router logits (N, B, T, E), states (N + 1, B, T,
    r), output logits (B, T, V) and whether a clip acted after the source (B,)."""
    moe = model.moe_cfg
    B, T = ids.shape
    h = model.wte(ids) + model.wpe(torch.arange(T))
    s = torch.zeros(B, T, moe.state_dim, dtype=h.dtype)
    zs, states = [], [s]
    clipped_after = torch.zeros(B, dtype=torch.bool)
    for layer, block in enumerate(model.blocks):
        m = h + block.attn(h)
        x = block.ln_2(m)
        z = x @ block.moe.router.W_x.T + s @ block.moe.router.W_s.T
        zs.append(z)
        chosen = torch.topk(z, moe.top_k, dim=-1).indices  # random logits: no ties
        probs = torch.softmax(z, dim=-1)
        y = block.moe.shared(x)
        for e, expert in enumerate(block.moe.experts):
            on = (chosen == e).any(-1, keepdim=True).to(x.dtype)
            y = y + on * probs[..., e : e + 1] * expert(x)
        h = m + y
        u = torch.tanh(F.linear(y, block.write.proj.weight, block.write.proj.bias))
        if model.variant == "persistent":
            raw = s + u
            s_new = raw.clamp(-moe.clamp, moe.clamp)
            if suppress is not None and layer > suppress[2]:
                clipped_after |= (raw.abs() > moe.clamp).flatten(1).any(-1)
        else:
            s_new = u
        if suppress is not None and layer == suppress[2]:
            row, pos, _ = suppress
            s_new = s_new.clone()
            s_new[row, pos] = s[row, pos] + alpha * (s_new[row, pos] - s[row, pos])
        s = s_new
        states.append(s)
    logits = model.ln_f(h) @ model.wte.weight.T
    return {"z": torch.stack(zs), "state": torch.stack(states), "logits": logits,
            "clipped_after": clipped_after}  # fmt: skip
