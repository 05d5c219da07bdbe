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
than ``threshold``. At the end, nodes that no longer reach the logits are pruned.

**The engine** (:class:`Circuit`) holds the current circuit's state and answers each metric
call by recomputing only what the trial edge changes. The input of destination d is written

    in_d = x_d^ref + Σ_{kept s→d} (out_s − out_s^ref)

(x_d^ref the reference run's residual at d: entering d's block for a head, after its
attention for an MLP, leaving the last block for the logits), the same value as
x − Σ_{removed s→d} (out_s − out_s^ref). Every out_s − out_s^ref of the current circuit is
stored, so an input is one masked sum over d's kept sources (a 0/1 row times the stored
differences), freshly computed whenever it is needed: nothing is updated incrementally, so
the rounding of every value is that of one forward, however many edges were removed before.
A trial s → d (with s → d dropped from d's row) recomputes:

* d = logits: the final-position input and the logits (no block runs);
* d of a node (head or MLP) with no kept path to the logits: nothing (the metric does not
  depend on it, and stays the current one; once dead a node stays dead);
* otherwise: d's input, then, layer by layer, only the nodes that still reach the logits and
  have a kept edge from a node that changed: for a head the Q/K/V inputs with such an edge
  (the reader on those (head, X) pairs only, ``reader.read_heads``), then its attention,
  W_O^h and out − out^ref; for an MLP its input and the MLP; then the logits.

Positions before the batch's first clean/reference difference p are the clean ones in every
circuit (every out_s − out_s^ref is 0 there), so the state covers the S = T − p suffix and
attention reads the clean keys/values of the prefix; in the last layer only the final
query, its heads' outputs and the MLP are computed (all that the final-position logits
read), while its keys and values cover the suffix. A trial writes into the state and keeps
what it overwrote: :meth:`Circuit.settle` keeps the new state when the edge is removed and
restores the old one when it is kept.

**Cost per metric call** (multiply-adds; B examples, suffix S, prefix P = T − S, D, H heads
of width d, d_mlp, V, n_src = 1 + L(H + 1) sources): a logits edge B·n_src·D + B·D·V; an
edge into a dead node 0; otherwise, per recomputed head X-input S·B·(n_src·D + D·d), per
recomputed head S·B·(2·(P + S)·d + d·D), per recomputed MLP S·B·(n_src·D + 2·D·d_mlp)
(S = 1 in the last layer for queries, heads and MLP), and the logits B·n_src·D + B·D·V. At
worst (every node downstream of d's layer l changes) that is layers l..L−1 of a forward on
the S suffix positions, plus the masked sums, plus the logits; calls into dead nodes, common
once most edges are removed (225 of the 479 calls on the demo's all-rotated model), cost
nothing.

**Peak memory**: the state, (2·n_src + 2L + 1)·S·B·D (out − out^ref, out^ref, the
reference residuals) + 3·L·H·S·B·d (current Q, K, V) + 2·L·H·P·B·d (prefix keys/values)
values in the model's dtype and an n_dest × n_src mask (n_dest = L(3H + 1) + 1), plus per
call the values it overwrote (at most n_src·S·B·D + 3·L·H·S·B·d, as much again), one
layer's inputs (at most 3H·S·B·D) and the float64 logits of ``final_kl`` (a few B·V); the
setup's two cached forwards hold O(L·T·B·D) more. At the paper's shape in float64
(L = H = 12, D = 768, B = 16, T = 5, p = 1) the state is ~150 MB, beside the model's 0.85 GB.

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

from headgeom.heads.analysis.edges import (
    _require,
    final_kl,
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


class Circuit:
    """ACDC's current circuit on one batch of equal-length prompts and its metric calls
    (module docstring): :meth:`trial` gives the metric with one more edge removed,
    :meth:`settle` then removes it or keeps it; :attr:`metric` is the current circuit's.

    Indices: source 0 is the embedding, 1 + m(H + 1) + h head (m, h), 1 + m(H + 1) + H
    MLP m; destination m(3H + 1) + x·H + h is X = READ_TYPES[x] of head (m, h),
    m(3H + 1) + 3H the input of MLP m, L(3H + 1) the logits.
    State (suffix positions s = p..T−1, stored position-major): ``diff`` and ``ref_out``
    (n_src, S, B, D) out − out^ref and out^ref; ``xref`` (2L + 1, S, B, D) the reference
    residual entering block m (2m), after its attention (2m + 1), leaving the last (2L);
    ``read`` (L, 3, H, S, B, d) every head's current Q, K, V; ``past_k``/``past_v``
    (L, H, B, P, d) the clean prefix; ``keep`` (n_dest, n_src) 1 for each kept edge. In the
    last layer the heads' and the MLP's out − out^ref are current at the final position only.
    """

    @torch.no_grad()
    def __init__(self, model, clean: torch.Tensor, ref: torch.Tensor, removed=()):
        self.model = model
        L, H = self.L, self.H = model.cfg.n_layer, model.cfg.n_head
        B, T = clean.shape
        differ = (clean != ref).any(dim=0).nonzero()
        p = min(int(differ[0]) if len(differ) else T, T - 1)
        self.S = T - p
        self.sources = [EMBED] + [
            s for m in range(L) for s in [("head", m, h) for h in range(H)] + [("mlp", m, -1)]
        ]
        self.dests = [
            d
            for m in range(L)
            for d in [(X.lower(), m, h) for X in READ_TYPES for h in range(H)] + [("mlp", m, -1)]
        ] + [LOGITS]
        self.src_index = {s: i for i, s in enumerate(self.sources)}
        self.dest_index = {d: i for i, d in enumerate(self.dests)}
        self.n_src, self.logits = len(self.sources), len(self.dests) - 1
        kept = np.zeros((len(self.dests), self.n_src), dtype=bool)
        for s, d in graph_edges(L, H):
            kept[self.dest_index[d], self.src_index[s]] = True
        for s, d in removed:
            kept[self.dest_index[d], self.src_index[s]] = False
        self.kept = kept  # bookkeeping; ``keep`` is the same mask for the masked sums

        names = ["hook_resid_final"] + [
            site(m, n)
            for m in range(L)
            for n in (
                "hook_resid_pre",
                "attn.hook_q",
                "attn.hook_k",
                "attn.hook_v",
                "attn.hook_z",
                "hook_resid_mid",
                "hook_mlp_out",
            )
        ]
        logits, cc = model.run_with_cache(clean, names, last_only=True)
        _, rc = model.run_with_cache(ref, names, last_only=True)
        self.clean_logp = F.log_softmax(logits.double(), -1)
        self.maps = [blk.attn.writer.write_maps().to(logits.dtype) for blk in model.blocks]

        def suffix(t):  # (B, T, ...) -> (S, B, ...)
            return t[:, p:].transpose(0, 1)

        def outs(cache):  # (n_src, S, B, D)
            rows = [suffix(cache[site(0, "hook_resid_pre")])[None]]
            for m in range(L):
                z = suffix(cache[site(m, "attn.hook_z")])  # (S, B, H, d)
                rows.append(torch.einsum("sbhi,hDi->hsbD", z, self.maps[m]))
                rows.append(suffix(cache[site(m, "hook_mlp_out")])[None])
            return torch.cat(rows).contiguous()

        self.ref_out = outs(rc)
        self.diff = outs(cc) - self.ref_out
        self.xref = torch.stack(
            [suffix(rc[site(m, n)]) for m in range(L) for n in ("hook_resid_pre", "hook_resid_mid")]
            + [suffix(rc["hook_resid_final"])]
        ).contiguous()
        qkv = [
            torch.stack([cc[site(m, f"attn.hook_{x}")] for x in "qkv"]) for m in range(L)
        ]  # (3, B, T, H, d) per layer
        self.read = torch.stack([t[:, :, p:].permute(0, 3, 2, 1, 4) for t in qkv]).contiguous()
        self.past_k, self.past_v = (
            torch.stack([t[n, :, :p].permute(2, 0, 1, 3) for t in qkv]).contiguous() for n in (1, 2)
        )  # (L, H, B, P, d)
        pos = torch.arange(T, device=clean.device)
        self.mask = pos[None, :] <= pos[p:, None]  # (S, T): key t <= query position
        self.keep = torch.as_tensor(kept, dtype=logits.dtype, device=clean.device)
        self._pending = None
        self._refresh_alive()
        if len(removed):
            for m in range(L):  # the circuit's state, layer by layer
                self._heads(
                    m, np.arange(m * (3 * H + 1), m * (3 * H + 1) + 3 * H), None, None, None
                )
                self._mlp(m, self.keep[m * (3 * H + 1) + 3 * H], None, None)
        self.metric = self._final_metric(self.keep[self.logits])

    # ------------------------------------------------------------------ metric calls
    @torch.no_grad()
    def trial(self, source: tuple, dest: tuple) -> float:
        """The metric of the current circuit without the kept edge ``source`` → ``dest``;
        :meth:`settle` must follow before the next trial."""
        if self._pending is not None:
            raise RuntimeError("Circuit.trial: settle the previous trial first")
        s, d = self.src_index[source], self.dest_index[dest]
        if not self.kept[d, s]:
            raise ValueError(f"Circuit.trial: {source} → {dest} is not a kept edge")
        row = self.keep[d].clone()
        row[s] = 0
        undo: list = []
        if d == self.logits:
            value = self._final_metric(row)
        elif not self.alive[d]:
            value = self.metric  # d's node no longer reaches the logits
        else:
            value = self._propagate(d, row, undo)
        self._pending = (s, d, undo, value)
        return value

    @torch.no_grad()
    def settle(self, remove: bool) -> None:
        """Remove the last trial's edge (its state becomes the circuit's) or keep it."""
        s, d, undo, value = self._pending
        self._pending = None
        if remove:
            self.kept[d, s] = False
            self.keep[d, s] = 0
            self.metric = value
            self._refresh_alive()
        else:
            for tensor, index, old in reversed(undo):
                tensor[index] = old

    def kl(self, final: torch.Tensor) -> float:
        """Mean KL of the final-position residual ``final`` (B, D) leaving the last block."""
        rows = torch.arange(final.shape[0], device=final.device)
        return float(final_kl(self.model, self.clean_logp, rows, final[:, None]).mean())

    # ------------------------------------------------------------------ the state
    def final_residual(self, row: torch.Tensor | None = None) -> torch.Tensor:
        """(B, D) the final-position residual leaving the last block of the current circuit,
        or of the logits fed ``row`` (n_src,) instead of their row of ``keep``."""
        row = self.keep[self.logits] if row is None else row
        xref = self.xref[-1, -1]  # (B, D)
        return xref + (row @ self.diff[:, -1].flatten(1)).view(xref.shape)

    def _final_metric(self, row: torch.Tensor) -> float:
        return self.kl(self.final_residual(row))

    def _refresh_alive(self) -> None:
        """``alive[d]``: d's node (its head, its MLP; the logits) reaches the logits through
        kept edges. Only nodes whose outgoing edges are all decided are asked (those of the
        layers from the one being visited on), so pending edges do not matter."""
        L, H, kept = self.L, self.H, self.kept
        alive = np.zeros(len(self.dests), dtype=bool)
        alive[self.logits] = True
        for m in reversed(range(L)):
            d0, s0 = m * (3 * H + 1), 1 + m * (H + 1)
            alive[d0 + 3 * H] = (kept[:, s0 + H] & alive).any()  # MLP m
            heads = (kept[:, s0 : s0 + H] & alive[:, None]).any(0)  # (H,)
            alive[d0 : d0 + 3 * H] = np.tile(heads, 3)  # X·H + h -> head h
        self.alive = alive

    def _propagate(self, d0: int, row0: torch.Tensor, undo: list) -> float:
        """The metric with destination ``d0`` fed ``row0``: recompute what changes."""
        L, H, kept = self.L, self.H, self.kept
        changed = np.zeros(self.n_src, dtype=bool)
        first = d0 // (3 * H + 1)
        for m in range(first, L):
            base = m * (3 * H + 1)
            mlp = base + 3 * H
            if m == first:
                if d0 < mlp:
                    self._heads(m, np.array([d0]), row0[None], undo, changed)
            else:
                dests = np.arange(base, mlp)
                dests = dests[self.alive[dests] & kept[dests][:, changed].any(1)]
                if len(dests):
                    self._heads(m, dests, self.keep[dests], undo, changed)
            if d0 == mlp:
                self._mlp(m, row0, undo, changed)
            elif self.alive[mlp] and kept[mlp, changed].any():
                self._mlp(m, self.keep[mlp], undo, changed)
        return self._final_metric(self.keep[self.logits])

    def _write(self, tensor, index, value, undo) -> None:
        if undo is not None:
            undo.append((tensor, index, tensor[index].clone()))
        tensor[index] = value

    def _heads(self, m: int, dests: np.ndarray, rows, undo, changed) -> None:
        """Recompute the Q/K/V inputs ``dests`` of layer m (fed ``rows``, the keep mask's by
        default), then their heads' attention and out − out^ref."""
        H, S, B = self.H, self.S, self.read.shape[4]
        D = self.diff.shape[-1]
        if rows is None:
            rows = self.keep[dests]
        first = 1 + m * (H + 1)  # head (m, 0): the layer's sources start here
        x = torch.addmm(
            self.xref[2 * m].flatten()[None], rows[:, :first], self.diff[:first].flatten(1)
        )
        local = dests - m * (3 * H + 1)
        device = self.diff.device
        kinds = torch.as_tensor(local // H, device=device)
        heads = torch.as_tensor(local % H, device=device)
        reader = self.model.blocks[m].attn.reader
        new = reader.read_heads(x.view(len(dests), S, B, D), heads, kinds)  # (N, S, B, d)
        self._write(self.read, (m, kinds, heads), new, undo)
        hs_np = np.unique(local % H)
        hs = torch.as_tensor(hs_np, device=device)
        last = m == self.L - 1
        q, k, v = (self.read[m, n, hs].transpose(1, 2) for n in range(3))  # (n, B, S, d)
        keys = torch.cat([self.past_k[m, hs], k], 2)  # (n, B, P + S, d)
        values = torch.cat([self.past_v[m, hs], v], 2)
        if last:
            z = F.scaled_dot_product_attention(q[:, :, -1:], keys, values)  # final query
        else:
            z = F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask)
        z = z.transpose(1, 2)  # (n, S', B, d)
        out = torch.bmm(z.flatten(1, 2), self.maps[m][hs].mT).view(*z.shape[:3], D)  # W_O^h z
        src = first + hs
        index = (src, slice(S - 1, S) if last else slice(None))
        self._write(self.diff, index, out - self.ref_out[index], undo)
        if changed is not None:
            changed[first + hs_np] = True

    def _mlp(self, m: int, row: torch.Tensor, undo, changed) -> None:
        """Recompute MLP m's input (fed ``row``) and out − out^ref."""
        H, S = self.H, self.S
        src = 1 + m * (H + 1) + H
        pos = slice(S - 1, S) if m == self.L - 1 else slice(None)
        xref = self.xref[2 * m + 1, pos]  # (S', B, D)
        x = xref + (row[:src] @ self.diff[:src, pos].flatten(1)).view(xref.shape)
        block = self.model.blocks[m]
        out = block.mlp(block.ln_2(x))
        self._write(self.diff, (src, pos), out - self.ref_out[src, pos], undo)
        if changed is not None:
            changed[src] = True


@torch.no_grad()
def hooked_metric(model, clean: torch.Tensor, ref: torch.Tensor, removed) -> float:
    """The circuit's mean KL (:func:`hooked_logits`)."""
    return float(kl_from_logits(*hooked_logits(model, clean, ref, removed)).mean())


@torch.no_grad()
def hooked_logits(model, clean: torch.Tensor, ref: torch.Tensor, removed):
    """(clean log-probs (B, V) float64, circuit logits (B, V)) at the final position
    through the model's own forward and named sites (independent of
    :class:`Circuit`): source outputs are read from ``hook_resid_pre`` of block 0 (embedding),
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
    threshold: float,
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
    circuit = Circuit(model, clean, ref)
    L, H = circuit.L, circuit.H
    removed: set = set()
    current = circuit.metric
    result = AcdcResult(kept=[])
    for s, d in graph_edges(L, H):
        value = circuit.trial(s, d)
        drop = value - current < threshold
        result.decisions.append((s, d, current, value, drop))
        circuit.settle(drop)
        if drop:
            removed.add((s, d))
            current = value
    result.final_metric = current
    result.kept = pruned(removed, L, H)
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(len(result.decisions), min(n_checks, len(result.decisions)), False))
    # the removed set each sampled trial tested (only those: one set per decision would be
    # quadratic, ~32,500² / 2 entries at the paper's shape)
    wanted, decided, marks = set(int(i) for i in picks), set(), {}
    for i, (s, d, _, _, drop) in enumerate(result.decisions):
        if i in wanted:
            marks[i] = frozenset(decided | {(s, d)})
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


class DecisionCheckFailed(ArithmeticError):
    """A sampled ACDC decision's engine KL and its hooked recomputation differ beyond the
    rounding tolerance of the dtype (docs §15.4)."""


def checked_decisions(result: AcdcResult, dtype: str) -> dict[str, float | int]:
    """The decision check's numbers for the metadata (decisions sampled, the largest absolute
    KL residual, the largest residual over its tolerance); a residual above its tolerance
    raises :class:`DecisionCheckFailed` naming the decision. Each tolerance is
    2·kl_rounding_bound: both routes' logits lie within δ = 4·(L+1)·eps(dtype)·logit_scale of
    the exact ones, and the KL moves by at most δ·(‖q − p‖₁ + E_p|log p/q − KL|) + 2δ²."""
    worst = max((abs(a - b) for _, a, b, _ in result.checks), default=0.0)
    ratio = max((abs(a - b) / t for _, a, b, t in result.checks), default=0.0)
    if ratio > 1:
        i, a, b, t = max(result.checks, key=lambda c: abs(c[1] - c[2]) / c[3])
        raise DecisionCheckFailed(
            f"ACDC decision {i}: engine KL {a:.6e}, hooked recomputation {b:.6e}, "
            f"difference {abs(a - b):.2e} above its rounding tolerance {t:.2e} ({dtype})"
        )
    return {
        "check_decisions_sampled": len(result.checks),
        "check_decisions_max_abs_kl_residual": worst,
        "check_decisions_max_residual_over_tolerance": ratio,
    }


def circuit_rows(result: AcdcResult, identity: dict) -> list[dict]:
    """One row per kept edge of the circuit (``results.ACDC``): its source and target, and
    the circuit KL when it was visited, before and had it been removed."""
    before = {(s, d): (b, a) for s, d, b, a, _ in result.decisions}
    return [
        {
            **identity,
            "source_kind": s[0],
            "source_layer": s[1],
            "source_head": s[2],
            "target_kind": d[0],
            "target_layer": d[1],
            "target_head": d[2],
            "kl_if_removed": before[(s, d)][1],
            "kl_before": before[(s, d)][0],
        }
        for s, d in result.kept
    ]


def pruned(removed: set, L: int, H: int) -> list:
    """The edges not in ``removed`` whose destination's node still reaches the logits."""
    kept = [(s, d) for s, d in graph_edges(L, H) if (s, d) not in removed]
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
    return [(s, d) for s, d in kept if owner_alive(d)]
