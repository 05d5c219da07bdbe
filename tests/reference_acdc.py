"""The ACDC implementation before the incremental engine (``headgeom.heads.analysis.acdc``), kept
unchanged as the tests' reference: :class:`Graph` recomputes every layer from the one entered
by the destination, and for each destination scans the whole ``removed`` set for its edges
(``any(...)``, ``_diff``); :func:`acdc` is the same greedy loop, pruning and hooked checks.
The engine must make exactly its decisions (tests/unit/test_acdc.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from headgeom.heads.analysis.acdc import EMBED, LOGITS, AcdcResult, graph_edges, hooked_logits
from headgeom.heads.analysis.edges import (
    _require,
    final_kl,
    final_logits,
    kl_from_logits,
    kl_rounding_bound,
    logit_rounding,
)
from headgeom.model.geometries import READ_TYPES


class Graph:
    """The clean and corrupted caches of one batch and the graph forward."""

    @torch.no_grad()
    def __init__(self, model, clean: torch.Tensor, ref: torch.Tensor):
        self.model, self.L, self.H = model, model.cfg.n_layer, model.cfg.n_head
        self.clean_out, self.clean_cache = self.run(clean, frozenset(), None)
        self.ref_out, _ = self.run(ref, frozenset(), None)
        logits = final_logits(self.model, self.clean_cache["final"])
        self.clean_logp = F.log_softmax(logits.double(), -1)

    def _diff(self, outs, removed, dest):
        d = 0.0
        for s, t in removed:
            if t == dest:
                d = d + (outs[s] - self.ref_out[s])
        return d

    @torch.no_grad()
    def run(self, ids, removed: frozenset, start: int | None):
        """Outputs of every source and the final residual; from layer ``start`` on (clean
        caches before it) when given."""
        model = self.model
        outs, cache = {}, {}
        if start is None:
            T = ids.shape[1]
            x = model.wte(ids) + model.wpe(torch.arange(T, device=ids.device))
            outs[EMBED] = x
            first = 0
        else:
            first = start
            x = self.clean_cache[("resid", start)]
            outs.update(
                {s: v for s, v in self.clean_out.items() if s[0] == "embed" or s[1] < start}
            )
        for lay in range(first, self.L):
            cache[("resid", lay)] = x
            block = model.blocks[lay]
            inputs = {}
            for h in range(self.H):
                for X in READ_TYPES:
                    dest = (X.lower(), lay, h)
                    inputs[dest] = (
                        x - self._diff(outs, removed, dest)
                        if any(t == dest for _, t in removed)
                        else None
                    )
            if all(v is None for v in inputs.values()):
                q, k, v = block.attn.reader(x)[:3]
            else:
                base = block.attn.reader(x)[:3]
                q, k, v = (t.clone() for t in base)
                for (kind, _, h), value in inputs.items():
                    if value is not None:
                        n = "qkv".index(kind)
                        (q, k, v)[n][:, :, h] = block.attn.reader(value)[n][:, :, h]
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)
            maps = block.attn.writer.write_maps().to(z.dtype)  # (H, D, d)
            for h in range(self.H):
                outs[("head", lay, h)] = z[:, :, h] @ maps[h].T
            mid = x + block.attn.writer(z)
            dest = ("mlp", lay, -1)
            mlp_in = (
                mid - self._diff(outs, removed, dest) if any(t == dest for _, t in removed) else mid
            )
            outs[dest] = block.mlp(block.ln_2(mlp_in))
            x = mid + outs[dest]
        cache["final"] = (
            x - self._diff(outs, removed, LOGITS) if any(t == LOGITS for _, t in removed) else x
        )
        return outs, cache

    @torch.no_grad()
    def metric(self, removed: frozenset, start: int) -> float:
        """Mean KL of the circuit without ``removed``, every edge of which enters layer
        ``start`` or later (so the run resumes from the clean residual entering it)."""
        _, cache = self.run(None, removed, start)
        rows = torch.arange(cache["final"].shape[0], device=cache["final"].device)
        return float(final_kl(self.model, self.clean_logp, rows, cache["final"]).mean())


def acdc(
    model,
    clean_ids: Sequence,
    ref_ids: Sequence,
    threshold: float = 0.001,
    n_checks: int = 8,
    seed: int = 0,
) -> AcdcResult:
    """ACDC with the KL metric on equal-length clean/reference prompts (one batch)."""
    _require(model)
    lengths = {len(c) for c in clean_ids} | {len(r) for r in ref_ids}
    if len(lengths) != 1:
        raise ValueError(
            f"ACDC runs one batch of equal-length prompts, got lengths {sorted(lengths)}"
        )
    device = next(model.parameters()).device
    clean = torch.as_tensor(np.stack(clean_ids), device=device)
    ref = torch.as_tensor(np.stack(ref_ids), device=device)
    graph = Graph(model, clean, ref)
    L, H = graph.L, graph.H
    removed: set = set()
    current = graph.metric(frozenset(), 0)
    result = AcdcResult(kept=[])
    for s, d in graph_edges(L, H):
        start = d[1]
        trial = frozenset(removed | {(s, d)})
        value = graph.metric(trial, L - 1 if d == LOGITS else start)
        drop = value - current < threshold
        result.decisions.append((s, d, current, value, drop))
        if drop:
            removed.add((s, d))
            current = value
    result.final_metric = current
    # prune: keep edges into destinations whose node still reaches the logits
    all_edges = graph_edges(L, H)
    kept = [(s, d) for s, d in all_edges if (s, d) not in removed]
    alive = set()

    def owner_alive(d):  # the node a destination feeds still reaches the logits
        return (
            d == LOGITS
            or (("head" if d[0] in ("q", "k", "v") else "mlp"), d[1], d[2] if d[0] != "mlp" else -1)
            in alive
        )

    for s, d in kept:  # visiting order is reverse topological: destinations before sources
        if owner_alive(d):
            alive.add(s)
    result.kept = [(s, d) for s, d in kept if owner_alive(d)]
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(len(result.decisions), min(n_checks, len(result.decisions)), False))
    decided: set = set()
    marks = []
    for s, d, _, _, drop in result.decisions:
        marks.append(frozenset(decided | {(s, d)}))
        if drop:
            decided.add((s, d))
    # Both routes compute the same KL in the model's dtype; each differs from the exact one by
    # at most kl_rounding_bound (logits within δ = logit_rounding), so their means by twice it.
    delta = logit_rounding(model)
    for i in picks:
        logp, logits = hooked_logits(model, clean, ref, marks[i])
        hooked = float(kl_from_logits(logp, logits).mean())
        tolerance = 2 * float(kl_rounding_bound(logp, logits, delta).mean())
        result.checks.append((int(i), result.decisions[i][3], hooked, tolerance))
    return result
