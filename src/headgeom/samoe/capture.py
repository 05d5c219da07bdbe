"""One clean forward's record of every audit object (SAMOE §9), float32 by default.

The forward runs in the model's dtype; what the hooks see is cast to ``dtype`` (float32:
"states, logits and router weights are cast to float32 for attribution"), so the ledger
algebra is exact in float32 algebra, not bit-exact against a bf16 forward. Axes of every
field are in ``AXES``; ``layer`` runs over the N MoE layers, ``state_layer`` over the N + 1
states s_0 … s_N.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headgeom.samoe import checks
from headgeom.samoe.model import MoEModel, site, top_k

#: Explicit axes of each ``Capture`` field.
AXES: dict[str, tuple[str, ...]] = {
    "router_in": ("layer", "batch", "position", "d_model"),
    "logits": ("layer", "batch", "position", "expert"),
    "top_ids": ("layer", "batch", "position", "rank"),
    "top_logits": ("layer", "batch", "position", "rank"),
    "attn_out": ("layer", "batch", "position", "d_model"),
    "shared_out": ("layer", "batch", "position", "d_model"),
    "routed_out": ("layer", "batch", "position", "d_model"),
    "resid_final": ("batch", "position", "d_model"),
    "output_logits": ("batch", "position", "vocab"),
    "state": ("state_layer", "batch", "position", "state"),
    "write_proposal": ("layer", "batch", "position", "state"),
    "delta": ("layer", "batch", "position", "state"),
}
#: Clean experts kept per decision: e1, e2 (selected) and e3 (best excluded), SAMOE §0.
N_RANKED = 3


@dataclass
class Capture:
    """x_l, z_l, Top-3, block outputs and (state variants) s_0…s_N, u_l, Δ_l; see ``AXES``."""

    router_in: torch.Tensor
    logits: torch.Tensor
    top_ids: torch.Tensor  # int64
    top_logits: torch.Tensor
    attn_out: torch.Tensor
    shared_out: torch.Tensor
    routed_out: torch.Tensor
    resid_final: torch.Tensor
    output_logits: torch.Tensor
    state: torch.Tensor | None = None
    write_proposal: torch.Tensor | None = None

    @property
    def delta(self) -> torch.Tensor | None:
        """Realised post-clamp writes Δ_l = s_{l+1} − s_l (layer, batch, position, state)."""
        return None if self.state is None else self.state[1:] - self.state[:-1]

    @property
    def n_layer(self) -> int:
        return self.logits.shape[0]


@torch.no_grad()
def capture(model: MoEModel, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> Capture:
    """One clean forward of ``ids`` (B, T) with every SAMOE §9 site recorded in ``dtype``, on
    the model's device (``ids`` are moved there; so is every field of the capture)."""
    N = len(model.blocks)
    ids = ids.to(model.wte.weight.device)
    names = ["hook_router_in", "hook_router_logits", "hook_attn_out", "hook_shared_out",
             "hook_routed_out"]  # fmt: skip
    if model.has_state:
        names += ["hook_state_in", "hook_state_out", "hook_write_proposal"]
    cache: dict[str, torch.Tensor] = {}

    def saver(key: str):
        def save(a: torch.Tensor) -> None:
            cache[key] = a.detach().to(dtype)

        return save

    fns = {site(i, n): saver(site(i, n)) for i in range(N) for n in names}
    fns["hook_resid_final"] = saver("hook_resid_final")
    with model.hooks(fns):
        out = model(ids)

    def stacked(name: str) -> torch.Tensor:
        return torch.stack([cache[site(i, name)] for i in range(N)])

    z = stacked("hook_router_logits")  # (N, B, T, E)
    top_ids, top_logits = top_k(z, N_RANKED)
    state = proposal = None
    if model.has_state:
        # s_0 then s_{l+1} as each layer left it: the state the next router reads.
        state = torch.stack([cache[site(0, "hook_state_in")],
                             *(cache[site(i, "hook_state_out")] for i in range(N))])  # fmt: skip
        proposal = stacked("hook_write_proposal")
    return Capture(
        router_in=stacked("hook_router_in"),
        logits=z,
        top_ids=top_ids,
        top_logits=top_logits,
        attn_out=stacked("hook_attn_out"),
        shared_out=stacked("hook_shared_out"),
        routed_out=stacked("hook_routed_out"),
        resid_final=cache["hook_resid_final"],
        output_logits=out.detach().to(dtype),
        state=state,
        write_proposal=proposal,
    )


# --------------------------------------------------------------------------- K1, K2
def check_step0(latest: Capture, persistent: Capture) -> dict:
    """K1 (SAMOE §5.4): at step 0 every realised write of both state variants is exactly 0
    and their router logits are bitwise equal (captures of the same ids)."""
    nonzero = sum(int(torch.count_nonzero(c.delta)) for c in (latest, persistent))
    differ = int((latest.logits != persistent.logits).sum())
    return {
        **checks.enforce("K1.writes", nonzero, 0, "count", what="nonzero step-0 writes"),
        **checks.enforce("K1.logits", differ, 0, "count",
                         what="step-0 router logits differing between P and LWO"),
    }  # fmt: skip


#: The bound on |s| of each state variant: P's clamp; LWO's tanh.
def state_bound(variant: str, clamp: float) -> float:
    return {"persistent": float(clamp), "latest": 1.0}[variant]


def check_state_bounds(cap: Capture, variant: str, clamp: float) -> dict:
    """K2 (SAMOE §5.4): |s| ≤ c (P) and |s| ≤ 1 (LWO) at every capture; the residual is
    the largest excess over the bound (0 when inside)."""
    excess = max(float(cap.state.abs().max()) - state_bound(variant, clamp), 0.0)
    return checks.enforce("K2", excess, 0.0, what=f"{variant} state beyond its bound")


# --------------------------------------------------------------------------- state geometry
def state_geometry(cap: Capture, clamp: float) -> list[dict]:
    """Per layer l (the state s_l a router reads, l = 0…N−1): mean ‖s_l‖₂ over tokens and
    the fraction of its coordinates at the clamp (|s| = c; SAMOE §18, paper App. C.5)."""
    if cap.state is None:
        raise ValueError("state geometry needs a state variant (latest or persistent)")
    rows = []
    for layer in range(cap.n_layer):
        s = cap.state[layer]
        rows.append({
            "layer": layer,
            "mean_norm": float(s.norm(dim=-1).mean()),
            "clamp_fraction": float((s.abs() >= clamp).double().mean()),
        })  # fmt: skip
    return rows
