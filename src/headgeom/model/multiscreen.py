"""The softmax-free multiscreen controls (docs §6.6): Multiscreen, Nakanishi (2026).

Each of the N_L layers is N_H parallel *gated screening tiles* that replace both attention and
the MLP; there is no LayerNorm and no position embedding. Residual width d_E = N_H·d_V, so the
axis lanes E_h (d_E × d_V) tile the residual exactly. Per layer (all bias-free):

    q, k = W_Q x, W_K x                      # (N_H·d_K) each, split per tile
    v, g = W_V x, W_G x                      # (N_H·d_V) each
    q, k, v ← q/|q|, k/|k|, v/|v|            # unit length per tile
    q, k   ← MiPE(q, k)                      # rotate coords 0,1 by position (CHOICE 4)
    s_ij   = q_i·k_j ∈ [-1, 1]
    a_ij   = max(1 − r(1 − s_ij), 0)² · m_ij # relevance × causal cosine window
    u_i    = TanhNorm(Σ_j a_ij v_j)          # TanhNorm(h) = tanh(|h|) h/|h|: norm < 1
    z_i    = u_i ⊙ tanh(SiLU(g_i)) · o       # gated, scaled tile output ("hook_z")
    x     ← x + Σ_h W_O^h z^h

The embedding rows are unit-normalised and tied: x_0 = e·Ŵ_E[id], logits = f·Ŵ_E x_L.

Named sites (``SITE_AXES``), addressed exactly as on ``headgeom.model.gpt.GPT``:

* ``blocks.{l}.hook_resid_pre``   residual stream entering layer l
* ``blocks.{l}.attn.hook_q/k``    unit, MiPE-rotated queries and keys (d_key wide)
* ``blocks.{l}.attn.hook_v``      unit values
* ``blocks.{l}.attn.hook_z``      tile output just before W_O (docs §6.6)
* ``blocks.{l}.hook_attn_out``    Σ_h W_O^h z^h (the whole layer update; there is no MLP)
* ``hook_resid_final``            residual before the unembedding

Counting (docs §4.4, §6.6): V·d_E + 2 + N_L·(2·d_E·N_H·d_K + 3·d_E·N_H·d_V + 3·N_H); the
frozen-write variant drops N_L·d_E·N_H·d_V. Paper size: 128,534,514 and 106,514,418.

[UNSPECIFIED → CHOICE] Everything §6.6 leaves open, each recorded in ``MultiscreenConfig``
(fields) or fixed here (source-frozen, §2.2). Where the Multiscreen paper's own choice is known
from public reimplementations, it is followed:

1. Positive scalars through ``exp(s) + 1``: window w = exp(s_w) + 1 ≥ 1, acceptance width
   r = exp(s_r) + 1 > 1; output scale o = exp(s_o), input scale e = exp(s_e), logit scale
   f = exp(s_f). Every scalar is a learned parameter without weight decay (§7.2).
2. Window mask m_ij = ½(1 + cos(π(i − j)/w)) for 0 ≤ i − j < w, else 0 (causal; 1 at j = i,
   falling continuously to 0 at distance w).
3. Relevance is exactly 0 when s_ij ≤ 1 − 1/r (keys outside the acceptance width are
   screened out, not down-weighted).
4. MiPE (``mipe``): the first two coordinates of unit q and k at position i are rotated by the
   angle π·i·γ(w)/w, γ(w) = ½(1 + cos(π w/w_th)) for w < w_th (``mipe_threshold``) and 0
   otherwise. It is parameter-free (the count is unchanged) and depends on i − j only.
5. Initialisation with σ₀ = ``init_range``: W_Q, W_K ~ N(0, (σ₀/√d_K)²); W_V ~ N(0, (σ₀/√d_V)²);
   W_G ~ N(0, σ₀²); learned W_O ~ N(0, (σ₀/√d_E)²); embedding ~ N(0, (σ₀/√d_E)²). Scalars:
   s_w linearly spaced over [0, ln ``window_init_max``] across the tiles of each layer
   (w from 2 to window_init_max + 1), r = ``relevance_width_init``, o = 1/√(N_H·N_L),
   e = 1, f = √d_E.
6. Frozen writes (``write-common-axis``, the paper's ``multiscreen-identity42``): W_O^h =
   g_ms·E_h with g_ms = std(W_O at init)·√(N_H·d_V) (§6.6), i.e. σ₀·√(N_H·d_V/d_E) = σ₀
   = 0.1 at paper size; a float64 persistent buffer, not a parameter.
7. Numerics: unit normalisation and TanhNorm divide by max(|·|, ``norm_eps``); the screening
   core (normalisation to TanhNorm) runs in float32 even under bf16 autocast, because
   1 − r(1 − s) near the acceptance edge needs more than bf16's 8 bits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from headgeom.model import facts
from headgeom.model.geometries import FrozenWriter, coordinate_blocks
from headgeom.model.gpt import GPT, Block, HookPoint, prefix_joined

ARCHITECTURE = facts.MULTISCREEN

SITE_AXES: dict[str, tuple[str, ...]] = {
    "hook_resid_pre": ("batch", "position", "d_model"),
    "attn.hook_q": ("batch", "position", "head", "d_key"),
    "attn.hook_k": ("batch", "position", "head", "d_key"),
    "attn.hook_v": ("batch", "position", "head", "d_head"),
    "attn.hook_z": ("batch", "position", "head", "d_head"),
    "hook_attn_out": ("batch", "position", "d_model"),
    "hook_resid_final": ("batch", "position", "d_model"),
}


@dataclass(frozen=True)
class MultiscreenConfig:
    """A multiscreen model. Names follow ``ModelConfig`` so analyses need no branch:
    n_layer = N_L, n_head = N_H (tiles per layer), d_model = d_E, d_head = d_V; d_key = d_K."""

    n_vocab: int
    n_ctx: int
    n_layer: int
    n_head: int
    d_model: int
    d_head: int
    d_key: int
    geometry: str = "learned"  # "learned" | "write-common-axis" (W_O^h = g_ms E_h, frozen)
    architecture: str = ARCHITECTURE  # tells a stored config from a GPT ModelConfig
    # [UNSPECIFIED → CHOICE] see the module docstring, items 4, 5 and 7.
    init_range: float = 0.1
    window_init_max: float = 256.0
    relevance_width_init: float = 2.0
    mipe: bool = True
    mipe_threshold: float = 256.0
    norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.architecture != ARCHITECTURE:
            raise ValueError(f"architecture={self.architecture!r}; expected {ARCHITECTURE!r}")
        if self.geometry not in WRITERS:
            raise ValueError(f"unknown geometry {self.geometry!r}; known: {sorted(WRITERS)}")
        for name in ("n_vocab", "n_ctx", "n_layer", "n_head", "d_model", "d_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.d_key < 2:
            raise ValueError(f"d_key={self.d_key} must be >= 2 (MiPE rotates two coordinates)")
        if not self.relevance_width_init > 1:
            raise ValueError(f"relevance_width_init={self.relevance_width_init} must be > 1")
        if not (self.window_init_max >= 1 and self.mipe_threshold > 0 and self.init_range > 0):
            raise ValueError("window_init_max >= 1, mipe_threshold > 0, init_range > 0 required")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> MultiscreenConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(
                f"unknown multiscreen config keys {sorted(unknown)}; known: {sorted(names)}"
            )
        return cls(**d)


# --------------------------------------------------------------------------- tile math
def unit(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


def positive(s: torch.Tensor) -> torch.Tensor:
    """exp(s) + 1: the window and acceptance width parameterisation (CHOICE 1)."""
    return torch.exp(s) + 1.0


def screening_relevance(s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """max(1 − r(1 − s), 0)²; exactly 0 for s ≤ 1 − 1/r (CHOICE 3)."""
    return torch.clamp(1.0 - r * (1.0 - s), min=0.0).square()


def causal_cosine_window(n_pos: int, w: torch.Tensor, queries: torch.Tensor | None = None):
    """m_ij = ½(1 + cos(π(i − j)/w)) for 0 ≤ i − j < w, else 0; (head, query, key) (CHOICE 2).
    Keys are positions 0..n_pos−1; queries the same, or the absolute positions ``queries``."""
    pos = torch.arange(n_pos, device=w.device, dtype=w.dtype)
    rows = pos if queries is None else queries.to(w.dtype)
    dist = rows[:, None] - pos[None, :]  # i − j, (queries, T)
    w = w[:, None, None]
    inside = (dist >= 0) & (dist < w)
    return torch.where(inside, 0.5 * (1.0 + torch.cos(math.pi * dist / w)), 0.0)


def mipe(x: torch.Tensor, w: torch.Tensor, threshold: float, start: int = 0) -> torch.Tensor:
    """Rotate coordinates 0, 1 of x (batch, position, head, d_key) by π·i·γ(w)/w (CHOICE 4);
    position i of x[:, t] is start + t (a suffix of a longer sequence)."""
    gamma = torch.where(w < threshold, 0.5 * (1.0 + torch.cos(math.pi * w / threshold)), 0.0)
    pos = torch.arange(start, start + x.shape[1], device=x.device, dtype=x.dtype)
    angle = math.pi * pos[:, None] * (gamma / w)[None, :]  # (T, H)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x0, x1 = x[..., 0], x[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return torch.cat((rotated, x[..., 2:]), dim=-1)


def tanh_norm(h: torch.Tensor, eps: float) -> torch.Tensor:
    """tanh(|h|)·h/|h|: keeps the direction, bounds the norm below 1. Clamping the norm in
    both places keeps the h → 0 limit (identity, gradient 1) instead of a dead gradient."""
    norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp_min(eps)
    return h * (torch.tanh(norm) / norm)


def multiscreen_write_scale(cfg: MultiscreenConfig) -> float:
    """g_ms: the RMS gain of an initial learned W_O, std·√(N_H·d_V) (§6.6, CHOICE 6)."""
    return w_o_init_std(cfg) * math.sqrt(cfg.n_head * cfg.d_head)


def w_o_init_std(cfg: MultiscreenConfig) -> float:
    return cfg.init_range / math.sqrt(cfg.d_model)


# --------------------------------------------------------------------------- reader, writers
class ScreeningReader(nn.Module):
    """Bias-free W_Q, W_K (N_H·d_K × d_E) and W_V, W_G (N_H·d_V × d_E) read the raw residual
    (no LayerNorm), so ``read_maps`` are the weight-space readers of §9.1 as they stand."""

    def __init__(self, cfg: MultiscreenConfig):
        super().__init__()
        self.n_head, self.d_key, self.d_head = cfg.n_head, cfg.d_key, cfg.d_head
        self.w_q = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_key, bias=False)
        self.w_k = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_key, bias=False)
        self.w_v = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_head, bias=False)
        self.w_g = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_head, bias=False)
        s = cfg.init_range
        for lin, std in (
            (self.w_q, s / math.sqrt(cfg.d_key)),
            (self.w_k, s / math.sqrt(cfg.d_key)),
            (self.w_v, s / math.sqrt(cfg.d_head)),
            (self.w_g, s),
        ):
            nn.init.normal_(lin.weight, 0.0, std)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k (B, T, H, d_K) and v, g (B, T, H, d_V)."""
        lead = x.shape[:-1]
        return (
            self.w_q(x).view(*lead, self.n_head, self.d_key),
            self.w_k(x).view(*lead, self.n_head, self.d_key),
            self.w_v(x).view(*lead, self.n_head, self.d_head),
            self.w_g(x).view(*lead, self.n_head, self.d_head),
        )

    def read_maps(self, X: str) -> torch.Tensor:
        """(head, d_key or d_head, d_model) for X in Q, K, V, G."""
        w = {"Q": self.w_q, "K": self.w_k, "V": self.w_v, "G": self.w_g}[X].weight
        return w.reshape(self.n_head, -1, w.shape[-1])


class LearnedWriter(nn.Module):
    """Σ_h W_O^h z^h with a trained, bias-free W_O (d_E × N_H·d_V)."""

    def __init__(self, cfg: MultiscreenConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.w_o = nn.Linear(cfg.n_head * cfg.d_head, cfg.d_model, bias=False)
        nn.init.normal_(self.w_o.weight, 0.0, w_o_init_std(cfg))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.w_o(z.flatten(-2))  # (B, T, H·d_V) -> (B, T, d_E)

    def write_maps(self) -> torch.Tensor:
        w = self.w_o.weight  # (d_E, H·d_V)
        return w.reshape(w.shape[0], self.n_head, self.d_head).permute(1, 0, 2)


def _learned_writer(cfg: MultiscreenConfig) -> nn.Module:
    return LearnedWriter(cfg)


def _axis_writer(cfg: MultiscreenConfig) -> nn.Module:
    # Multiscreen has no output bias, so the frozen writer has none either (counts, §6.6).
    return FrozenWriter(cfg, coordinate_blocks(cfg), multiscreen_write_scale(cfg), bias=False)


WRITERS = {"learned": _learned_writer, "write-common-axis": _axis_writer}


# --------------------------------------------------------------------------- model
class ScreeningTiles(nn.Module):
    """The N_H gated screening tiles of one layer; named ``attn`` in a block so the sites
    ``blocks.{l}.attn.hook_z`` and ``blocks[l].attn.writer`` match ``GPT``'s."""

    def __init__(self, cfg: MultiscreenConfig):
        super().__init__()
        self.cfg = cfg
        self.reader, self.writer = ScreeningReader(cfg), WRITERS[cfg.geometry](cfg)
        H = cfg.n_head
        self.s_w = nn.Parameter(torch.linspace(0.0, math.log(cfg.window_init_max), H))
        self.s_r = nn.Parameter(torch.full((H,), math.log(cfg.relevance_width_init - 1.0)))
        self.s_o = nn.Parameter(torch.full((H,), -0.5 * math.log(H * cfg.n_layer)))
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, g = self.reader(x)
        with torch.autocast(x.device.type, enabled=False):  # fp32 core (CHOICE 7)
            q, k, v = self.prepare(q.float(), k.float(), v.float(), start=0)
            u = self.screen(q, k, v)  # (B, T, H, d_V)
        return self.writer(self.hook_z(self.gate(u, g)))

    def gate(self, u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """z = u ⊙ tanh(SiLU(g)) · exp(s_o): the gated, scaled tile outputs."""
        return u.to(g.dtype) * torch.tanh(F.silu(g)) * torch.exp(self.s_o)[:, None].to(g.dtype)

    def prepare(self, q, k, v, start: int) -> tuple[torch.Tensor, ...]:
        """Unit q, k, v with MiPE on q, k (positions start, start + 1, …) at the sites
        ``hook_q``/``hook_k``/``hook_v``: what the screen reads, position by position."""
        eps = self.cfg.norm_eps
        q, k, v = unit(q, eps), unit(k, eps), unit(v, eps)
        if self.cfg.mipe:
            w, t = positive(self.s_w.float()), self.cfg.mipe_threshold
            q, k = mipe(q, w, t, start), mipe(k, w, t, start)
        return self.hook_q(q), self.hook_k(k), self.hook_v(v)

    def screen(self, q, k, v, queries: torch.Tensor | None = None) -> torch.Tensor:
        """TanhNorm(Σ_j a_ij v_j) (B, S, H, d_V) for the S queries ``q`` over the T keys
        ``k``/``v`` (B, ·, H, d); the queries sit at positions 0..T−1, or at ``queries``."""
        eps = self.cfg.norm_eps
        w, r = positive(self.s_w.float()), positive(self.s_r.float())
        s = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)  # (B, H, S, T): s_ij = q_i·k_j
        a = screening_relevance(s, r[:, None, None]) * causal_cosine_window(k.shape[1], w, queries)
        h = (a @ v.transpose(1, 2)).transpose(1, 2)  # Σ_j a_ij v_j, (B, S, H, d_V)
        return tanh_norm(h, eps)

    def z_suffix(
        self,
        x: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z at the S suffix positions whose residual is ``x`` (R, S, D), screening the P
        prefix keys/values ``past_k``/``past_v`` (B, P, H, d; the sites ``hook_k``/``hook_v``
        of a clean forward) plus the suffix itself: the contract of ``gpt.Attention.z_suffix``.
        Tiles read the raw residual position by position and the window and MiPE depend on
        absolute positions only, so this equals ``forward`` at those positions.
        Returns ``(z, k, v)``: z (R, S, H, d_V), or (R, 1, H, d_V) when ``last_only``."""
        S, P = x.shape[1], past_k.shape[1]
        q, k, v, g = self.reader(x)
        with torch.autocast(x.device.type, enabled=False):
            q, k, v = self.prepare(q.float(), k.float(), v.float(), start=P)
            queries = torch.arange(P, P + S, device=x.device)
            if last_only:
                q, queries, g = q[:, -1:], queries[-1:], g[:, -1:]
            keys, values = prefix_joined(past_k.float(), k), prefix_joined(past_v.float(), v)
            u = self.screen(q, keys, values, queries)
        return self.hook_z(self.gate(u, g)), k, v


class ScreeningBlock(nn.Module):
    def __init__(self, cfg: MultiscreenConfig):
        super().__init__()
        self.attn = ScreeningTiles(cfg)
        self.hook_resid_pre, self.hook_attn_out = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        return x + self.hook_attn_out(self.attn(x))

    # The KV-prefix forward of ``gpt.Block`` (the registry's ``prefix_reuse``), its own code:
    # ``attn.z_suffix`` is the tiles', ``after_attn`` below has no MLP.
    forward_suffix = Block.forward_suffix
    after_z = Block.after_z

    def after_attn(
        self, x: torch.Tensor, attn_out: torch.Tensor, mlp_out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if mlp_out is not None:
            raise ValueError("a multiscreen block has no MLP to clamp (no hook_mlp_out site)")
        return x + self.hook_attn_out(attn_out)


class MultiscreenLM(nn.Module):
    """Drop-in for ``GPT``: ``cfg``, ``blocks[l].attn.writer``, the named sites, ``hooks``,
    ``run_with_cache``, ``n_params``, ``optim_groups``, ``forward(ids, last_only)`` and
    ``answer_logits``. Built through ``headgeom.model.registry.build_model`` like every model."""

    # One hook mechanism for every model: GPT's site methods only use ``named_modules``
    # and ``self(...)``, and its counting/decay rules are the ones §4.4 and §7.2 ask for
    # (scalars have rank < 2, so they are never decayed).
    hook_points = GPT.hook_points
    hooks = GPT.hooks
    run_with_cache = GPT.run_with_cache
    n_params = GPT.n_params
    optim_groups = GPT.optim_groups

    def __init__(self, cfg: MultiscreenConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.n_vocab, cfg.d_model)  # rows unit-normalised at use; tied
        nn.init.normal_(self.wte.weight, 0.0, cfg.init_range / math.sqrt(cfg.d_model))
        self.s_e = nn.Parameter(torch.zeros(()))  # input scale e = exp(s_e) = 1
        self.s_f = nn.Parameter(torch.full((), 0.5 * math.log(cfg.d_model)))  # f = √d_E
        self.blocks = nn.ModuleList(ScreeningBlock(cfg) for _ in range(cfg.n_layer))
        self.hook_resid_final = HookPoint()

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V); (B, V) at the final position when ``last_only``."""
        x = self.residual(ids)
        return self.unembed(x[:, -1] if last_only else x)

    def residual(self, ids: torch.Tensor) -> torch.Tensor:
        """The residual (B, T, d_E) leaving the last block (after ``hook_resid_final``)."""
        T = ids.shape[1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the context {self.cfg.n_ctx}")
        emb = unit(self.wte.weight, self.cfg.norm_eps)  # (V, d_E)
        x = F.embedding(ids, emb) * torch.exp(self.s_e)
        for block in self.blocks:
            x = block(x)
        return self.hook_resid_final(x)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of residuals (..., d_E): the unit-normalised tied embedding, × f."""
        return (x @ unit(self.wte.weight, self.cfg.norm_eps).T) * torch.exp(self.s_f)

    def answer_logits(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Logits (R, K) of the token ids ``ids`` (R, K) at the final position, from the
        residual ``x`` (R, T, d_E) leaving the last block: ``forward`` after its blocks (rows
        of the unit-normalised tied embedding, scaled by f), for a few ids only."""
        h = self.hook_resid_final(x)[:, -1]  # (R, d_E)
        w = unit(self.wte.weight[ids], self.cfg.norm_eps)  # rows of unit(wte), (R, K, d_E)
        return torch.einsum("rd,rkd->rk", h, w) * torch.exp(self.s_f)


PAPER_CONFIG = dict(
    n_vocab=50257, n_ctx=512, n_layer=21, n_head=16, d_model=1024, d_head=64, d_key=16
)
