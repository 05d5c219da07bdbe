"""Post-hoc attribution on the Ordinary MoE (SAMOE §15, after Li et al.): residual
components as the audit objects.

[RECONSTRUCTED] With the router-input norm's statistic frozen at its clean value, the norm
is affine, so the router input splits over the residual's parts: x_L = Σ_j φ(v_j) + β with
φ(v) = γ ⊙ (v − mean(v)) / σ for the toy's LayerNorm (σ the clean √(var + ε) of m_L) and
φ(v) = γ ⊙ v / σ for the Hub models' RMS norms (``headgeom.samoe.norms``), and component j
contributes α_j = W^x_L φ(v_j) ∈ R^E to the logits. v_j is the part as it joins the
residual: Gemma 3's post-attention and post-feed-forward norms are frozen the same way (y_l's
shared and routed parts share y_l's clean statistic). [CHOICE] The
components are each earlier layer's attention output, shared-expert output and gated routed
output (3 per layer, the paper's pilot counts); the embedding, the target layer's own
attention and β form an unranked remainder. K14 checks that the parts rebuild x_L and z_L.

Scores per component: Li variance (of α_j over the experts, the reference criterion), the
Top-2 boundary |α_j[e2] − α_j[e3]|, its norm ‖v_j‖, recency (within a layer attention <
shared < routed), random (SHA-256), gradient×component |∇_{v_j} m · v_j|. The oracle
subtracts v_j at the selected token and reruns the full forward: |Δm| on the clean pair.
[CHOICE] The oracle and gradient×component act at the component's site (the block's output
before any post norm); on Gemma 3 the post norm then renormalises what remains.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.samoe import checks
from headgeom.samoe.capture import Capture
from headgeom.samoe.ledger import Targets
from headgeom.samoe.model import MoEModel, site
from headgeom.samoe.norms import FrozenNorm

#: The components of one layer, in recency order (later = more recent).
KINDS = ("attention", "shared", "routed")
_SITES = {"attention": "hook_attn_out", "shared": "hook_shared_out", "routed": "hook_routed_out"}
#: SAMOE §15 [CHECK] K14: router input and logits rebuilt from the parts (fp32 toy).
RECONSTRUCTION_TOL = 1e-5


def component_index(layer: int, kind: str) -> int:
    """Position of (layer, kind) in a target's component vector: 3·layer + kind order."""
    return len(KINDS) * layer + KINDS.index(kind)


@dataclass
class Attribution:
    """Per target i: the parts of x_L and z_L (component j = 3·l + kind, l < L; NaN or 0
    beyond), their scores, and the reconstruction residuals."""

    alpha: torch.Tensor  # (n, 3N, E) α_j, 0 where l ≥ L
    norm: torch.Tensor  # (n, 3N) ‖v_j‖, NaN where l ≥ L
    variance: torch.Tensor  # (n, 3N) population variance of α_j over the experts
    boundary: torch.Tensor  # (n, 3N) |α_j[e2] − α_j[e3]|
    input_residual: float  # max |Σ_j φ(v_j) + φ(rest) + β − x_L|
    logit_residual: float  # max |Σ_j α_j + α_rest − z_L|


def attribute(
    model: MoEModel, ids: torch.Tensor, cap: Capture, targets: Targets, e2: torch.Tensor,
    e3: torch.Tensor,
) -> Attribution:  # fmt: skip
    """Component attributions of each target's router logits (SAMOE §15)."""
    if model.has_state:
        raise ValueError("post-hoc attribution audits the ordinary MoE (variant 'ordinary')")
    N, dtype, device = cap.n_layer, cap.logits.dtype, cap.logits.device
    with torch.no_grad():
        emb = model.embedding(ids.to(model.wte.weight.device)).to(dtype)  # (B, T, d)
    n, E = len(targets), cap.logits.shape[-1]
    alpha = torch.zeros(n, len(KINDS) * N, E, dtype=dtype, device=device)
    norm = torch.full((n, len(KINDS) * N), float("nan"), dtype=dtype, device=device)
    in_res = logit_res = 0.0
    routers = [FrozenNorm.of(block.router_norm, dtype) for block in model.blocks]
    posts = [tuple(None if p is None else FrozenNorm.of(p, dtype) for p in block.post_norms)
             for block in model.blocks]  # fmt: skip
    rows, cols = cap.where(targets.batch, targets.position)  # the targets in ``cap``
    for i in range(n):
        b, t, L = int(targets.batch[i]), int(targets.position[i]), int(targets.layer[i])
        cb, ct = int(rows[i]), int(cols[i])
        router = routers[L]
        w_x = model.blocks[L].moe.router.W_x.detach().to(dtype)  # (E, d)
        parts = [v for layer in range(L) for v in _joined(cap, posts[layer], layer, cb, ct)]
        rest = emb[b, t] + _joined(cap, posts[L], L, cb, ct)[0]
        m = rest + sum(parts)
        sigma = router.sigma(m)
        mapped = (torch.stack([router.phi(v, sigma) for v in parts]) if parts
                  else emb.new_zeros(0, emb.shape[-1]))  # fmt: skip
        x_rebuilt = mapped.sum(0) + router.phi(rest, sigma) + router.offset()
        in_res = max(in_res, (x_rebuilt - cap.router_in[L, cb, ct]).abs().max().item())
        a = mapped @ w_x.T  # (3L, E)
        z_rebuilt = a.sum(0) + (router.phi(rest, sigma) + router.offset()) @ w_x.T
        logit_res = max(logit_res, (z_rebuilt - cap.logits[L, cb, ct]).abs().max().item())
        alpha[i, : len(parts)] = a
        if parts:
            norm[i, : len(parts)] = torch.stack(parts).norm(dim=-1)
    eligible = ~torch.isnan(norm)
    variance = torch.where(eligible, alpha.var(-1, unbiased=False), torch.nan)
    ar = torch.arange(n, device=device)
    boundary = torch.where(eligible, (alpha[ar, :, e2] - alpha[ar, :, e3]).abs(), torch.nan)
    return Attribution(alpha, norm, variance, boundary, in_res, logit_res)


def _joined(cap: Capture, posts, layer: int, b: int, t: int) -> list[torch.Tensor]:
    """Layer ``layer``'s three components at (b, t) as they join the residual: a_l, and the
    shared and routed parts of y_l, each through its post norm at the clean statistic."""
    attn, shared, routed = (cap.attn_out[layer, b, t], cap.shared_out[layer, b, t],
                            cap.routed_out[layer, b, t])  # fmt: skip
    post_attn, post_mlp = posts
    if post_attn is not None:
        attn = post_attn.phi(attn, post_attn.sigma(attn)) + post_attn.offset()
    if post_mlp is not None:  # y_l = shared + routed is normalised as one vector
        if post_mlp.beta is not None:
            raise ValueError("a post norm with an offset has no split over y_l's parts")
        sigma = post_mlp.sigma(shared + routed)
        shared, routed = post_mlp.phi(shared, sigma), post_mlp.phi(routed, sigma)
    return [attn, shared, routed]


def check_reconstruction(att: Attribution) -> dict:
    """K14: the router input and logits rebuilt from the parts within 1e-5."""
    return {
        **checks.enforce("K14.input", att.input_residual, RECONSTRUCTION_TOL,
                         what="router input from frozen-norm components"),
        **checks.enforce("K14.logits", att.logit_residual, RECONSTRUCTION_TOL,
                         what="router logits from component contributions"),
    }  # fmt: skip


def recency_scores(layer: np.ndarray, N: int) -> np.ndarray:
    """Later first, and within a layer attention < shared < routed (NaN where l ≥ L)."""
    out = np.tile(np.arange(len(KINDS) * N, dtype=np.float64), (len(layer), 1))
    out[np.arange(len(KINDS) * N)[None, :] >= len(KINDS) * np.asarray(layer)[:, None]] = np.nan
    return out


def random_scores(family: str, seq_ids, positions, layers, N: int) -> np.ndarray:
    """Higher = earlier in SHA-256 order of (family, sample id, position, layer, component)."""
    out = np.full((len(layers), len(KINDS) * N), np.nan)
    for i, (sid, pos, L) in enumerate(zip(seq_ids, positions, layers, strict=True)):
        n = len(KINDS) * int(L)
        keys = [hashlib.sha256(f"{family}|{sid}|{pos}|{L}|{j}".encode()).hexdigest()
                for j in range(n)]  # fmt: skip
        out[i, np.argsort(keys)] = np.arange(n, 0, -1)
    return out


def _scaled(scale: torch.Tensor, rows: list[tuple[int, int, int]]) -> dict[str, Callable]:
    """Hooks multiplying component j of row r at its position by scale[r] (rows: (r, j, t))."""
    fns: dict[str, Callable] = {}
    by_site: dict[str, list[tuple[int, int]]] = {}
    for r, j, t in rows:
        layer, kind = divmod(j, len(KINDS))
        by_site.setdefault(site(layer, _SITES[KINDS[kind]]), []).append((r, t))
    for name, hits in by_site.items():

        def fn(a, hits=hits):
            out = a.clone()
            for r, t in hits:
                out[r, t] = a[r, t] * scale[r]
            return out

        fns[name] = fn
    return fns


def gradient_x_component(
    model: MoEModel, ids: torch.Tensor, targets: Targets, e2: torch.Tensor, e3: torch.Tensor
) -> torch.Tensor:
    """|∇_{v_j} m · v_j| = |∂m/∂κ_j| at κ = 1 (n, 3N), v_j scaled by κ_j at the target
    token: one backward per target (NaN where l ≥ L)."""
    N, device = len(model.blocks), model.wte.weight.device
    ids = ids.to(device)
    out = torch.full((len(targets), len(KINDS) * N), float("nan"), dtype=torch.float64,
                     device=device)  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        for i in range(len(targets)):
            b, t, L = int(targets.batch[i]), int(targets.position[i]), int(targets.layer[i])
            n = len(KINDS) * L
            kappa = torch.ones(n, dtype=model.wte.weight.dtype, device=device,
                               requires_grad=True)  # fmt: skip
            z: dict[str, torch.Tensor] = {}
            fns = {}
            for j in range(n):
                layer, kind = divmod(j, len(KINDS))

                def fn(a, j=j, t=t, kappa=kappa):
                    return torch.cat([a[:, :t], (a[:, t] * kappa[j])[:, None], a[:, t + 1 :]], 1)

                fns[site(layer, _SITES[KINDS[kind]])] = fn
            fns[site(L, "hook_router_logits")] = lambda a, z=z: z.__setitem__("z", a)
            with torch.enable_grad(), model.hooks(fns):
                model(ids[b : b + 1])
                m = z["z"][0, t, e2[i]] - z["z"][0, t, e3[i]]
                (grad,) = torch.autograd.grad(m, kappa)
            out[i, :n] = grad.abs().double()
    finally:
        for p in params:
            p.requires_grad_(True)
    return out


@torch.no_grad()
def oracle_effects(
    model: MoEModel, ids: torch.Tensor, targets: Targets, e2: torch.Tensor, e3: torch.Tensor,
    rows_per_forward: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """|Δm| (n, 3N) of removing each component at the target token and rerunning the full
    forward, one component per batch row (NaN where l ≥ L): all rows in one forward and the
    clean margins from one forward of ``ids``, or (``rows_per_forward``, bounded memory) that
    many rows a forward, the clean margins from the targets' own sequences as rows."""
    N, device = len(model.blocks), model.wte.weight.device
    ids = ids.to(device)
    pairs = [(i, j) for i in range(len(targets)) for j in range(len(KINDS) * int(targets.layer[i]))]
    step = max(len(pairs), 1) if rows_per_forward is None else rows_per_forward

    def router_logits(rows_ids: torch.Tensor, fns: dict) -> dict[int, torch.Tensor]:
        z: dict[int, torch.Tensor] = {}
        for layer in range(N):
            fns[site(layer, "hook_router_logits")] = lambda a, k=layer: z.__setitem__(k, a)
        with model.hooks(fns):
            model(rows_ids)
        return z

    m1 = []
    for lo in range(0, len(pairs), step):
        part = pairs[lo : lo + step]
        rows = [(r, j, int(targets.position[i])) for r, (i, j) in enumerate(part)]
        scale = torch.ones(len(part), dtype=model.wte.weight.dtype, device=device)
        scale[:] = 0.0  # remove the component: v_j ← 0 at the selected token
        batch = torch.as_tensor([int(targets.batch[i]) for i, _ in part], dtype=torch.long,
                                device=device)  # fmt: skip
        z = router_logits(ids[batch], _scaled(scale, rows))
        for r, (i, _) in enumerate(part):
            t, L = int(targets.position[i]), int(targets.layer[i])
            m1.append(z[L][r, t, e2[i]] - z[L][r, t, e3[i]])
        del z
    m0 = []
    if rows_per_forward is None:
        clean = router_logits(ids, {})
        for i in range(len(targets)):
            b, t, L = int(targets.batch[i]), int(targets.position[i]), int(targets.layer[i])
            m0.append(clean[L][b, t, e2[i]] - clean[L][b, t, e3[i]])
    else:
        for lo in range(0, len(targets), step):
            idx = range(lo, min(lo + step, len(targets)))
            batch = torch.as_tensor([int(targets.batch[i]) for i in idx], dtype=torch.long,
                                    device=device)  # fmt: skip
            clean = router_logits(ids[batch], {})
            for r, i in enumerate(idx):
                t, L = int(targets.position[i]), int(targets.layer[i])
                m0.append(clean[L][r, t, e2[i]] - clean[L][r, t, e3[i]])
    out = torch.full((len(targets), len(KINDS) * N), float("nan"), dtype=torch.float64,
                     device=device)  # fmt: skip
    for r, (i, j) in enumerate(pairs):
        out[i, j] = float((m1[r] - m0[i]).abs())
    return out
