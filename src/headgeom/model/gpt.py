"""A pre-LayerNorm GPT-2-style decoder (docs §4.1) with named activation sites.

The whole model is in this file: hook points, attention, MLP, block, model (its config is
``headgeom.model.config.ModelConfig``). How a head reads and writes is delegated to the
(reader, writer) pair of ``headgeom.model.geometries``.

Named sites (TransformerLens-style), each with explicit axes in ``SITE_AXES``:

* ``blocks.{l}.hook_resid_pre``   residual stream entering block l
* ``blocks.{l}.attn.hook_q/k/v``  per-head queries, keys, values
* ``blocks.{l}.attn.hook_z``      head output just before W_O (docs §0: z^{l,h}_t)
* ``blocks.{l}.hook_attn_out``    Σ_h W_O^h z^h + b_O
* ``blocks.{l}.hook_resid_mid``   residual after attention
* ``blocks.{l}.hook_mlp_out``     MLP output
* ``hook_resid_final``            residual before the final LayerNorm

Patching, leakage and clamping all use one mechanism: ``model.hooks({site: fn})`` sets
functions ``fn(activation) -> activation`` on those sites for the duration of a block.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from headgeom.model.config import ModelConfig
from headgeom.model.geometries import make_geometry

SITE_AXES: dict[str, tuple[str, ...]] = {
    "hook_resid_pre": ("batch", "position", "d_model"),
    "attn.hook_q": ("batch", "position", "head", "d_head"),
    "attn.hook_k": ("batch", "position", "head", "d_head"),
    "attn.hook_v": ("batch", "position", "head", "d_head"),
    "attn.hook_z": ("batch", "position", "head", "d_head"),
    "hook_attn_out": ("batch", "position", "d_model"),
    "hook_resid_mid": ("batch", "position", "d_model"),
    "hook_mlp_out": ("batch", "position", "d_model"),
    "hook_resid_final": ("batch", "position", "d_model"),
}


def site(layer: int, name: str) -> str:
    """Full name of a per-block site, e.g. ``site(5, "attn.hook_z") == "blocks.5.attn.hook_z"``."""
    if name not in SITE_AXES or name == "hook_resid_final":
        raise KeyError(f"unknown block site {name!r}; known: {sorted(SITE_AXES)}")
    return f"blocks.{layer}.{name}"


class HookPoint(nn.Module):
    """Identity that applies an optional function: where analyses read or replace a site."""

    def __init__(self) -> None:
        super().__init__()
        self.fn: Callable[[torch.Tensor], torch.Tensor | None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fn is None:
            return x
        out = self.fn(x)
        return x if out is None else out


def prefix_joined(past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The cached keys or values ``past`` (B, P, H, d) of B prefix sequences followed by those
    of R = G·B suffix rows ``new`` (R, S, H, d): (R, P + S, H, d), row g·B + b continuing
    prefix b (broadcast, never gathered per row)."""
    R, B = new.shape[0], past.shape[0]
    if R % B:
        raise ValueError(f"{R} suffix rows do not repeat the {B} prefix sequences")
    return torch.cat([past.expand(R // B, *past.shape).flatten(0, 1), new], dim=1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, reader: nn.Module, writer: nn.Module):
        super().__init__()
        self.reader, self.writer = reader, writer
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.reader(x)  # each (B, T, H, d)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        z = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)  # (B, H, T, d) -> (B, T, H, d)
        return self.writer(self.hook_z(z))

    def z_suffix(
        self,
        x: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z at the S suffix positions whose residual is ``x`` (R, S, D), attending to the P
        prefix keys/values ``past_k``/``past_v`` (B, P, H, d) plus the suffix itself
        (causal). Readers act position by position, so this equals ``forward`` on the whole
        sequence at those positions (KV-cache reuse for patching).

        R = G·B: row g·B + b continues sequence b of the prefix, so G variants of the same
        B sequences (e.g. G patched heads) share one B-row prefix cache (broadcast into the
        keys, never gathered per row).
        Returns ``(z, k, v)``: z (R, S, H, d), or (R, 1, H, d) at the final position only
        when ``last_only``; k, v (R, S, H, d) of the suffix.
        """
        q, k, v = self.reader(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        S, P = k.shape[1], past_k.shape[1]

        def joined(past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            return prefix_joined(past, new).transpose(1, 2)  # (R, H, P + S, d)

        if last_only:
            q, mask = q[:, -1:], None  # the final query sees every key
        else:
            pos = torch.arange(P + S, device=x.device)
            mask = pos[None, :] <= pos[P:, None]  # (S, P + S): key t <= query position
        z = F.scaled_dot_product_attention(
            q.transpose(1, 2), joined(past_k, k), joined(past_v, v), attn_mask=mask
        ).transpose(1, 2)
        return self.hook_z(z), k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.c_proj = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.c_proj.residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        reader, writer = make_geometry(cfg, layer)
        self.attn = Attention(cfg, reader, writer)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.mlp = MLP(cfg)
        self.hook_resid_pre, self.hook_attn_out = HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(x)))
        return x + self.hook_mlp_out(self.mlp(self.ln_2(x)))

    def after_z(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The rest of the block once its head outputs ``z`` (B, S, H, d) are known: add
        W_O z + b_O to the residual ``x`` (B, S, D) entering it, then the MLP."""
        return self.after_attn(x, self.attn.writer(z))

    def after_attn(
        self, x: torch.Tensor, attn_out: torch.Tensor, mlp_out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The rest of the block once its attention output ``attn_out`` (B, S, D) is known:
        add it to the residual ``x`` entering the block, then the MLP; ``mlp_out`` given
        (a clamp, docs §13.3) is added instead of computing the MLP."""
        x = self.hook_resid_mid(x + self.hook_attn_out(attn_out))
        return x + self.hook_mlp_out(self.mlp(self.ln_2(x)) if mlp_out is None else mlp_out)

    def forward_suffix(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward`` at the suffix positions only (see ``Attention.z_suffix``: ``x`` is
        (R, S, D), R a multiple of the B prefix sequences of ``past_k``/``past_v``).
        Returns ``(x_out, k, v)``: x_out (R, S, D), or (R, 1, D) when ``last_only``."""
        x = self.hook_resid_pre(x)
        z, k, v = self.attn.z_suffix(x, past_k, past_v, last_only)
        return self.after_z(x[:, -1:] if last_only else x, z), k, v


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.n_vocab, cfg.d_model)  # tied unembedding
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.hook_resid_final = HookPoint()
        self._init_weights()

    # GPT-2 initialisation (docs §4.2); frozen buffers are untouched.
    def _init_weights(self) -> None:
        resid_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = (
                    resid_std
                    if getattr(module, "residual_projection", False)
                    else self.cfg.init_std
                )
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.wte.weight, 0.0, self.cfg.init_std)
        nn.init.normal_(self.wpe.weight, 0.0, self.cfg.pos_init_std)

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V) for model-vocabulary ids (B, T); (B, V) at the final position
        when ``last_only`` (patching needs only the answer position)."""
        x = self.residual(ids)
        return self.unembed(x[:, -1] if last_only else x)

    def residual(self, ids: torch.Tensor) -> torch.Tensor:
        """The residual (B, T, D) leaving the last block (after ``hook_resid_final``): the
        forward without its unembedding, so a caller can unembed a few positions at a time
        (a full-vocabulary KL over every position needs B·T·V logits otherwise)."""
        T = ids.shape[1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the context {self.cfg.n_ctx}")
        x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.hook_resid_final(x)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of residuals (..., D) from :meth:`residual`: ln_f, tied W_E^T."""
        return self.ln_f(x) @ self.wte.weight.T

    def answer_logits(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Logits (R, K) of the token ids ``ids`` (R, K) at the final position, from the
        residual ``x`` (R, T, D) leaving the last block: ``forward`` after its blocks, for a
        few ids only (the fast patching engine needs two answer logits)."""
        h = self.ln_f(self.hook_resid_final(x)[:, -1])  # (R, D)
        return torch.einsum("rd,rkd->rk", h, self.wte.weight[ids])  # (R, K)

    def n_params(self) -> int:
        """Trainable parameters, tied embedding counted once, frozen buffers excluded (§4.4)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def optim_groups(self, weight_decay: float) -> list[dict]:
        """Weight decay on tensors of rank ≥ 2 only (docs §7.2)."""
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    # ------------------------------------------------------------------ sites
    def hook_points(self) -> dict[str, HookPoint]:
        return {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}

    @contextlib.contextmanager
    def hooks(
        self, fns: Mapping[str, Callable[[torch.Tensor], torch.Tensor | None]]
    ) -> Iterator[None]:
        """Attach ``fns`` to named sites; they are removed on exit, even after an error."""
        points = self.hook_points()
        unknown = set(fns) - set(points)
        if unknown:
            raise KeyError(f"unknown sites {sorted(unknown)}")
        try:
            for name, fn in fns.items():
                points[name].fn = fn
            yield
        finally:
            for name in fns:
                points[name].fn = None

    def run_with_cache(
        self, ids: torch.Tensor, names: list[str], last_only: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cache: dict[str, torch.Tensor] = {}

        def saver(name: str):
            def save(x: torch.Tensor) -> None:
                cache[name] = x.detach()

            return save

        with self.hooks({n: saver(n) for n in names}):
            logits = self(ids, last_only=last_only)
        return logits, cache
