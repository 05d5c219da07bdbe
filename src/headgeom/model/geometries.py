"""How attention heads read and write: small strategy modules a block is given.

A geometry is a pair (reader, writer). Readers map the residual stream x (batch, position,
d_model) to per-head q, k, v (batch, position, head, d_head); writers map the head outputs
z (batch, position, head, d_head) back to the residual stream. Each also exposes its
weight-space maps so geometric analyses read the same matrices the forward pass uses:

* ``writer.write_maps()``        -> (head, d_model, d_head): W_O^{l,h} (docs §0, §9.1)
* ``reader.read_maps(X)``         -> (head, d_head, d_model): W_X^{l,h}
* ``reader.folded_read_maps(X)``  -> (head, d_head, d_model): W_X diag(γ) P_c (docs §9.2)
* ``reader.read_heads(x, heads, kinds)`` -> (N, ..., d_head): the X of N chosen (head, X)
  pairs, each on its own input (ACDC, ``headgeom.heads.analysis.acdc``)

Every geometry of the study is one keyword record in ``GEOMETRIES`` (a :class:`Geometry`):
its architecture, reader kind, sizing rule, parameters and capabilities, and for GPT its
factory ``(cfg, layer) -> (reader, writer)``; the block never branches on its name. Callers
outside the model package ask ``headgeom.model.registry``, which adds the architectures.

Registered geometries (D = d_model, d = d_head, H = n_head, L = n_layer, l = layer,
g = init_std·sqrt(D/2L); E_h is coordinate block h, B_i member i of the Kerdock ⊗ Haar family
of ``headgeom.model.kerdock``). All except the routed ones need H·d = D.

====================  ===================================  ==================================
geometry              write W_O^{l,h} (frozen unless said)  readers
====================  ===================================  ==================================
learned               learned (+ b_O)                       free
write-common-axis     g E_h (+ learned b_O)                 free
write-common          g B_0 E_h                             free
write-rotated         g B_l E_h                             free
read-common           learned (+ b_O)                       block E_h
all-common-axis       g E_h                                 block E_h
all-rotated           g B_l E_h                             block h of B_{L+l}
all-rotated-self      g B_l E_h                             block h of B_l (its own write)
fixeddiag             g sqrt(d/w) E_h diag(m)               free
identity-original     E_h (scale 1)                         free
value384              g E_h                                 free + head-local value adapter
mlp3456               g E_h (MLP width: ``cfg.d_mlp``)      free
write-routed-a/b/c    routings of H > D/d heads, no b_O     free
multiscreen-learned   learned, no b_O (softmax-free tiles)  free, no LayerNorm (§6.6)
multiscreen-identity  g_ms E_h, no b_O (softmax-free tiles) free, no LayerNorm (§6.6)
====================  ===================================  ==================================

Every parameter a geometry uses, and every METHODS ``[UNSPECIFIED → CHOICE]`` it makes, is
an entry of ``ModelConfig.geometry_params``: :func:`resolve_geometry_params` fills the
defaults below when the model config is made, so the config (hashed, and stored in every
checkpoint header) states them all.

* ``write_scale`` — gain of a frozen W_O: g (§5.6); fixeddiag g·sqrt(d/w) (§6.3);
  identity-original 1 (§6.3).
* ``basis_m``, ``basis_r``, ``basis_members`` — the family D = 2^m·r with members
  0..basis_members−1 (§5.3). Default: the largest even m (paper: m = 8, r = 3) and 2L members
  (the paper's B_0..B_23), or as many as the geometry needs when the family is smaller.
* ``block_init_std`` — [CHOICE §4.3.1] A_{Q,K,V} ~ N(0, (init_std·sqrt(D/d))²) = N(0, 0.0693²).
* ``write_width``, ``write_mask`` — fixeddiag: w = ⌊4d/5⌋ written coordinates (§6.3, 51 at
  d = 64); [CHOICE §6.3] ``"first"``: head-internal indices 0..w−1 onto lane coordinates
  dh..dh+w−1.
* ``value_adapter_width``, ``value_adapter_init_std``, ``value_adapter_layout`` — value384:
  width D/2 (384 at paper size, [DERIVED] from the count), [CHOICE §6.4] U1 ~ N(0, 0.02²),
  U2 = 0, ``"head-local"`` layout v_h ← v_h + U2^h GELU(U1^h v_h) without biases.
* ``attn_out_bias`` — routed controls: [CHOICE §6.5] no b_O (false).
* ``angle_offset`` — write-routed-c: [CHOICE §6.5] b(h) = (h + 5) mod (D/d).

Frozen maps are persistent float64 buffers (saved in the checkpoint, never parameters, never
seen by the optimizer) cast to the activation dtype at use (docs §5.4 step 8, §7.1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from headgeom.model import facts
from headgeom.model.facts import GeometryFacts, ReaderKind
from headgeom.model.kerdock import build_basis_family, kerdock_shape

if TYPE_CHECKING:
    from headgeom.model.kerdock import BasisFamily

READ_TYPES = ("Q", "K", "V")


class ModelShape(Protocol):
    """What a geometry reads from its model's config (``headgeom.model.config.ModelConfig``;
    the multiscreen writers pass ``MultiscreenConfig``, which has the sizes). A protocol, so
    this module imports no config and the config can import this module."""

    n_layer: int
    n_head: int
    d_model: int
    d_head: int
    init_std: float
    ln_eps: float
    geometry: str
    geometry_params: Mapping[str, Any]


def write_scale(cfg: ModelShape) -> float:
    """g = 0.02·sqrt(D / 2L): the RMS gain of an initial learned W_O (docs §4.2, §5.6)."""
    return cfg.init_std * math.sqrt(cfg.d_model / (2 * cfg.n_layer))


def coordinate_blocks(cfg: ModelShape) -> torch.Tensor:
    """[E_0 | E_1 | ... | E_{H-1}] as a float64 (d_model, head·d_head) matrix (docs §0)."""
    if cfg.n_head * cfg.d_head != cfg.d_model:
        raise ValueError(
            f"axis geometries need n_head·d_head == d_model, got {cfg.n_head}·{cfg.d_head} "
            f"!= {cfg.d_model}"
        )
    return torch.eye(cfg.d_model, dtype=torch.float64)


def _cast(owner: nn.Module, buffer: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``scale · buffer`` in ``dtype`` on the buffer's device, computed in float64 and then
    cast (docs §5.4 step 8), kept on ``owner`` until the buffer, its device or the dtype
    changes: a frozen map costs no per-step cast. The key holds the buffer's version counter,
    so an in-place load (``load_state_dict``) invalidates the copy."""
    if torch.compiler.is_compiling():  # the compiled graph fuses the cast itself
        return (scale * buffer).to(dtype)
    key = (
        dtype,
        buffer.device,
        buffer.data_ptr(),
        buffer._version,
        scale,
        torch.is_inference_mode_enabled(),  # inference tensors cannot enter autograd later
    )
    cached = owner.__dict__.get("_cast_cache")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            value = (scale * buffer).to(dtype)
        owner.__dict__["_cast_cache"] = cached = (key, value)
    return cached[1]


def _blocks(basis: torch.Tensor, n_head: int, d_head: int) -> torch.Tensor:
    """(D, H·d) columns [M_0 | ... | M_{H−1}] -> (H, D, d) per-head blocks."""
    return basis.reshape(basis.shape[0], n_head, d_head).permute(1, 0, 2)


# --------------------------------------------------------------------------- writers
class LearnedWriter(nn.Module):
    """Attention output Σ_h W_O^h z^h + b_O with a trained W_O (GPT-2's ``c_proj``)."""

    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.c_proj = nn.Linear(cfg.n_head * cfg.d_head, cfg.d_model)
        self.c_proj.residual_projection = True  # GPT-2 init: std 0.02/sqrt(2L)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.c_proj(z.flatten(-2))  # (B, T, H·d) -> (B, T, D)

    def write_maps(self) -> torch.Tensor:
        return _blocks(self.c_proj.weight, self.n_head, self.d_head)


class FrozenWriter(nn.Module):
    """W_O^h = scale·M_h frozen as a float64 buffer; the output bias b_O stays learned (§4.3)
    unless ``bias=False`` (the routed controls, §6.5).

    ``basis`` holds the columns [M_0 | ... | M_{H-1}] (d_model, head·d_head), e.g.
    [B E_0 | ... | B E_{H-1}]. It is a persistent buffer: saved in the checkpoint, never
    trained, never counted as a parameter.
    """

    def __init__(self, cfg: ModelShape, basis: torch.Tensor, scale: float, bias: bool = True):
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
        w = _cast(self, self.basis, self.scale, z.dtype)  # g·M in the activation dtype
        return nn.functional.linear(z.flatten(-2), w, self.b_O)

    def write_maps(self) -> torch.Tensor:
        return _blocks(self.scale * self.basis, self.n_head, self.d_head)


# --------------------------------------------------------------------------- readers
class FreeReader(nn.Module):
    """Shared pre-attention LayerNorm LN_1 then learned W_{Q,K,V} (GPT-2's ``c_attn``)."""

    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.n_head * cfg.d_head)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.c_attn(self.ln_1(x))  # (B, T, 3·H·d), GPT-2 order q | k | v
        q, k, v = qkv.split(self.n_head * self.d_head, dim=-1)
        shape = (*x.shape[:-1], self.n_head, self.d_head)
        return q.view(shape), k.view(shape), v.view(shape)

    def read_heads(self, x: torch.Tensor, heads: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        """X of N (head, X) pairs, pair n on its own input: ``x`` (N, ..., D), ``heads`` and
        ``kinds`` (N,) int64 (``kinds`` indexes ``READ_TYPES``) -> (N, ..., d), row n
        ``forward(x[n])[kinds[n]][..., heads[n], :]`` computing head ``heads[n]`` only."""
        H, d = self.n_head, self.d_head
        w = self.c_attn.weight.view(3, H, d, -1)[kinds, heads]  # (N, d, D)
        b = self.c_attn.bias.view(3, H, d)[kinds, heads]  # (N, d)
        u = self.ln_1(x).flatten(1, -2)  # (N, R, D)
        return torch.baddbmm(b[:, None], u, w.mT).view(*x.shape[:-1], d)

    def read_maps(self, X: str) -> torch.Tensor:
        i = READ_TYPES.index(X)
        hd = self.n_head * self.d_head
        w = self.c_attn.weight[i * hd : (i + 1) * hd]  # (H·d, D)
        return w.reshape(self.n_head, self.d_head, -1)

    def folded_read_maps(self, X: str) -> torch.Tensor:
        w = self.read_maps(X).double() * self.ln_1.weight.double()  # W_X diag(γ)
        return w - w.mean(dim=-1, keepdim=True)  # · P_c (centering acts on the D axis)


class ValueAdapterReader(FreeReader):
    """A free reader whose values pass a head-local residual adapter (value384, docs §6.4):

        v_h ← v_h + U_2^h GELU(U_1^h v_h),   U_1^h (W × d), U_2^h (d × W), no biases.

    [CHOICE §6.4] head-local layout, U_1 ~ N(0, ``value_adapter_init_std``²) (0.02), U_2 = 0,
    so training starts exactly as write-common-axis; GELU is the tanh approximation (§4.1).
    The adapter acts after W_V and before ``hook_v``, so z^{l,h} still depends on head h's
    value path only. ``read_maps("V")`` is the linear W_V the adapter follows.
    """

    def __init__(self, cfg: ModelShape):
        super().__init__(cfg)
        p = cfg.geometry_params
        width = p["value_adapter_width"]
        self.U1 = nn.Parameter(torch.empty(cfg.n_head, width, cfg.d_head))  # (H, W, d)
        nn.init.normal_(self.U1, 0.0, p["value_adapter_init_std"])
        self.U2 = nn.Parameter(torch.zeros(cfg.n_head, cfg.d_head, width))  # (H, d, W)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().forward(x)  # (B, T, H, d) each
        hidden = F.gelu(torch.einsum("bthi,hwi->bthw", v, self.U1), approximate="tanh")
        return q, k, v + torch.einsum("bthw,hiw->bthi", hidden, self.U2)

    def read_heads(self, x: torch.Tensor, heads: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        """``FreeReader.read_heads``, values through their head's adapter."""
        out = super().read_heads(x, heads, kinds)  # (N, ..., d)
        is_v = kinds == READ_TYPES.index("V")
        if bool(is_v.any()):
            v, h = out[is_v].flatten(1, -2), heads[is_v]  # (N_v, R, d)
            hidden = F.gelu(torch.bmm(v, self.U1[h].mT), approximate="tanh")  # (N_v, R, W)
            out[is_v] = (v + torch.bmm(hidden, self.U2[h].mT)).view(out[is_v].shape)
        return out


class BlockReader(nn.Module):
    """Block reader (docs §4.3.1): head h reads one d-dim block S_h of the residual, the
    same block for Q, K and V:

        b_h = S_hᵀ x;   u_h = LN_h(b_h);   X_h = A_X^h u_h + b_X^h   (X in Q, K, V)

    ``basis`` [S_0 | ... | S_{H−1}] (D, H·d) is a frozen float64 buffer with orthonormal
    columns. LN_h is a LayerNorm over the d block coordinates with its own gain γ_h and bias
    β_h; it *replaces* the shared LN_1 ([DERIVED] from the count, §4.3.1), so centering acts
    within the block. A_X^h are learned d×d maps, [CHOICE §4.3.1] initialised
    N(0, ``block_init_std``²) = N(0, (init_std·sqrt(D/d))²); b_{Q,K,V} are learned (3·H·d).
    Gains, biases and LN parameters are stored flat (rank 1: no weight decay, §7.2).
    """

    def __init__(self, cfg: ModelShape, basis: torch.Tensor):
        super().__init__()
        H, d = cfg.n_head, cfg.d_head
        if basis.shape != (cfg.d_model, H * d):
            raise ValueError(
                f"read basis has shape {tuple(basis.shape)}, expected ({cfg.d_model}, {H * d})"
            )
        self.n_head, self.d_head, self.eps = H, d, cfg.ln_eps
        self.register_buffer("basis", basis.to(torch.float64).contiguous())
        self.ln_weight = nn.Parameter(torch.ones(H * d))  # γ_h, head-major
        self.ln_bias = nn.Parameter(torch.zeros(H * d))  # β_h
        std = cfg.geometry_params["block_init_std"]
        self.A_Q, self.A_K, self.A_V = (
            nn.Parameter(nn.init.normal_(torch.empty(H, d, d), 0.0, std)) for _ in READ_TYPES
        )
        self.b_QKV = nn.Parameter(torch.zeros(3 * H * d))  # q | k | v, head-major

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        H, d = self.n_head, self.d_head
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        b = (x @ _cast(self, self.basis, 1.0, dtype)).unflatten(-1, (H, d))  # S_hᵀ x
        u = F.layer_norm(b, (d,), eps=self.eps)
        u = u * self.ln_weight.view(H, d) + self.ln_bias.view(H, d)
        bias = self.b_QKV.view(3, H, d)
        return tuple(
            torch.einsum("bthi,hoi->btho", u, A) + bias[i]
            for i, A in enumerate((self.A_Q, self.A_K, self.A_V))
        )

    def read_heads(self, x: torch.Tensor, heads: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        """X of N (head, X) pairs, pair n on its own input: ``x`` (N, ..., D), ``heads`` and
        ``kinds`` (N,) int64 (``kinds`` indexes ``READ_TYPES``) -> (N, ..., d), row n
        ``forward(x[n])[kinds[n]][..., heads[n], :]`` computing head ``heads[n]`` only."""
        H, d = self.n_head, self.d_head
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        S = _cast(self, self.basis, 1.0, dtype).view(-1, H, d).permute(1, 0, 2)[heads]  # (N, D, d)
        b = torch.bmm(x.flatten(1, -2), S)  # S_hᵀ x: (N, R, d)
        u = F.layer_norm(b, (d,), eps=self.eps)
        u = u * self.ln_weight.view(H, d)[heads, None] + self.ln_bias.view(H, d)[heads, None]
        A = torch.stack((self.A_Q, self.A_K, self.A_V))[kinds, heads]  # (N, d, d)
        bias = self.b_QKV.view(3, H, d)[kinds, heads]  # (N, d)
        return torch.baddbmm(bias[:, None], u, A.mT).view(*x.shape[:-1], d)

    def read_blocks(self) -> torch.Tensor:
        """S_h for every head, (head, d_model, d_head), float64."""
        return _blocks(self.basis, self.n_head, self.d_head)

    def block_maps(self, X: str) -> torch.Tensor:
        """A_X^h, (head, d_head, d_head)."""
        return {"Q": self.A_Q, "K": self.A_K, "V": self.A_V}[X]

    def read_maps(self, X: str) -> torch.Tensor:
        """W_X^h = A_X^h S_hᵀ, (head, d_head, d_model), float64."""
        return self.block_maps(X).double() @ self.read_blocks().mT

    def folded_read_maps(self, X: str) -> torch.Tensor:
        """A_X^h diag(γ_h) P_c^(d) S_hᵀ (docs §9.2): centering within the block, so the
        row space has dimension at most d − 1."""
        gamma = self.ln_weight.double().view(self.n_head, 1, self.d_head)
        w = self.block_maps(X).double() * gamma  # A_X diag(γ_h)
        w = w - w.mean(dim=-1, keepdim=True)  # · P_c^(d)
        return w @ self.read_blocks().mT


# --------------------------------------------------------------------------- frozen maps
@functools.lru_cache(maxsize=4)
def _family(d_model: int, d_head: int, n_members: int, m: int, r: int) -> BasisFamily:
    return build_basis_family(d_model, d_head, n_members, m=m, r=r)


def basis_family(cfg: ModelShape) -> BasisFamily | None:
    """The Kerdock ⊗ Haar family a model's frozen maps come from (built once per process,
    checks C2–C5 included), or None for geometries that use none. Its ``family_hash`` is
    the manifests' ``basis_family_hash`` (docs §5.7)."""
    p = cfg.geometry_params
    if "basis_members" not in p:
        return None
    return _family(cfg.d_model, cfg.d_head, p["basis_members"], p["basis_m"], p["basis_r"])


def member(cfg: ModelShape, i: int) -> torch.Tensor:
    """B_i as a float64 (D, D) tensor: its column blocks are B_i E_0 | ... | B_i E_{H−1}."""
    family = basis_family(cfg)
    if family is None:
        raise ValueError(f"geometry {cfg.geometry!r} uses no basis family")
    return torch.from_numpy(np.array(family.members[i]))


def diagonal_write_basis(cfg: ModelShape) -> torch.Tensor:
    """[E_0 diag(m) | ... ]: fixeddiag writes head-internal coordinates 0..w−1 of each head
    onto lane coordinates dh..dh+w−1 and discards the rest (docs §6.3, CHOICE "first")."""
    mask = (torch.arange(cfg.d_head) < cfg.geometry_params["write_width"]).to(torch.float64)
    return coordinate_blocks(cfg) * mask.repeat(cfg.n_head)


def sum_hub_routing(d_model: int, d_head: int, n_head: int) -> torch.Tensor:
    """Routing A, sum-hub (docs §6.5 CHOICE): with Λ = D/d lanes, heads h < Λ write E_h;
    hub head Λ + k writes (E_{sk} + ... + E_{sk+s−1})/sqrt(s), s = Λ/(H − Λ) (paper: 12
    lanes, 4 hubs of 3). Returns the unscaled (D, H·d) write columns."""
    lanes, hubs = d_model // d_head, n_head - d_model // d_head
    s = lanes // hubs
    W = torch.zeros(d_model, n_head, d_head, dtype=torch.float64)
    eye = torch.eye(d_head, dtype=torch.float64)
    for h in range(lanes):
        W[h * d_head : (h + 1) * d_head, h] = eye
    for k in range(hubs):
        for lane in range(s * k, s * (k + 1)):
            W[lane * d_head : (lane + 1) * d_head, lanes + k] = eye / math.sqrt(s)
    return W.reshape(d_model, n_head * d_head)


def split_cycle_routing(d_model: int, d_head: int, n_head: int) -> torch.Tensor:
    """Routing B, split-cycle (docs §6.5 CHOICE): half-head c = 2h + j (its internal dims
    j·d/2 .. (j+1)·d/2 − 1) is written to residual half-block c mod (2D/d), each half-block
    d/2 coordinates wide (paper: 32 half-heads onto 24 half-blocks)."""
    half, n_half_blocks = d_head // 2, 2 * d_model // d_head
    W = torch.zeros(d_model, n_head, 2, half, dtype=torch.float64)
    eye = torch.eye(half, dtype=torch.float64)
    for h in range(n_head):
        for j in range(2):
            t = (2 * h + j) % n_half_blocks
            W[t * half : (t + 1) * half, h, j] = eye
    return W.reshape(d_model, n_head * d_head)


def angle_split_routing(d_model: int, d_head: int, n_head: int, offset: int) -> torch.Tensor:
    """Routing C, angle-split (docs §6.5 CHOICE): head h writes
    cos θ_h E_{a(h)} + sin θ_h E_{b(h)}, a(h) = h mod Λ, b(h) = (h + offset) mod Λ,
    θ_h = (π/2)(h + 1)/(H + 1) (paper: Λ = 12, offset 5, H + 1 = 17)."""
    lanes = d_model // d_head
    W = torch.zeros(d_model, n_head, d_head, dtype=torch.float64)
    eye = torch.eye(d_head, dtype=torch.float64)
    for h in range(n_head):
        theta = 0.5 * math.pi * (h + 1) / (n_head + 1)
        a, b = h % lanes, (h + offset) % lanes
        W[a * d_head : (a + 1) * d_head, h] += math.cos(theta) * eye
        W[b * d_head : (b + 1) * d_head, h] += math.sin(theta) * eye
    return W.reshape(d_model, n_head * d_head)


# --------------------------------------------------------------------------- parameters
def _fail(cfg: ModelShape, message: str) -> None:
    raise ValueError(
        f"geometry {cfg.geometry!r} cannot exist at n_layer={cfg.n_layer}, n_head={cfg.n_head}, "
        f"d_model={cfg.d_model}, d_head={cfg.d_head}: {message}"
    )


def _param(cfg: ModelShape, given: Mapping, name: str, default: Any, ok, allowed: str) -> Any:
    value = given.get(name, default)
    if not ok(value):
        raise ValueError(
            f"geometry {cfg.geometry!r}: geometry_params.{name}={value!r} is not allowed; "
            f"expected {allowed}"
        )
    return value


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v > 0


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _lanes(cfg: ModelShape, given: Mapping) -> dict:
    if cfg.n_head * cfg.d_head != cfg.d_model:
        _fail(cfg, "its head blocks must tile the residual stream (n_head·d_head == d_model)")
    return {}


def _scale(cfg: ModelShape, given: Mapping, default: float | None = None) -> dict:
    g = write_scale(cfg) if default is None else default
    return {"write_scale": _param(cfg, given, "write_scale", g, _positive, "a number > 0")}


def _kerdock(needed: Callable[[ModelShape], int]) -> Callable[[ModelShape, Mapping], dict]:
    def params(cfg: ModelShape, given: Mapping) -> dict:
        _lanes(cfg, given)
        try:
            m, r = kerdock_shape(cfg.d_model, given.get("basis_m"), given.get("basis_r"))
        except ValueError as err:
            _fail(cfg, f"it needs a Kerdock ⊗ Haar basis family for D: {err}")
        available, need = 1 << (m - 1), needed(cfg)
        if need > available:
            _fail(
                cfg,
                f"it uses Kerdock members 0..{need - 1}, but the family for D={cfg.d_model} "
                f"with m={m}, r={r} has at most 2^(m-1) = {available} members",
            )
        default = 2 * cfg.n_layer if 2 * cfg.n_layer <= available else need
        n = _param(
            cfg,
            given,
            "basis_members",
            default,
            lambda v: _count(v) and need <= v <= available,
            f"an integer in [{need}, {available}] (members it uses .. 2^(m-1))",
        )
        return {"basis_m": m, "basis_r": r, "basis_members": n}

    return params


def _block(cfg: ModelShape, given: Mapping) -> dict:
    std = cfg.init_std * math.sqrt(cfg.d_model / cfg.d_head)
    return {"block_init_std": _param(cfg, given, "block_init_std", std, _positive, "> 0")}


def _fixeddiag(cfg: ModelShape, given: Mapping) -> dict:
    _lanes(cfg, given)
    w = _param(
        cfg,
        given,
        "write_width",
        (4 * cfg.d_head) // 5,
        lambda v: _count(v) and v <= cfg.d_head,
        f"an integer in [1, d_head={cfg.d_head}]",
    )
    mask = _param(cfg, given, "write_mask", "first", lambda v: v == "first", "'first'")
    scale = _scale(cfg, given, write_scale(cfg) * math.sqrt(cfg.d_head / w))
    return {"write_width": w, "write_mask": mask, **scale}


def _value_adapter(cfg: ModelShape, given: Mapping) -> dict:
    if "value_adapter_width" not in given and cfg.d_model % 2:
        _fail(cfg, "the value adapter is D/2 wide, so d_model must be even")
    width = _param(cfg, given, "value_adapter_width", cfg.d_model // 2, _count, "an integer >= 1")
    std = _param(cfg, given, "value_adapter_init_std", cfg.init_std, _positive, "> 0")
    layout = _param(
        cfg,
        given,
        "value_adapter_layout",
        "head-local",
        lambda v: v == "head-local",
        "'head-local'",
    )
    return {
        "value_adapter_width": width,
        "value_adapter_init_std": std,
        "value_adapter_layout": layout,
    }


def _routed(
    extra: Callable[[ModelShape, Mapping], dict],
) -> Callable[[ModelShape, Mapping], dict]:
    def params(cfg: ModelShape, given: Mapping) -> dict:
        if cfg.d_model % cfg.d_head:
            _fail(cfg, "routed writes use the D/d_head lanes E_h, so d_head must divide d_model")
        if cfg.n_head * cfg.d_head <= cfg.d_model:
            _fail(cfg, "a routed control has more head dimensions than the residual (H·d > D)")
        bias = _param(
            cfg, given, "attn_out_bias", False, lambda v: isinstance(v, bool), "true or false"
        )
        return {"attn_out_bias": bias, **extra(cfg, given), **_scale(cfg, given)}

    return params


def _sum_hub(cfg: ModelShape, given: Mapping) -> dict:
    lanes = cfg.d_model // cfg.d_head
    if lanes % (cfg.n_head - lanes):
        _fail(cfg, f"the {cfg.n_head - lanes} hub heads must split the {lanes} lanes evenly")
    return {}


def _split_cycle(cfg: ModelShape, given: Mapping) -> dict:
    if cfg.d_head % 2:
        _fail(cfg, "split-cycle halves every head, so d_head must be even")
    return {}


def _angle_split(cfg: ModelShape, given: Mapping) -> dict:
    lanes = cfg.d_model // cfg.d_head
    offset = _param(
        cfg,
        given,
        "angle_offset",
        5,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v % lanes != 0,
        f"an integer that is not a multiple of the {lanes} lanes (a(h) != b(h))",
    )
    return {"angle_offset": offset}


def _combine(*parts: Callable[[ModelShape, Mapping], dict]):
    def params(cfg: ModelShape, given: Mapping) -> dict:
        out: dict[str, Any] = {}
        for part in parts:
            out.update(part(cfg, given))
        return out

    return params


# --------------------------------------------------------------------------- factories
#: A frozen basis of :func:`frozen_bases`: the coordinate blocks E_h, or a family member index.
AXIS = "axis"


def _axis_writes(cfg: ModelShape) -> dict[str, list]:
    return {"write": [AXIS] * cfg.n_layer}


def _common_writes(cfg: ModelShape) -> dict[str, list]:
    return {"write": [0] * cfg.n_layer}


def _rotated_writes(cfg: ModelShape) -> dict[str, list]:
    return {"write": list(range(cfg.n_layer))}


def _axis_reads(cfg: ModelShape) -> dict[str, list]:
    return {"read": [AXIS] * cfg.n_layer}


def _all_common_axis_bases(cfg: ModelShape) -> dict[str, list]:
    return {**_axis_writes(cfg), **_axis_reads(cfg)}


def _all_rotated_bases(cfg: ModelShape) -> dict[str, list]:
    return {**_rotated_writes(cfg), "read": [cfg.n_layer + i for i in range(cfg.n_layer)]}


def _all_rotated_self_bases(cfg: ModelShape) -> dict[str, list]:
    return {**_rotated_writes(cfg), "read": list(range(cfg.n_layer))}


def _basis(cfg: ModelShape, role: str, layer: int) -> torch.Tensor:
    """The frozen basis ``role`` ("write" or "read") of ``layer`` (docs §5.6)."""
    which = frozen_bases(cfg)[role][layer]
    return coordinate_blocks(cfg) if which == AXIS else member(cfg, which)


def _frozen(cfg: ModelShape, basis: torch.Tensor) -> FrozenWriter:
    p = cfg.geometry_params
    return FrozenWriter(cfg, basis, p["write_scale"], bias=p.get("attn_out_bias", True))


def _learned(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    return FreeReader(cfg), LearnedWriter(cfg)


def _frozen_writes(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    """write-common-axis, write-common, write-rotated (and the axis variants): free readers."""
    return FreeReader(cfg), _frozen(cfg, _basis(cfg, "write", layer))


def _read_common(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    return BlockReader(cfg, _basis(cfg, "read", layer)), LearnedWriter(cfg)


def _frozen_reads_and_writes(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    """all-common-axis, all-rotated, all-rotated-self: block readers and frozen writes."""
    reader = BlockReader(cfg, _basis(cfg, "read", layer))
    return reader, _frozen(cfg, _basis(cfg, "write", layer))


def _fixeddiag_geometry(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    return FreeReader(cfg), _frozen(cfg, diagonal_write_basis(cfg))


def _value384(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    return ValueAdapterReader(cfg), _frozen(cfg, _basis(cfg, "write", layer))


def _write_routed_a(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    return FreeReader(cfg), _frozen(cfg, sum_hub_routing(cfg.d_model, cfg.d_head, cfg.n_head))


def _write_routed_b(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    basis = split_cycle_routing(cfg.d_model, cfg.d_head, cfg.n_head)
    return FreeReader(cfg), _frozen(cfg, basis)


def _write_routed_c(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    offset = cfg.geometry_params["angle_offset"]
    basis = angle_split_routing(cfg.d_model, cfg.d_head, cfg.n_head, offset)
    return FreeReader(cfg), _frozen(cfg, basis)


# --------------------------------------------------------------------------- sizing
class SizeError(ValueError):
    """Why a geometry cannot exist at a base architecture (the zoo adds the name and size)."""


def _base_size(arch: Mapping[str, Any]) -> dict[str, Any]:
    """Most geometries take the study's base architecture as it is."""
    return dict(arch)


def _wider_mlp(arch: Mapping[str, Any]) -> dict[str, Any]:
    """mlp3456: the MLP grows by D/2 (paper: 3072 + 384 = 3456) to match learned's count."""
    if arch["d_model"] % 2:
        raise SizeError("the MLP grows by D/2, so d_model must be even")
    return {**arch, "d_mlp": arch["d_mlp"] + arch["d_model"] // 2}


def _routed_heads(arch: Mapping[str, Any]) -> dict[str, Any]:
    """write-routed-a/b/c: n_head = 4H/3 heads (paper: 16) writing into the H lanes."""
    H = arch["n_head"]
    if H % 3 or H * arch["d_head"] != arch["d_model"]:
        raise SizeError(
            "a routed control has 4H/3 heads writing into the H lanes of width d_head, "
            "so 3 must divide n_head and n_head·d_head must equal d_model"
        )
    return {**arch, "n_head": 4 * H // 3}


def _multiscreen_size(arch: Mapping[str, Any]) -> dict[str, Any]:
    """multiscreen-*: 4H/3 tiles of width d, d_model = n_head·d, 7L/4 layers and key width
    d/4 (paper: 16 tiles, D = 1024, 21 layers, d_key = 16; docs §6.6). No MLP width."""
    L, H, d = arch["n_layer"], arch["n_head"], arch["d_head"]
    if H % 3 or L % 4 or d % 4:
        raise SizeError(
            "a multiscreen control has 4H/3 tiles of width d, 7L/4 layers and key width d/4, "
            "so 3 must divide n_head, 4 n_layer and 4 d_head (paper: 12, 12, 64)"
        )
    n_head = 4 * H // 3
    return {
        "n_ctx": arch["n_ctx"],
        "n_layer": 7 * L // 4,
        "n_head": n_head,
        "d_model": n_head * d,
        "d_head": d,
        "d_key": d // 4,
    }


# --------------------------------------------------------------------------- registry
GeometryFactory = Callable[[ModelShape, int], tuple[nn.Module, nn.Module]]
ParamsFn = Callable[[ModelShape, Mapping], dict]
SizeFn = Callable[[Mapping[str, Any]], dict[str, Any]]


def _no_params(cfg: ModelShape, given: Mapping) -> dict:
    return {}


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """One geometry of the study, everything the rest of the code may ask about it.

    * ``name`` — the study's name (config ``models.<m>.geometry``, the schema's enum); its
      facts (architecture, reader kind, shared LN_1, GPT-2 form, baseline) are
      :data:`headgeom.model.facts.FACTS`'s, read through the properties below;
    * ``config_geometry`` — the ``geometry`` its model config stores, when not ``name``
      (a multiscreen model config names the write geometry inside its tiles);
    * ``build`` — GPT only: the factory ``(cfg, layer) -> (reader, writer)`` a block is given;
    * ``params`` — GPT only: ``params(cfg, given)`` returns every parameter and labelled
      choice the geometry uses, defaults filled and values checked; it raises ValueError
      when the geometry cannot exist at ``cfg``'s size;
    * ``size`` — the sizing rule: the study's base architecture -> this geometry's sizes
      (raises :class:`SizeError`);
    * ``frozen_bases`` — GPT only: ``cfg -> {"write": [...], "read": [...]}``, per layer the
      frozen basis its writes and block readers use (:data:`AXIS` or a family member,
      docs §5.6); the factory builds from it, and the designed-PK check (§9.4) and the basis
      family record (§5.5 item 6) read it. Absent roles are learned (or not a plain basis).
    """

    name: str
    config_geometry: str | None = None
    build: GeometryFactory | None = None
    params: ParamsFn = _no_params
    size: SizeFn = _base_size
    frozen_bases: Callable[[ModelShape], dict[str, list]] | None = None

    @property
    def facts(self) -> GeometryFacts:
        return facts.facts(self.name)

    @property
    def architecture(self) -> str:
        return self.facts.architecture

    @property
    def reader(self) -> ReaderKind:
        return self.facts.reader

    @property
    def shared_ln1(self) -> bool:
        return self.facts.shared_ln1

    @property
    def gpt2_form(self) -> bool:
        return self.facts.gpt2_form

    @property
    def baseline(self) -> bool:
        return self.facts.baseline

    @property
    def stored_geometry(self) -> str:
        """The ``geometry`` value of this geometry's model configs."""
        return self.name if self.config_geometry is None else self.config_geometry


_AXIS = _combine(_lanes, _scale)
#: Softmax-free controls (docs §6.6): ``headgeom.model.multiscreen`` builds their tiles.
_MULTISCREEN = {"size": _multiscreen_size}

#: Every geometry of the study, in the order of the config schema's enum. Adding a geometry
#: is one record here and its facts in headgeom.model.facts (plus its factory above, or its
#: architecture's own modules).
GEOMETRIES: Mapping[str, Geometry] = MappingProxyType(
    {
        g.name: g
        for g in (
            Geometry(name="learned", build=_learned),
            Geometry(name="write-common-axis", build=_frozen_writes, params=_AXIS,
                     frozen_bases=_axis_writes),
            Geometry(name="write-common", build=_frozen_writes,
                     params=_combine(_kerdock(lambda c: 1), _scale),
                     frozen_bases=_common_writes),
            Geometry(name="write-rotated", build=_frozen_writes,
                     params=_combine(_kerdock(lambda c: c.n_layer), _scale),
                     frozen_bases=_rotated_writes),
            Geometry(name="read-common", build=_read_common, params=_combine(_lanes, _block),
                     frozen_bases=_axis_reads),
            Geometry(name="all-common-axis", build=_frozen_reads_and_writes,
                     params=_combine(_AXIS, _block), frozen_bases=_all_common_axis_bases),
            Geometry(name="all-rotated", build=_frozen_reads_and_writes,
                     params=_combine(_kerdock(lambda c: 2 * c.n_layer), _scale, _block),
                     frozen_bases=_all_rotated_bases),
            Geometry(name="all-rotated-self", build=_frozen_reads_and_writes,
                     params=_combine(_kerdock(lambda c: c.n_layer), _scale, _block),
                     frozen_bases=_all_rotated_self_bases),
            Geometry(name="fixeddiag", build=_fixeddiag_geometry, params=_fixeddiag),
            Geometry(name="identity-original", build=_frozen_writes,
                     params=_combine(_lanes, lambda c, g: _scale(c, g, 1.0)),
                     frozen_bases=_axis_writes),
            Geometry(name="value384", build=_value384, params=_combine(_AXIS, _value_adapter),
                     frozen_bases=_axis_writes),
            Geometry(name="mlp3456", build=_frozen_writes, params=_AXIS, size=_wider_mlp,
                     frozen_bases=_axis_writes),
            Geometry(name="write-routed-a", build=_write_routed_a, params=_routed(_sum_hub),
                     size=_routed_heads),
            Geometry(name="write-routed-b", build=_write_routed_b,
                     params=_routed(_split_cycle), size=_routed_heads),
            Geometry(name="write-routed-c", build=_write_routed_c,
                     params=_routed(_angle_split), size=_routed_heads),
            Geometry(name="multiscreen-learned", config_geometry="learned", **_MULTISCREEN),
            Geometry(name="multiscreen-identity", config_geometry="write-common-axis",
                     **_MULTISCREEN),
        )
    }
)  # fmt: skip


def block_geometry(name: str) -> Geometry:
    """The geometry a GPT block of ``ModelConfig(geometry=name)`` is built with."""
    spec = GEOMETRIES.get(name)
    if spec is None or spec.build is None:
        known = sorted(g.name for g in GEOMETRIES.values() if g.build is not None)
        raise ValueError(f"unknown geometry {name!r}; known: {known}")
    return spec


def resolve_geometry_params(cfg: ModelShape) -> dict[str, Any]:
    """``cfg.geometry_params`` with every default of its geometry filled (sorted keys)."""
    spec = block_geometry(cfg.geometry)
    given = dict(cfg.geometry_params)
    params = spec.params(cfg, given)
    unknown = set(given) - set(params)
    if unknown:
        raise ValueError(
            f"geometry {cfg.geometry!r} takes no geometry_params {sorted(unknown)}; "
            f"it takes {sorted(params) or 'none'}"
        )
    return dict(sorted(params.items()))


def frozen_bases(cfg: ModelShape) -> dict[str, list]:
    """Per role ("write", "read") and layer, the frozen basis of ``cfg``'s geometry:
    :data:`AXIS` or a member index of its basis family; {} for a geometry with none."""
    spec = block_geometry(cfg.geometry)
    return {} if spec.frozen_bases is None else spec.frozen_bases(cfg)


def make_geometry(cfg: ModelShape, layer: int) -> tuple[nn.Module, nn.Module]:
    """The (reader, writer) pair of block ``layer``."""
    return block_geometry(cfg.geometry).build(cfg, layer)
