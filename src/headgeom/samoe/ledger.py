"""The routing ledger (SAMOE §10, paper §3, App. C.1–C.3), computed from a clean capture.

For a target (batch b, position t, layer L) with clean boundary pair (e2, e3) — the last
selected and the best excluded expert — and ω = W^s_L[e2] − W^s_L[e3] (SAMOE E3)::

    z_L[e2] − z_L[e3] = (W^x_L[e2] − W^x_L[e3])ᵀ x_L  +  Σ_{l<L} c_{l→L},   c_{l→L} = ωᵀ Δ_l
                        hidden stream (not audited)     state term ωᵀ s_L (s_0 = 0)

Exact in algebra for any recorded recurrence, because Δ_l = s_{l+1} − s_l is the realised
post-clamp write: clamping keeps the identity. Contributions are zero-padded to N layers;
``eligible`` marks l < L (every earlier write is a source: target L has L sources).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headgeom.samoe import checks
from headgeom.samoe.capture import Capture
from headgeom.samoe.model import STATE_UPDATES, MoEModel


@dataclass(frozen=True)
class Targets:
    """Audited decisions: int64 tensors (n,) of batch row, position and target layer."""

    batch: torch.Tensor
    position: torch.Tensor
    layer: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("batch", "position", "layer"):
            value = getattr(self, name)  # a tensor keeps its device, anything else: the default
            device = value.device if isinstance(value, torch.Tensor) else None
            object.__setattr__(self, name, torch.as_tensor(value, dtype=torch.long, device=device))
        if not self.batch.shape == self.position.shape == self.layer.shape:
            raise ValueError("targets: batch, position and layer need one shape (n,)")

    def __len__(self) -> int:
        return len(self.batch)

    def to(self, device: torch.device) -> Targets:
        """The same targets on ``device`` (the same tensors when already there)."""
        return Targets(*(v.to(device) for v in (self.batch, self.position, self.layer)))


def boundary_pair(cap: Capture, targets: Targets) -> tuple[torch.Tensor, torch.Tensor]:
    """The clean (e2, e3) of each target (n,) each: rank 2 (selected) and 3 (excluded)."""
    targets = targets.to(cap.logits.device)
    b, t = cap.where(targets.batch, targets.position)
    ranked = cap.top_ids[targets.layer, b, t]  # (n, 3)
    return ranked[:, 1], ranked[:, 2]


def router_blocks(model: MoEModel, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W^x (N, E, d) and W^s (N, E, r) (None for Ordinary), cast to ``dtype``."""
    routers = model.routers()
    w_x = torch.stack([r.W_x.detach() for r in routers]).to(dtype)
    if not model.has_state:
        return w_x, None
    return w_x, torch.stack([r.W_s.detach() for r in routers]).to(dtype)


@dataclass
class Ledger:
    """The ledger of n targets (SAMOE E3); every tensor in the capture's dtype."""

    e2: torch.Tensor  # (n,)
    e3: torch.Tensor  # (n,)
    contributions: torch.Tensor  # (n, N): c_{l→L}, 0 where l ≥ L
    eligible: torch.Tensor  # (n, N) bool: l < L
    state_term: torch.Tensor  # (n,): ωᵀ s_L
    hidden_term: torch.Tensor  # (n,): (W^x_L[e2] − W^x_L[e3])ᵀ x_L
    margin: torch.Tensor  # (n,): clean z_L[e2] − z_L[e3] (≥ 0)
    write_norm: torch.Tensor  # (n, N): ‖Δ_l‖₂ at the target token, 0 where l ≥ L


def ledger(model: MoEModel, cap: Capture, targets: Targets) -> Ledger:
    """Contributions c_{l→L} of every earlier write to each target's boundary margin."""
    if cap.state is None:
        raise ValueError("the routing ledger needs a state variant (latest or persistent)")
    dtype, device = cap.logits.dtype, cap.logits.device
    w_x, w_s = router_blocks(model, dtype)
    targets = targets.to(device)
    (b, t), L = cap.where(targets.batch, targets.position), targets.layer
    e2, e3 = boundary_pair(cap, targets)
    omega = w_s[L, e2] - w_s[L, e3]  # (n, r)
    delta = cap.delta[:, b, t].transpose(0, 1)  # (N, n, r) -> (n, N, r)
    N = cap.n_layer
    eligible = torch.arange(N, device=device)[None, :] < L[:, None]  # (n, N)
    c = torch.einsum("nr,nlr->nl", omega, delta) * eligible
    state_L = cap.state[L, b, t]  # (n, r)
    z_L = cap.logits[L, b, t]  # (n, E)
    ar = torch.arange(len(targets), device=device)
    return Ledger(
        e2=e2,
        e3=e3,
        contributions=c,
        eligible=eligible,
        state_term=(omega * state_L).sum(-1),
        hidden_term=((w_x[L, e2] - w_x[L, e3]) * cap.router_in[L, b, t]).sum(-1),
        margin=z_L[ar, e2] - z_L[ar, e3],
        write_norm=delta.norm(dim=-1) * eligible,
    )


# --------------------------------------------------------------------------- checks
def reconstruction_residual(led: Ledger) -> float:
    """K6: max |Σ_l c_{l→L} − ωᵀ s_L| over the targets (SAMOE §10.4)."""
    return float((led.contributions.sum(-1) - led.state_term).abs().max())


def margin_residual(led: Ledger) -> float:
    """max |hidden + Σ_l c − (z[e2] − z[e3])|: the whole of E3 against the clean logits."""
    return float((led.hidden_term + led.contributions.sum(-1) - led.margin).abs().max())


def logit_reconstruction_residual(model: MoEModel, cap: Capture) -> float:
    """K7: max |W^x x + W^s s − z| over every decision of the capture (SAMOE §10.4)."""
    w_x, w_s = router_blocks(model, cap.logits.dtype)
    z = torch.einsum("lbtd,led->lbte", cap.router_in, w_x)
    if w_s is not None:
        z = z + torch.einsum("lbtr,ler->lbte", cap.state[:-1], w_s)
    return float((z - cap.logits).abs().max())


def check_ledger(model: MoEModel, cap: Capture, led: Ledger, ledger_tol: float = 1e-4,
                 logit_tol: float = 1e-5, logit_residual: float | None = None) -> dict:  # fmt: skip
    """K6 and K7 (SAMOE §10.4, §20), raising ``CheckFailed`` with residual and tolerance.
    K7 is over every decision of ``cap``, or ``logit_residual`` when given (the maximum of
    :func:`logit_reconstruction_residual` over a pool's chunks, ``cap`` a token capture)."""
    if logit_residual is None:
        logit_residual = logit_reconstruction_residual(model, cap)
    return {
        **checks.enforce("K6", reconstruction_residual(led), ledger_tol,
                         what="ledger |Σ c − ωᵀ s_L|"),
        **checks.enforce("K7", logit_residual, logit_tol,
                         what="logits |W^x x + W^s s − z|"),
    }  # fmt: skip


# --------------------------------------------------------------------------- LWO
def structural_attribution(led: Ledger, targets: Targets) -> torch.Tensor:
    """LWO's native attribution (SAMOE §10.2): all of ωᵀ s_L to source L − 1, exactly 0 to
    every earlier source ("no direct path through the current state"). (n, N)."""
    out = torch.zeros_like(led.contributions)
    targets = targets.to(out.device)
    has_source = targets.layer >= 1
    rows = torch.arange(len(targets), device=out.device)[has_source]
    out[rows, targets.layer[has_source] - 1] = led.state_term[has_source]
    return out


# --------------------------------------------------------------------------- E4
@dataclass
class History:
    """Distributed-history metrics of the kept targets (SAMOE E4; A = 0 dropped)."""

    kept: torch.Tensor  # (n,) bool: A > 0
    mass: torch.Tensor  # (m,) A = Σ_l |c_l|
    share: torch.Tensor  # (m, N) p_l = |c_l| / A (0 where l ≥ L)
    non_recent: torch.Tensor  # (m,) NR = 1 − p_{L−1}
    ess: torch.Tensor  # (m,) 1 / Σ p_l² (inverse participation ratio)
    max_share: torch.Tensor  # (m,) max_l p_l
    signed: torch.Tensor  # (m,) Σ_l c_l


def history_metrics(contributions: torch.Tensor, layer: torch.Tensor) -> History:
    """E4 of contributions (n, N) (0 where l ≥ L) for targets at ``layer`` (n,)."""
    layer = torch.as_tensor(layer, dtype=torch.long, device=contributions.device)
    mass = contributions.abs().sum(-1)
    kept = mass > 0
    c, L, A = contributions[kept], layer[kept], mass[kept]
    p = c.abs() / A[:, None]
    last = p[torch.arange(len(L), device=p.device), L - 1]
    return History(kept=kept, mass=A, share=p, non_recent=1 - last, ess=1 / p.pow(2).sum(-1),
                   max_share=p.max(-1).values, signed=c.sum(-1))  # fmt: skip


# --------------------------------------------------------------------------- K8
@dataclass
class Replay:
    """State-only replay (SAMOE §10.4): per target and source l < L, the margin change from
    s_{l+1} ← s_l with the clean u and x_L; ``clamp_touched`` where a clip acted on a later
    step of the clean or replayed recurrence (there Δm = −c need not hold)."""

    margin_change: torch.Tensor  # (n, N), 0 where l ≥ L
    clamp_touched: torch.Tensor  # (n, N) bool


def state_only_replay(model: MoEModel, cap: Capture, targets: Targets, led: Ledger) -> Replay:
    """Replay only the state recurrence from each source to the target layer (K8)."""
    _, w_s = router_blocks(model, cap.logits.dtype)
    update, c = STATE_UPDATES[model.variant], model.moe_cfg.clamp
    N, n, device = cap.n_layer, len(targets), cap.logits.device
    targets = targets.to(device)
    b, t = cap.where(targets.batch, targets.position)
    s = cap.state[:, b, t]  # (N + 1, n, r)
    u = cap.write_proposal[:, b, t]  # (N, n, r)
    omega = w_s[targets.layer, led.e2] - w_s[targets.layer, led.e3]  # (n, r)
    change = torch.zeros(n, N, dtype=s.dtype, device=device)
    touched = torch.zeros(n, N, dtype=torch.bool, device=device)
    persistent = model.variant == "persistent"
    for src in range(N):
        replay = s[src]  # s'_{src+1} = s_src
        hit = torch.zeros(n, dtype=torch.bool, device=device)
        for j in range(src + 1, N):
            # s'_j is ``replay`` (what router j reads); step j produces s'_{j+1}
            at_target = targets.layer == j
            if at_target.any():
                change[at_target, src] = (omega * (replay - s[j]))[at_target].sum(-1)
                touched[at_target, src] = hit[at_target]
            if persistent:
                hit |= ((replay + u[j]).abs() > c).any(-1) | ((s[j] + u[j]).abs() > c).any(-1)
            replay = update(replay, u[j], c)
    return Replay(margin_change=change * led.eligible, clamp_touched=touched & led.eligible)


def replay_residual(led: Ledger, rep: Replay) -> float:
    """K8: max |Δm + c| over sources where no clamp was touched (SAMOE §10.4)."""
    ok = led.eligible & ~rep.clamp_touched
    if not ok.any():
        return 0.0
    return float((rep.margin_change + led.contributions)[ok].abs().max())


def check_replay(led: Ledger, rep: Replay, tol: float = 1e-5) -> dict:
    """K8 (SAMOE §10.4): state-only replay changes the margin by −c within ``tol`` wherever
    no clamp is touched."""
    return checks.enforce("K8", replay_residual(led, rep), tol,
                          what="state-only replay |Δm + c| where no clamp is touched")  # fmt: skip
