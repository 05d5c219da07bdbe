"""The ledger over every routing decision of a pool (SAMOE §10.3's supplement, §10.4's K6):
beside the audited targets, the distributed-history metrics of every decision at layer
L ≥ 1, the ledger reconstruction over all of them, and how often the clamp acted.

For each decision (b, t, L) with clean boundary pair (e2, e3) and ω = W^s_L[e2] − W^s_L[e3],
c_{l→L} = ωᵀ Δ_l for l < L (SAMOE E3); the E4 metrics follow from c as for a target
(:func:`headgeom.samoe.ledger.history_metrics`; LWO: its structural attribution, all of
ωᵀ s_L to L − 1, so NR = 0, ESS = 1 by construction). K6 is max |Σ_l c_l − ωᵀ s_L| over
every decision of the pool (the spec logs it on the construction pool).

The clamp acts on a Persistent coordinate when |s_l + u_l| > c (the write is then the
clipped Δ_l = clip(s_l + u_l) − s_l, not u_l): :attr:`PoolLedger.clamped` counts those
coordinates over every write of the pool (LWO and Ordinary: none, there is no clip).

Gathered chunk by chunk (:func:`headgeom.samoe.capture.captures`): sums and counts per
layer, so peak memory is one chunk's capture and one layer's contributions.
"""

from __future__ import annotations

import torch

from headgeom.samoe import checks
from headgeom.samoe.capture import Capture
from headgeom.samoe.ledger import history_metrics, router_blocks
from headgeom.samoe.model import MoEModel

#: Per-layer sums kept for the means (over the kept decisions, A > 0).
METRICS = ("non_recent", "ess", "max_share")


class PoolLedger:
    """K6, the E4 metrics of every decision at L ≥ 1 and the clamped coordinates of one pool,
    added chunk capture by chunk capture (fields ``state`` and ``write_proposal``)."""

    def __init__(self, model: MoEModel):
        if not model.has_state:
            raise ValueError("the routing ledger needs a state variant (latest or persistent)")
        self.model = model
        self.persistent = model.variant == "persistent"
        self.clamp = float(model.moe_cfg.clamp)
        N = len(model.blocks)
        self.n_layer = N
        self.decisions = [0] * N
        self.kept = [0] * N
        self.sums = {m: [0.0] * N for m in (*METRICS, "signed")}
        self.residual = 0.0  # K6: max |Σ c − ωᵀ s_L| over every decision
        self.clamped = 0  # coordinates where the clip acted (Persistent)
        self.coordinates = 0  # coordinates of every write u_l

    @torch.no_grad()
    def add(self, cap: Capture) -> None:
        if cap.state is None or cap.write_proposal is None:
            raise ValueError("the pool ledger needs the capture fields state and write_proposal")
        _, w_s = router_blocks(self.model, cap.logits.dtype)
        delta = cap.delta  # (N, B, T, r)
        for L in range(1, self.n_layer):
            e2, e3 = cap.top_ids[L, ..., 1], cap.top_ids[L, ..., 2]  # (B, T)
            omega = w_s[L][e2] - w_s[L][e3]  # (B, T, r)
            c = torch.einsum("btr,lbtr->btl", omega, delta[:L]).reshape(-1, L)  # (n, L)
            state_term = (omega * cap.state[L]).sum(-1).reshape(-1)  # (n,)
            self.residual = max(self.residual, float((c.sum(-1) - state_term).abs().max()))
            if not self.persistent:  # LWO: the structural attribution (SAMOE §10.2)
                c = torch.zeros_like(c)
                c[:, L - 1] = state_term
            hist = history_metrics(c, torch.full((len(c),), L, device=c.device))
            self.decisions[L] += len(c)
            self.kept[L] += int(hist.kept.sum())
            for m in METRICS:
                self.sums[m][L] += float(getattr(hist, m).double().sum())
            self.sums["signed"][L] += float(state_term.double().sum())
        if self.persistent:
            self.clamped += int(((cap.state[:-1] + cap.write_proposal).abs() > self.clamp).sum())
        self.coordinates += cap.write_proposal.numel()

    def check(self, name: str = "K6", tol: float = 1e-4, what: str = "") -> dict:
        """K6 over every decision added (SAMOE §10.4), raising ``CheckFailed``."""
        return checks.enforce(name, self.residual, tol,
                              what=what or "ledger |Σ c − ωᵀ s_L| over every decision")  # fmt: skip

    def rows(self) -> list[dict]:
        """Per target layer L ≥ 1: decisions, kept (A > 0), the means of NR, ESS and the
        largest share over the kept ones, and the mean signed state term over all."""
        out = []
        for L in range(1, self.n_layer):
            kept, n = self.kept[L], self.decisions[L]
            means = {m: self.sums[m][L] / kept if kept else float("nan") for m in METRICS}
            out.append(
                {
                    "layer": L,
                    "n_decisions": n,
                    "n_kept": kept,
                    **means,
                    "signed_state_term": self.sums["signed"][L] / n if n else float("nan"),
                }
            )
        return out  # fmt: skip
