"""The three matched SA-MoE architectures (SAMOE §5, paper §3): Ordinary MoE, latest-write-only
(LWO) and Persistent (P), each the workspace GPT (``headgeom.model.gpt``: pre-LN LayerNorm,
learned positions, tied unembedding) with every dense MLP replaced by an MoE block.

One block, SAMOE E1/E2 (l = layer, x_l = LN_2(m_l) the router and expert input)::

    m_l     = h_l + Attn_l(h_l)
    z_l     = W^x_l x_l + W^s_l s_l            (Ordinary: W^x_l x_l; bias-free)
    S_l     = Top_k(z_l)                      (ties to the lower expert index)
    y_l     = F^sh_l(x_l) + Σ_{e∈S_l} g_{l,e} F_{l,e}(x_l),  g = softmax(z_l)_e (not renormalised)
    h_{l+1} = m_l + y_l
    u_l     = tanh(A_l q_l + a_l),  q_l = y_l (``write_input: moe_output``) or h_{l+1}
    P:   s_{l+1} = clip(s_l + u_l, −c, c)      LWO: s_{l+1} = u_l        s_0 = 0

Only routers read the state (experts and attention never do); the last layer's write head is
kept (nothing reads its write). Dropless: every token runs the shared expert and its k
routed experts.

Named sites (SAMOE §9), each with explicit axes in ``SITE_AXES``; attached with the GPT's own
mechanism, ``model.hooks({site: fn})`` (``fn(activation) -> activation | None``):

* ``blocks.{l}.hook_attn_out``       a_l
* ``blocks.{l}.hook_router_in``      x_l (also what the experts read)
* ``blocks.{l}.hook_state_in``       s_l                       (state variants)
* ``blocks.{l}.hook_router_logits``  z_l
* ``blocks.{l}.hook_shared_out``     F^sh_l(x_l)
* ``blocks.{l}.hook_routed_out``     Σ_e g_{l,e} F_{l,e}(x_l)
* ``blocks.{l}.hook_write_proposal`` u_l                       (state variants)
* ``blocks.{l}.hook_state_out``      s_{l+1}: the suppression site (state variants)
* ``hook_resid_final``               h_N before the final LayerNorm
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from headgeom.model.config import ModelConfig
from headgeom.model.geometries import make_geometry
from headgeom.model.gpt import GPT, MLP, Attention, HookPoint
from headgeom.samoe.config import STATE_VARIANTS, MoEConfig, check_variant

SITE_AXES: dict[str, tuple[str, ...]] = {
    "hook_attn_out": ("batch", "position", "d_model"),
    "hook_router_in": ("batch", "position", "d_model"),
    "hook_state_in": ("batch", "position", "state"),
    "hook_router_logits": ("batch", "position", "expert"),
    "hook_shared_out": ("batch", "position", "d_model"),
    "hook_routed_out": ("batch", "position", "d_model"),
    "hook_write_proposal": ("batch", "position", "state"),
    "hook_state_out": ("batch", "position", "state"),
    "hook_resid_final": ("batch", "position", "d_model"),
}
#: Sites only the state variants have.
STATE_SITES = ("hook_state_in", "hook_write_proposal", "hook_state_out")


def site(layer: int, name: str) -> str:
    """Full name of a per-block site: ``site(3, "hook_state_out") == "blocks.3.hook_state_out"``."""
    if name not in SITE_AXES or name == "hook_resid_final":
        raise KeyError(f"unknown SA-MoE block site {name!r}; known: {sorted(SITE_AXES)}")
    return f"blocks.{layer}.{name}"


# --------------------------------------------------------------------------- routing
def top_k(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits of ``z`` (..., E) and their expert ids, best first, equal logits
    ranked by the lower expert index (SAMOE §5.1). A stable descending sort keeps equal
    entries in index order; ``torch.topk`` promises no order among ties."""
    logits, ids = torch.sort(z, dim=-1, descending=True, stable=True)
    return ids[..., :k], logits[..., :k]  # (..., k) each


def gate_weights(z: torch.Tensor, ids: torch.Tensor, gate: str) -> torch.Tensor:
    """g (..., k) for the selected ``ids`` (..., k) of logits ``z`` (..., E): the softmax over
    all E experts kept for the selected ones (SAMOE §5.1 [CHOICE]), optionally renormalised."""
    g = torch.softmax(z, dim=-1).gather(-1, ids)
    if gate == "softmax_topk_renormalised":
        g = g / g.sum(-1, keepdim=True)
    return g


class Router(nn.Module):
    """Bias-free linear router, stored as the column blocks W^x (E, d) and W^s (E, r) of
    SAMOE §0 so the ledger reads W^s directly; ``W_s`` is None for the Ordinary router."""

    def __init__(self, d_model: int, n_experts: int, state_dim: int | None):
        super().__init__()
        self.W_x = nn.Parameter(torch.zeros(n_experts, d_model))
        self.W_s = None if state_dim is None else nn.Parameter(torch.zeros(n_experts, state_dim))

    def forward(self, x: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
        # Two products, not one over [x; s]: with s = 0 the sum is bitwise W^x x (adding an
        # exact zero), whatever blocking the kernel picks for width d versus d + r.
        z = x @ self.W_x.T  # (B, T, d) -> (B, T, E)
        if self.W_s is not None:
            z = z + s @ self.W_s.T  # (B, T, r) -> (B, T, E)
        return z


class MoE(nn.Module):
    """One shared and E routed experts, all with the dense MLP's geometry (SAMOE §5.1):
    ``make_expert()`` builds one (the workspace GPT's ``MLP``, a Hub family's gated MLP)."""

    def __init__(
        self, d_model: int, moe: MoEConfig, state_dim: int | None,
        make_expert: Callable[[], nn.Module],
    ):  # fmt: skip
        super().__init__()
        self.top_k, self.gate = moe.top_k, moe.gate
        self.shared = make_expert()
        self.experts = nn.ModuleList(make_expert() for _ in range(moe.n_experts))
        self.router = Router(d_model, moe.n_experts, state_dim)

    def routed(self, x: torch.Tensor, ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Σ_{e ∈ S} g_e F_e(x) (B, T, d): dropless, each expert runs only its own tokens."""
        flat = x.reshape(-1, x.shape[-1])  # (N, d), N = B·T
        ids, g = ids.reshape(-1, ids.shape[-1]), g.reshape(-1, g.shape[-1])  # (N, k)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            hit = ids == e  # (N, k); at most one slot per token
            tok = hit.any(-1).nonzero(as_tuple=True)[0]  # (n_e,)
            if tok.numel():
                w = (g[tok] * hit[tok]).sum(-1, keepdim=True)  # (n_e, 1)
                out.index_add_(0, tok, (w * expert(flat[tok])).to(out.dtype))  # bf16 autocast
        return out.view_as(x)


def load_balance_loss(z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Switch load balancing E Σ_e f_e P_e (SAMOE §5.3 [CHOICE]) of logits z (..., E) and
    selections ids (..., k): f_e = share of the N·k assignments going to e, P_e = mean
    router probability of e; 1 when both are uniform."""
    E = z.shape[-1]
    probs = torch.softmax(z.reshape(-1, E), dim=-1)  # (N, E)
    counts = F.one_hot(ids.reshape(-1), E).sum(0).to(probs.dtype)  # (E,)
    return E * (counts / counts.sum() * probs.mean(0)).sum()


def z_loss(z: torch.Tensor) -> torch.Tensor:
    """Router z-loss mean(logsumexp(z)²) over decisions (SAMOE §5.3 [CHOICE], ST-MoE)."""
    return torch.logsumexp(z, dim=-1).pow(2).mean()


# --------------------------------------------------------------------------- state
def persistent_update(s: torch.Tensor, u: torch.Tensor, clamp: float) -> torch.Tensor:
    """P: s_{l+1} = clip(s_l + u_l, −c, c) (SAMOE E2)."""
    return torch.clamp(s + u, -clamp, clamp)


def latest_update(s: torch.Tensor, u: torch.Tensor, clamp: float) -> torch.Tensor:
    """LWO: s_{l+1} = u_l, the same head with replacement (SAMOE E2; |s| ≤ 1 by tanh)."""
    return u


#: The state recurrence of each state variant: (s_l, u_l, c) -> s_{l+1}.
STATE_UPDATES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "latest": latest_update,
    "persistent": persistent_update,
}


class WriteHead(nn.Module):
    """u_l = tanh(A_l q_l + a_l), A_l (r, d) and a_l zero-initialised (SAMOE §5.2)."""

    def __init__(self, d_model: int, state_dim: int):
        super().__init__()
        self.proj = nn.Linear(d_model, state_dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(q))  # (B, T, d) -> (B, T, r)


# --------------------------------------------------------------------------- block, model
@dataclass
class LayerAux:
    """The unweighted auxiliary losses of one layer (scalars)."""

    load_balance: torch.Tensor
    z_loss: torch.Tensor


class MoEStep(nn.Module):
    """What every SA-MoE block adds to its host layer, whatever computes m_l and x_l (the
    workspace GPT's ``Block``, a Hub decoder layer): the routed mixture y_l of x_l under
    s_l, and the state step s_l -> s_{l+1}. Owns ``moe``, ``write`` and the SAMOE §9 sites
    (``hook_attn_out`` is the host's to apply). A host registers its own modules first, then
    calls ``add_moe`` (the registration order is the state dict's and the optimizer's).
    A host also names its ``router_norm`` (m_l -> x_l) and its ``post_norms`` (on a_l and on
    y_l before each joins the residual, None where it joins as is)."""

    def add_moe(
        self, d_model: int, moe: MoEConfig, variant: str, make_expert: Callable[[], nn.Module]
    ) -> None:
        stateful = variant in STATE_VARIANTS
        self.variant, self.clamp, self.write_input = variant, moe.clamp, moe.write_input
        self.moe = MoE(d_model, moe, moe.state_dim if stateful else None, make_expert)
        self.write = WriteHead(d_model, moe.state_dim) if stateful else None
        for name in SITE_AXES:
            if name != "hook_resid_final" and (stateful or name not in STATE_SITES):
                setattr(self, name, HookPoint())

    def mix(self, x: torch.Tensor, s: torch.Tensor | None) -> tuple[torch.Tensor, LayerAux]:
        """(x_l, s_l) -> (y_l, aux): x (B, T, d) the router and expert input, s (B, T, r)."""
        x = self.hook_router_in(x)
        if self.write is not None:
            s = self.hook_state_in(s)
        z = self.hook_router_logits(self.moe.router(x, s))  # (B, T, E)
        ids, _ = top_k(z, self.moe.top_k)  # (B, T, k)
        g = gate_weights(z, ids, self.moe.gate)
        y = self.hook_shared_out(self.moe.shared(x)) + self.hook_routed_out(
            self.moe.routed(x, ids, g)
        )
        return y, LayerAux(load_balance_loss(z, ids), z_loss(z))

    def step_state(
        self, s: torch.Tensor | None, y: torch.Tensor, h_next: torch.Tensor
    ) -> torch.Tensor | None:
        """s_{l+1} from s_l and the write u_l of q_l (y_l or h_{l+1}); None for Ordinary."""
        if self.write is None:
            return None
        q = y if self.write_input == "moe_output" else h_next
        u = self.hook_write_proposal(self.write(q))
        return self.hook_state_out(STATE_UPDATES[self.variant](s, u, self.clamp))


class Block(MoEStep):
    def __init__(self, cfg: ModelConfig, moe: MoEConfig, variant: str, layer: int):
        super().__init__()
        self.attn = Attention(cfg, *make_geometry(cfg, layer))
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.add_moe(cfg.d_model, moe, variant, lambda: MLP(cfg))

    @property
    def router_norm(self) -> nn.Module:
        """The norm that maps m_l to x_l."""
        return self.ln_2

    #: The norms applied to a_l and y_l before they join the residual (none here).
    post_norms: tuple[nn.Module | None, nn.Module | None] = (None, None)

    def forward(
        self, h: torch.Tensor, s: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, LayerAux]:
        """(h_l, s_l) -> (h_{l+1}, s_{l+1}, aux): h (B, T, d), s (B, T, r) or None."""
        m = h + self.hook_attn_out(self.attn(h))
        y, aux = self.mix(self.ln_2(m), s)
        h_next = m + y
        return h_next, self.step_state(s, y, h_next), aux


@dataclass
class Aux:
    """Auxiliary losses averaged over layers (SAMOE §5.3), unweighted: the recipe applies
    the coefficients (``CPTConfig.aux``)."""

    load_balance: torch.Tensor
    z_loss: torch.Tensor


class MoEModel(nn.Module):
    """What every SA-MoE model offers the analyses, whatever its host (``SAMoE`` here, the Hub
    wrap ``headgeom.samoe.hub.HubSAMoE``): ``blocks`` of ``MoEStep``, the SAMOE §9 sites
    through ``hooks``, ``wte`` (its dtype is the forward's), ``n_ctx``, ``moe_cfg``, ``variant``
    and the dense state-dict name each parameter is upcycled from."""

    # The GPT's site mechanism, reused as is (it only walks ``named_modules``).
    hook_points = GPT.hook_points
    hooks = GPT.hooks
    blocks: nn.ModuleList
    moe_cfg: MoEConfig
    variant: str

    @property
    def has_state(self) -> bool:
        return self.variant in STATE_VARIANTS

    def initial_state(self, ids: torch.Tensor) -> torch.Tensor | None:
        """s_0 = 0 (B, T, r) in the forward dtype (SAMOE §5.2), None for Ordinary."""
        if not self.has_state:
            return None
        B, T = ids.shape
        return self.wte.weight.new_zeros(B, T, self.moe_cfg.state_dim)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """h_0 (B, T, d): what the first layer reads."""
        raise NotImplementedError

    def check_length(self, ids: torch.Tensor) -> None:
        if ids.shape[1] > self.n_ctx:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds the context {self.n_ctx}")

    @staticmethod
    def mean_aux(auxes: list[LayerAux]) -> Aux:
        n = len(auxes)
        return Aux(load_balance=sum(a.load_balance for a in auxes) / n,
                   z_loss=sum(a.z_loss for a in auxes) / n)  # fmt: skip

    def routers(self) -> list[Router]:
        return [block.moe.router for block in self.blocks]

    def n_params(self) -> int:
        """Trainable parameters, tied embedding counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def dense_mlp(self, layer: int) -> str:
        """The dense state-dict prefix of layer ``layer``'s MLP (what its experts copy)."""
        return f"blocks.{layer}.mlp."

    def dense_name(self, name: str) -> str:
        """The dense state-dict entry parameter ``name`` is upcycled from (``name`` itself
        for everything outside the MoE block)."""
        parts = name.split(".")
        kind = param_kind(name)
        if kind == "shared":  # blocks.l.moe.shared.X -> <dense mlp of l>.X
            return self.dense_mlp(int(parts[1])) + ".".join(parts[4:])
        if kind == "routed":  # blocks.l.moe.experts.e.X -> <dense mlp of l>.X
            return self.dense_mlp(int(parts[1])) + ".".join(parts[5:])
        return name


class SAMoE(MoEModel):
    """One SA-MoE variant of the workspace GPT. Build it empty here, fill it with
    ``headgeom.samoe.upcycle``."""

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, variant: str):
        super().__init__()
        self.cfg, self.moe_cfg, self.variant = cfg, moe, check_variant(variant)
        self.wte = nn.Embedding(cfg.n_vocab, cfg.d_model)  # tied unembedding
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, moe, variant, layer) for layer in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.hook_resid_final = HookPoint()

    @property
    def n_ctx(self) -> int:
        return self.cfg.n_ctx

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))

    def forward(
        self, ids: torch.Tensor, return_aux: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, Aux]:
        """Logits (B, T, V) of ids (B, T); with ``return_aux`` also the layer-mean aux losses."""
        self.check_length(ids)
        h = self.embedding(ids)
        s = self.initial_state(ids)
        auxes = []
        for block in self.blocks:
            h, s, aux = block(h, s)
            auxes.append(aux)
        logits = self.ln_f(self.hook_resid_final(h)) @ self.wte.weight.T  # (B, T, V)
        return (logits, self.mean_aux(auxes)) if return_aux else logits


#: What each parameter is, by name (init manifest groups, SAMOE §2; LR groups, §7).
PARAM_KINDS = ("shared", "routed", "router", "write", "other")


def param_kind(name: str) -> str:
    """The kind of parameter ``name`` of an SA-MoE state dict (one of ``PARAM_KINDS``)."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 3:
        if parts[2] == "moe" and parts[3] in ("shared", "router"):
            return parts[3]
        if parts[2] == "moe" and parts[3] == "experts":
            return "routed"
        if parts[2] == "write":
            return "write"
    return "other"
