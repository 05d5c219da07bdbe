"""ACDC (Conmy et al., 2023) on the edge graph of a GPT model (docs §15.4), exact.

Nodes: sources are the embedding (token + position), every head's output W_O^h z^h and every
MLP's output; destinations are every head's Q, K and V inputs (separate nodes), every MLP's
input and the logits (the final residual). An edge s → d is removed by feeding d the
corrupted value of s (its value on the reference prompt) instead of its value in the
current run: d's input is  x − Σ_{removed s→d} (out_s − out_s^ref). The metric is the mean
KL(P_clean ‖ P_circuit) at the final position, Σ_v p_v (log p_v − log q_v) in float64 over the
final-position logits (the edge engine's ``final_kl``; its noise floor, ~1e-11 in float32 and
~1e-13 in float64 where KL → 0, is far below any threshold ACDC is run with).

ACDC visits destinations in reverse topological order (logits, MLP L−1, the heads of layer
L−1, MLP L−2, ...) and removes each incoming edge whose removal raises the metric by less
than ``threshold``. Because every edge removed so far enters layer l or later when layer l's
destinations are visited, each evaluation resumes from the clean residual entering l (the
edge engine's caches). At the end, nodes that no longer reach the logits are pruned.

:func:`hooked_metric` recomputes the metric of a circuit independently, through the model's
own forward and its named sites; :func:`acdc` checks a sample of its decisions with it, each
within a tolerance derived from the dtype's eps and the logits (``edges.kl_rounding_bound``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from headgeom.analysis.edges import (
    _require,
    final_kl,
    final_logits,
    kl_from_logits,
    kl_rounding_bound,
    logit_rounding,
)
from headgeom.model.geometries import READ_TYPES
from headgeom.model.gpt import site

EMBED = ("embed", -1, -1)  # (kind, layer, head); kinds: embed, head, mlp
LOGITS = ("logits", -1, -1)  # destinations: (kind, layer, head) with kind q, k, v, mlp, logits


def graph_edges(L: int, H: int) -> list[tuple[tuple, tuple]]:
    """Every (source, destination) edge in ACDC's visiting order (reverse topological)."""
    edges = []
    everything = [EMBED] + [
        s for lay in range(L) for s in [("head", lay, h) for h in range(H)] + [("mlp", lay, -1)]
    ]
    edges += [(s, LOGITS) for s in everything]
    for lay in reversed(range(L)):
        into_mlp = [EMBED] + [
            s
            for m in range(lay + 1)
            for s in [("head", m, h) for h in range(H)] + ([("mlp", m, -1)] if m < lay else [])
        ]
        edges += [(s, ("mlp", lay, -1)) for s in into_mlp]
        into_head = [EMBED] + [
            s for m in range(lay) for s in [("head", m, h) for h in range(H)] + [("mlp", m, -1)]
        ]
        edges += [(s, (x.lower(), lay, h)) for h in range(H) for x in READ_TYPES for s in into_head]
    return edges


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


@torch.no_grad()
def hooked_metric(model, clean: torch.Tensor, ref: torch.Tensor, removed) -> float:
    """The circuit's mean KL (:func:`hooked_logits`)."""
    return float(kl_from_logits(*hooked_logits(model, clean, ref, removed)).mean())


@torch.no_grad()
def hooked_logits(model, clean: torch.Tensor, ref: torch.Tensor, removed):
    """(clean log-probs (B, V) float64, circuit logits (B, V)) at the final position
    through the model's own forward and named sites (independent of
    :class:`Graph`): source outputs are read from ``hook_resid_pre`` of block 0 (embedding),
    ``attn.hook_z`` (W_O^h z^h) and ``hook_mlp_out``; destination inputs are set at
    ``attn.hook_q/k/v`` (head h recomputed by the reader), ``hook_mlp_out`` and
    ``hook_resid_final``."""
    L, H = model.cfg.n_layer, model.cfg.n_head

    def record(ids):
        outs, hooks = {}, {}
        hooks[site(0, "hook_resid_pre")] = lambda x: outs.__setitem__(EMBED, x)
        for lay in range(L):
            maps = model.blocks[lay].attn.writer.write_maps()

            def z_hook(z, lay=lay, maps=maps):
                for h in range(H):
                    outs[("head", lay, h)] = z[:, :, h] @ maps[h].to(z.dtype).T

            hooks[site(lay, "attn.hook_z")] = z_hook
            hooks[site(lay, "hook_mlp_out")] = lambda m, lay=lay: outs.__setitem__(
                ("mlp", lay, -1), m
            )
        return outs, hooks

    ref_outs, hooks = record(ref)
    with model.hooks(hooks):
        model(ref, last_only=True)
    logp = F.log_softmax(model(clean, last_only=True).double(), -1)
    outs, hooks = record(clean)
    resid = {}

    def diff(dest):
        return sum((outs[s] - ref_outs[s] for s, t in removed if t == dest), 0.0)

    for lay in range(L):
        block = model.blocks[lay]

        def pre_hook(x, lay=lay):
            resid[lay] = x
            if lay == 0:
                outs[EMBED] = x

        hooks[site(lay, "hook_resid_pre")] = pre_hook
        hooks[site(lay, "hook_resid_mid")] = lambda x, lay=lay: resid.__setitem__(("mid", lay), x)
        for n, X in enumerate(READ_TYPES):

            def qkv_hook(t, lay=lay, n=n, X=X, block=block):
                t = t.clone()
                for h in range(H):
                    d = diff((X.lower(), lay, h))
                    if not isinstance(d, float):
                        t[:, :, h] = block.attn.reader(resid[lay] - d)[n][:, :, h]
                return t

            hooks[site(lay, f"attn.hook_{X.lower()}")] = qkv_hook

        def mlp_hook(m, lay=lay, block=block):
            d = diff(("mlp", lay, -1))
            if not isinstance(d, float):
                m = block.mlp(block.ln_2(resid[("mid", lay)] - d))
            outs[("mlp", lay, -1)] = m
            return m

        hooks[site(lay, "hook_mlp_out")] = mlp_hook
    hooks["hook_resid_final"] = lambda x: x - diff(LOGITS)
    with model.hooks(hooks):
        logits = model(clean, last_only=True)
    return logp, logits


@dataclass
class AcdcResult:
    kept: list  # (source, destination, delta) of the final circuit (after pruning)
    decisions: list = field(default_factory=list)  # (source, dest, metric_before, after, removed)
    # (index, engine metric, hooked metric, tolerance of their difference)
    checks: list = field(default_factory=list)
    final_metric: float = 0.0


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
