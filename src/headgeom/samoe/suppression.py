"""Suppressing routing-state writes (SAMOE §12, §14.2–14.3).

**Full-forward source suppression** (E7, paper App. C.4). At one (row, position, source
layer l) the state leaving layer l is moved back towards the state that entered it::

    s_{l+1} ← s_l + α (s^nat_{l+1} − s_l)      α = 1 clean, α = 0 suppressed

and the forward continues, so everything downstream may change (hidden states, later writes
and clamps, routing, experts, logits). In P this removes Δ_l; in LWO it restores the
previously retained state. The engine puts every (target, source) suppression in its own
batch row of one forward — rows never interact (attention is within a sequence, experts
and norms act per token) — so n suppressions cost one forward of n rows.

Outcomes (SAMOE §14.3) on the clean boundary pair (e2, e3), held fixed: the target's
|Δm|, the downstream Top-2 Jaccard divergence at the selected token over layers
l + 1 … N − 1 [CHOICE] (and over layers > L, logged), and KL(p_clean ‖ p_int) of the
next-token distribution at the selected token (nats).

**Local attenuation** (E5, SAMOE §12): z_l(λ) = W^x x_l + λ W^s s_l with the clean x_l and
s_l fixed, non-propagating; a decision changes when its Top-2 *set* differs from λ = 1's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from headgeom.samoe import checks
from headgeom.samoe.capture import Capture, cpu_bitwise
from headgeom.samoe.ledger import Targets, boundary_pair, router_blocks
from headgeom.samoe.model import MoEModel, site, top_k


@dataclass(frozen=True)
class Rows:
    """One suppression per batch row: the clean sequence it copies, the selected position
    and the source layer l whose outgoing state is replaced (int64 tensors (R,))."""

    batch: torch.Tensor
    position: torch.Tensor
    source: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("batch", "position", "source"):
            value = getattr(self, name)  # a tensor keeps its device, anything else: the default
            device = value.device if isinstance(value, torch.Tensor) else None
            object.__setattr__(self, name, torch.as_tensor(value, dtype=torch.long, device=device))

    def to(self, device: torch.device) -> Rows:
        """The same rows on ``device`` (the same tensors when already there)."""
        return Rows(*(v.to(device) for v in (self.batch, self.position, self.source)))


def suppression_hooks(
    rows: Rows, n_layer: int, alpha: float
) -> dict[str, Callable[[torch.Tensor], torch.Tensor | None]]:
    """Hooks implementing E7 on a batch laid out as ``rows``: ``hook_state_in`` of each layer
    keeps s_l, ``hook_state_out`` blends it into s^nat_{l+1} at the rows whose source is l.
    At α = 1 the state-out hooks return None: bitwise the clean forward (K11)."""
    entering: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def fn(s: torch.Tensor) -> None:
            entering[layer] = s

        return fn

    def replace(layer: int):
        sel = (rows.source == layer).nonzero(as_tuple=True)[0]
        pos = rows.position[sel]

        def fn(s_nat: torch.Tensor) -> torch.Tensor | None:
            if alpha == 1.0 or not len(sel):
                return None
            out = s_nat.clone()
            # torch.lerp is exact at both ends: α = 0 gives s_l's bytes.
            out[sel, pos] = torch.lerp(entering[layer][sel, pos], s_nat[sel, pos], alpha)
            return out

        return fn

    fns = {}
    for layer in range(n_layer):
        fns[site(layer, "hook_state_in")] = keep(layer)
        fns[site(layer, "hook_state_out")] = replace(layer)
    return fns


@torch.no_grad()
def suppressed_forward(
    model: MoEModel, ids: torch.Tensor, rows: Rows, alpha: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine: one forward of R rows ``ids[rows.batch]`` (R, T), row i suppressing the
    write of layer ``rows.source[i]`` at ``rows.position[i]``. Returns the router logits
    (N, R, T, E) and the output logits (R, T, V), in the model dtype."""
    if not model.has_state:
        raise ValueError("source suppression needs a state variant (latest or persistent)")
    N = len(model.blocks)
    ids = ids.to(model.wte.weight.device)
    rows = rows.to(ids.device)
    fns = suppression_hooks(rows, N, alpha)
    z: dict[int, torch.Tensor] = {}

    def saver(layer: int):
        def fn(a: torch.Tensor) -> None:
            z[layer] = a

        return fn

    for layer in range(N):
        fns[site(layer, "hook_router_logits")] = saver(layer)
    with model.hooks(fns):
        out = model(ids[rows.batch])
    return torch.stack([z[layer] for layer in range(N)]), out


def check_hook_no_op(model: MoEModel, ids: torch.Tensor, rows: Rows, alpha: float = 1.0,
                     rows_per_forward: int | None = None) -> dict:  # fmt: skip
    """K11 (SAMOE §14.2): the engine returns bitwise the logits of the plain forward of the
    same rows — at α = 1 on any model, and at α = 0 on one whose writes are all zero (step 0).
    The residual is the number of differing logits; all rows in one forward, or
    ``rows_per_forward`` rows a forward (each compared with the plain forward of those rows)."""
    ids = ids.to(model.wte.weight.device)
    rows = rows.to(ids.device)
    step = max(len(rows.batch), 1) if rows_per_forward is None else rows_per_forward
    differ = 0
    for lo in range(0, len(rows.batch), step):
        part = Rows(*(v[lo : lo + step] for v in (rows.batch, rows.position, rows.source)))
        _, out = suppressed_forward(model, ids, part, alpha=alpha)
        with torch.no_grad():
            plain = model(ids[part.batch])
        differ += int((out != plain).sum())
        del out, plain
    what = f"logits changed by the suppression hook at α = {alpha}"
    return checks.enforce("K11", differ, 0, "count", what=what, needs=cpu_bitwise(ids))


def jaccard_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 − |A ∩ B| / |A ∪ B| of index sets a, b (..., k) without repeats -> (...)."""
    inter = (a[..., :, None] == b[..., None, :]).sum((-1, -2)).to(torch.float32)
    return 1 - inter / (a.shape[-1] + b.shape[-1] - inter)


@dataclass
class Outcomes:
    """SAMOE §14.3 outcomes, one row per (target, source) suppression (float32, (R,))."""

    target: torch.Tensor  # index of the target of each row
    source: torch.Tensor
    margin_change: torch.Tensor  # Δm = m_int − m_clean on the clean (e2, e3); |Δm| is the outcome
    jaccard_downstream: torch.Tensor  # mean over layers source+1 … N−1 (NaN if none)
    jaccard_after_target: torch.Tensor  # mean over layers > L (NaN if none)
    output_kl: torch.Tensor  # KL(p_clean ‖ p_int) at the selected token, nats


def suppression_outcomes(
    model: MoEModel,
    ids: torch.Tensor,
    cap: Capture,
    targets: Targets,
    sources: Sequence[Sequence[int]] | None = None,
    alpha: float = 0.0,
    rows_per_forward: int = 64,
) -> Outcomes:
    """Suppress, for each target i, each source in ``sources[i]`` (default: every l < L_i)
    and measure the outcomes against the clean capture ``cap`` of ``ids``."""
    N, device = cap.n_layer, cap.logits.device
    targets = targets.to(device)
    if sources is None:
        sources = [range(int(L)) for L in targets.layer]
    pairs = [(i, int(s)) for i, srcs in enumerate(sources) for s in srcs]
    if any(not 0 <= s < int(targets.layer[i]) for i, s in pairs):
        raise ValueError("every suppressed source must lie below its target layer")
    tgt = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)
    src = torch.tensor([s for _, s in pairs], dtype=torch.long, device=device)
    b, t, L = targets.batch[tgt], targets.position[tgt], targets.layer[tgt]
    e2, e3 = (e[tgt] for e in boundary_pair(cap, targets))
    R = len(pairs)
    ar = torch.arange(R, device=device)
    z_int = torch.empty(N, R, cap.logits.shape[-1], dtype=torch.float32, device=device)
    logp_int = torch.empty(R, cap.output_logits.shape[-1], dtype=torch.float32, device=device)
    for lo in range(0, R, rows_per_forward):
        part = slice(lo, lo + rows_per_forward)
        z, out = suppressed_forward(model, ids, Rows(b[part], t[part], src[part]), alpha)
        n = z.shape[1]
        rows = torch.arange(n, device=device)
        z_int[:, part] = z[:, rows, t[part]].float()
        logp_int[part] = F.log_softmax(out[rows, t[part]].float(), dim=-1)
    cb, ct = cap.where(targets.batch, targets.position)  # the targets' rows of ``cap``
    cb, ct = cb[tgt], ct[tgt]
    z_clean = cap.logits[:, cb, ct].float()  # (N, R, E)
    margin = lambda zz: zz[L, ar, e2] - zz[L, ar, e3]  # noqa: E731
    # Downstream Top-2 sets at the selected token, clean vs intervened, per layer.
    dist = jaccard_distance(top_k(z_clean, 2)[0], top_k(z_int, 2)[0])  # (N, R)
    layers = torch.arange(N, device=device)[:, None]

    def mean_over(mask: torch.Tensor) -> torch.Tensor:
        count = mask.sum(0)
        total = (dist * mask).sum(0)
        return torch.where(count > 0, total / count.clamp(min=1), torch.nan)

    logp_clean = F.log_softmax(cap.output_logits[cb, ct].float(), dim=-1)
    return Outcomes(
        target=tgt,
        source=src,
        margin_change=margin(z_int) - margin(z_clean),
        jaccard_downstream=mean_over(layers > src[None, :]),
        jaccard_after_target=mean_over(layers > L[None, :]),
        output_kl=(logp_clean.exp() * (logp_clean - logp_int)).sum(-1),
    )


# --------------------------------------------------------------------------- E5
def attenuated_logits(model: MoEModel, cap: Capture, lam: float) -> torch.Tensor:
    """z_l(λ) = W^x x_l + λ W^s s_l (N, B, T, E) from the clean capture (SAMOE E5)."""
    w_x, w_s = router_blocks(model, cap.logits.dtype)
    hidden = torch.einsum("lbtd,led->lbte", cap.router_in, w_x)
    return hidden + lam * torch.einsum("lbtr,ler->lbte", cap.state[:-1], w_s)


def top_sets(z: torch.Tensor, k: int) -> torch.Tensor:
    """The Top-k expert sets of z (..., E) as sorted ids (..., k), comparable as sets."""
    return top_k(z, k)[0].sort(-1).values


def set_change(model: MoEModel, cap: Capture, lam: float) -> torch.Tensor:
    """E5 indicator (N, B, T) bool: Top-k set of z(λ) differs from that of z(1)."""
    k = model.moe_cfg.top_k
    ref = top_sets(attenuated_logits(model, cap, 1.0), k)
    return (top_sets(attenuated_logits(model, cap, lam), k) != ref).any(-1)


def set_change_rates(
    model: MoEModel, cap: Capture, lambdas: Sequence[float], skip_layer0: bool = True
) -> dict[float, float]:
    """Set-change rate per λ: mean of E5 over every decision, layer 0 (s_0 = 0) excluded
    unless ``skip_layer0`` is False [CHOICE §12]."""
    first = 1 if skip_layer0 else 0
    return {float(lam): float(set_change(model, cap, lam)[first:].float().mean())
            for lam in lambdas}  # fmt: skip


class PoolSetChanges:
    """E5 over a pool gathered chunk by chunk (:func:`headgeom.samoe.capture.captures`): each
    chunk's indicators (N, b, T) per λ (and λ = 1 for K9) are kept, joined along the batch, so
    the rates are those of one capture of the pool."""

    def __init__(self, model: MoEModel, lambdas: Sequence[float]):
        self.model = model
        self.lambdas = [float(lam) for lam in lambdas]
        self.changes: dict[float, list[torch.Tensor]] = {lam: [] for lam in {*self.lambdas, 1.0}}

    def add(self, cap: Capture) -> None:
        for lam, kept in self.changes.items():
            kept.append(set_change(self.model, cap, lam))

    def rates(self, skip_layer0: bool = True) -> dict[float, float]:
        """As :func:`set_change_rates` over the whole pool."""
        first = 1 if skip_layer0 else 0
        return {lam: float(torch.cat(self.changes[lam], 1)[first:].float().mean())
                for lam in self.lambdas}  # fmt: skip

    def check_unit_lambda(self) -> dict:
        """K9 over the whole pool."""
        changed = sum(int(c.sum()) for c in self.changes[1.0])
        return checks.enforce("K9", changed, 0, "count", what="decisions changed at λ = 1")


def check_unit_lambda(model: MoEModel, cap: Capture) -> dict:
    """K9: λ = 1 changes no Top-2 set (SAMOE §12 [CHECK])."""
    changed = int(set_change(model, cap, 1.0).sum())
    return checks.enforce("K9", changed, 0, "count", what="decisions changed at λ = 1")
