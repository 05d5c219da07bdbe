"""Exact edge patching (docs §15.1, §15.4): writer head i → the X-input of a later reader j.

An **edge** runs from a writer head i = (l, h) to the X-input (X ∈ {Q, K, V}) of a reader
head j = (l', h') with l' > l. Its patch, in an otherwise clean forward pass, replaces
**only** reader j's X (site ``blocks.{l'}.attn.hook_{x}``, head h') by the value the reader
computes from x + δ_i, where x is the clean residual entering layer l' and

    δ_i = W_O^i (z_i^ref − z_i)          (docs §11.2, ``patching.head_perturbations``)

is writer i's reference-prompt contribution at every position; the reader is the block's own
(LN_1 re-evaluated on x + δ_i for free readers; LN_h, S_h and A_X for block readers, i.e.
their effective W_X; the value adapter of value384). Every other reader sees the clean x and
everything downstream recomputes. The metric is the full-vocabulary
KL(P_clean ‖ P_patched) at the final position (docs §15.1 CHOICE, the ACDC convention).

:func:`edge_kl` computes it for many edges at once, exactly (no approximation), fast by
structure:

* one clean and one reference forward per batch of equal-length examples cache the clean
  residual entering, and q, k, v, z of, every layer, and the reference z (the patching
  engine's named sites); the δ_i follow from them;
* an edge into layer l' resumes at l' (nothing before it depends on the patch) and only
  positions t ≥ p, the batch's first clean/reference difference, are recomputed: before p,
  δ_i = 0, so every activation there is the clean one, and later layers attend to the cached
  clean keys/values of those positions (``Block.forward_suffix``);
* the reader runs once per (writer, example) on x + δ_i and serves all 3·H edges of that
  writer into layer l'; at layer l' only head h' attends again (the others keep their clean
  z), then W_O, the MLP and the later blocks run on all rows;
* rows are edge × example, at most ``max_rows`` per forward (memory bound); the last layer
  and the full-vocabulary log-softmax run at the final position only;
* an edge whose patched input equals the clean one bit for bit on every example (e.g. a
  writer orthogonal to a block reader's block) has KL exactly 0 and is not recomputed.

**KL and its noise floor.** The KL is Σ_v p_v (log p_v − log q_v) over the final-position
logits of the clean and the patched run, each log-softmaxed in float64 (:func:`final_kl`,
``chunk`` rows × V in float64 at a time). Both are normalised distributions, so a rounding
error ε of the logits enters at second order where the two agree, ½·Var_p(ε), and elsewhere
in proportion to the signal, |ε|·(‖q − p‖₁ + E_p|log p/q − KL|) ≈ 2|ε|·√(2·KL)
(:func:`kl_rounding_bound`, with |ε| ≤ δ of :func:`logit_rounding`). Measured, |ε| is 1–3
eps·max|logit| per forward (float32 vs float64 on random models of every geometry): with
logits of ~10, |ε| ~ 3e-6 in float32, so the floor where KL → 0 is ~1e-11 and a KL of 1e-6
carries up to ~1% error; in float64 |ε| ~ 1e-14 and the float64 summation itself
(:func:`summation_floor`, ~1e-13) is the floor. A KL in [−floor, 0) reads 0; below −floor
the engine raises. (The earlier neg_entropy − ē·h + logsumexp(b) form took Σ p b from h
rather than from the rounded logits b, so ε entered at first order, ~eps·|logit| ≈ 1e-6 in
float32: a third of the demo's edge KLs came out negative.)

Multiscreen models have no Q/K/V readers of this kind (screening tiles): the engine needs the
registry's ``edge_patching`` and refuses others by name. :func:`edge_kl_naive` is the
reference: one forward per edge with a hook on the reader's site (full forward, the
TransformerLens way, or resumed at the reader's layer, the auto-circuit way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F

from headgeom import results
from headgeom.data.task_files import PatchInputs, first_per_condition, model_inputs, read_task
from headgeom.divergence import EPS64 as EPS64  # the engine's float64 eps, read by its checks
from headgeom.divergence import kl_of_logp, summation_floor
from headgeom.heads.analysis import weightspace
from headgeom.heads.analysis.batching import check_pairs, length_batches, model_device, stack_rows
from headgeom.heads.analysis.patching import head_perturbations, supports_prefix_reuse
from headgeom.heads.analysis.stats import spearman
from headgeom.heads.analysis.tolerance import forward_tolerance
from headgeom.model import registry
from headgeom.model.checkpoint import load_verified
from headgeom.model.geometries import READ_TYPES
from headgeom.model.gpt import site

Progress = Callable[[int], object] | None


# --------------------------------------------------------------------------- edges
@dataclass(frozen=True)
class Edges:
    """A list of edges as parallel int arrays: writer (layer, head) → reader (layer, head),
    ``read_type`` the index of X in ``READ_TYPES`` (0 Q, 1 K, 2 V)."""

    writer_layer: np.ndarray
    writer_head: np.ndarray
    reader_layer: np.ndarray
    reader_head: np.ndarray
    read_type: np.ndarray

    def __len__(self) -> int:
        return len(self.writer_layer)

    def subset(self, index: np.ndarray) -> Edges:
        return Edges(*(np.asarray(a)[index] for a in self.arrays()))

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (
            self.writer_layer,
            self.writer_head,
            self.reader_layer,
            self.reader_head,
            self.read_type,
        )


def edge_count(n_layer: int, n_head: int) -> int:
    """Σ_{l<l'} H·H·3 = 3·H²·L(L−1)/2 (docs §15.1: 28,512 at 12×12, 50,688 at 12×16)."""
    return 3 * n_head * n_head * n_layer * (n_layer - 1) // 2


def all_edges(n_layer: int, n_head: int) -> Edges:
    """Every edge, ordered by reader layer, writer layer, writer head, reader head, X."""
    rows = [
        (wl, wh, rl, rh, x)
        for rl in range(n_layer)
        for wl in range(rl)
        for wh in range(n_head)
        for rh in range(n_head)
        for x in range(len(READ_TYPES))
    ]
    cols = np.asarray(rows, dtype=np.int64).reshape(-1, 5).T
    return Edges(*cols)


def _require(model: torch.nn.Module) -> None:
    arch = registry.architecture_of(model)
    if not (supports_prefix_reuse(model) and arch.edge_patching):
        raise ValueError(
            f"edge patching needs GPT Q/K/V readers with the KV-prefix forward (the registry's "
            f"edge_patching and prefix_reuse); {type(model).__name__} has none (docs §15.1 "
            f"names GPT models only)"
        )


# --------------------------------------------------------------------------- shared pieces
def logit_scale(model) -> float:
    """A weight-only bound on every logit |b_v| = |w_v·h| ≤ ‖h‖·max_v ‖w_v‖ (Cauchy–Schwarz),
    with ‖h‖ ≤ √D·max|γ| + ‖β‖ for the final LayerNorm's output h = γ ⊙ n + β, ‖n‖ ≤ √D."""
    ln, w = model.ln_f, model.wte.weight.detach().double()
    gamma = ln.weight.detach().double().abs().max()
    beta = ln.bias.detach().double().norm() if ln.bias is not None else 0.0
    return float((model.cfg.d_model**0.5 * gamma + beta) * w.norm(dim=-1).max())


def logit_rounding(model) -> float:
    """δ, a bound on the rounding error of any final-position logit in the model's dtype: the
    forward's tolerance (``analysis.tolerance``: 4 ulps per block and the unembedding) at
    the weight-only :func:`logit_scale`. Measured in float32 against float64: ≤ 3.1 ulps of
    that scale on 3–4-layer random models of every geometry, against 4·(L + 1) = 16–20."""
    return forward_tolerance(model, logit_scale(model))


def kl_from_logits(clean_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(P_clean ‖ Q) (R,) float64 from clean log-probs (R, V) float64 and the patched
    final-position logits (R, V) in any dtype, log-softmaxed in float64 (:func:`kl_of_logp`)."""
    return kl_of_logp(clean_logp, F.log_softmax(logits.double(), dim=-1))


def kl_rounding_bound(clean_logp: torch.Tensor, logits: torch.Tensor, delta: float):
    """(R,) bound on |KL̃ − KL| when the clean and patched logits carry rounding errors α, β
    with |α|, |β| ≤ ``delta`` (:func:`logit_rounding`). KL's gradients are ∂/∂b = q − p and
    ∂/∂a = p ⊙ (r − KL), r = log p − log q, so to first order
    |ΔKL| ≤ δ·(‖q − p‖₁ + Σ_v p_v |r_v − KL|), plus ½Var_p(α − β) ≤ 2δ² at second order
    (what remains where p = q) and the float64 :func:`summation_floor`."""
    logq = F.log_softmax(logits.double(), dim=-1)
    p, q = clean_logp.exp(), logq.exp()
    r = clean_logp - logq
    kl = (p * r).sum(-1, keepdim=True)
    first = (q - p).abs().sum(-1) + (p * (r - kl).abs()).sum(-1)
    return delta * first + 2 * delta**2 + summation_floor(clean_logp, logq)


def final_logits(model, x: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits (R, V) at the final position from the residual leaving the last
    block (R, S, D): the tail of ``GPT.forward``."""
    return final_state(model, x) @ model.wte.weight.T


def final_state(model, x: torch.Tensor) -> torch.Tensor:
    """ln_f of the final-position residual (R, D) from the residual leaving the last block."""
    return model.ln_f(model.hook_resid_final(x)[:, -1])


def final_kl(model, clean_logp: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, chunk=256):
    """KL(P_clean ‖ Q) (R,) float64 from the residual ``x`` (R, S, D) leaving the last block,
    row r against example ``rows[r]`` of ``clean_logp`` (B, V) float64: the logits in the
    model's dtype, then :func:`kl_of_rows`, ``chunk`` rows at a time (memory: a few
    chunk × V float64 arrays)."""
    h = final_state(model, x)
    clean_p = clean_logp.exp()  # (B, V): once, not once per row
    return torch.cat(
        [
            kl_of_rows(
                clean_logp, clean_p, rows[i : i + chunk], h[i : i + chunk] @ model.wte.weight.T
            )
            for i in range(0, len(h), chunk)
        ]
    )


def kl_of_rows(
    clean_logp: torch.Tensor, clean_p: torch.Tensor, rows: torch.Tensor, logits: torch.Tensor
) -> torch.Tensor:
    """:func:`kl_from_logits` of row r of ``logits`` (R, V) against example ``rows[r]`` of
    ``clean_logp`` (B, V), with ``clean_p`` = its exp: the same operations on the same
    values, bit for bit, with the rows gathered by ``index_select`` and the difference and
    product written in place (the KL is a fifth of the edge engine's time: three (R, V)
    float64 passes and two allocations fewer)."""
    logq = F.log_softmax(logits.double(), dim=-1)
    buf = torch.index_select(clean_logp, 0, rows)
    terms = torch.sub(buf, logq, out=logq)  # log p − log q
    terms.mul_(torch.index_select(clean_p, 0, rows, out=buf))
    kl = terms.sum(-1)
    if (kl < 0).any():  # rare: recompute those rows for the floor check of kl_of_logp
        neg = (kl < 0).nonzero()[:, 0]
        kl[neg] = kl_from_logits(clean_logp[rows[neg]], logits[neg])
    return kl


def writer_deltas(model, z_clean: dict, z_ref: dict, layers: range) -> list[torch.Tensor]:
    """δ of every head of ``layers``: (B, T, H, D) in the model's dtype per layer."""
    dtype = next(model.parameters()).dtype
    return [
        head_perturbations(model.blocks[lay].attn.writer.write_maps(), z_clean[lay], z_ref[lay]).to(
            dtype
        )
        for lay in layers
    ]


def _caches(model, clean: torch.Tensor, ref: torch.Tensor):
    L = model.cfg.n_layer
    names = [
        site(lay, n)
        for lay in range(L)
        for n in ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z")
    ]
    logits, cc = model.run_with_cache(clean, names, last_only=True)
    _, rc = model.run_with_cache(ref, [site(lay, "attn.hook_z") for lay in range(L)], True)
    z_clean = {lay: cc[site(lay, "attn.hook_z")] for lay in range(L)}
    z_ref = {lay: rc[site(lay, "attn.hook_z")] for lay in range(L)}
    return F.log_softmax(logits.double(), -1), cc, z_clean, z_ref


def _attend(q, k, v, past_k, past_v, last_only: bool) -> torch.Tensor:
    """One head per row: q, k, v (R, S, d) at the suffix, past (R, P, d) → z (R, S', d),
    causal, S' = 1 when ``last_only`` (the final query sees every key)."""
    P, S = past_k.shape[1], k.shape[1]
    keys, values = torch.cat([past_k, k], 1), torch.cat([past_v, v], 1)
    if last_only:
        q, mask = q[:, -1:], None
    else:
        pos = torch.arange(P + S, device=q.device)
        mask = pos[None, :] <= pos[P:, None]
    return F.scaled_dot_product_attention(
        q[:, None], keys[:, None], values[:, None], attn_mask=mask
    )[:, 0]


# --------------------------------------------------------------------------- fast engine
@torch.no_grad()
def edge_kl_batch(
    model,
    clean: torch.Tensor,
    ref: torch.Tensor,
    edges: Edges,
    max_rows: int,
    progress: Progress = None,
) -> torch.Tensor:
    """KL (B, E) float64 of every edge on one batch of equal-length examples (B, T)."""
    L, _H = model.cfg.n_layer, model.cfg.n_head
    B, T = clean.shape
    clean_logp, cc, z_clean, z_ref = _caches(model, clean, ref)
    differ = (clean != ref).any(dim=0).nonzero()
    p = min(int(differ[0]) if len(differ) else T, T - 1)
    out = torch.zeros(B, len(edges), dtype=torch.float64, device=clean.device)
    deltas = writer_deltas(model, z_clean, z_ref, range(L - 1))  # (B, T, H, D) per layer
    rl_all = np.asarray(edges.reader_layer)
    for rl in np.unique(rl_all):
        rl = int(rl)
        if rl < 1 or rl >= L:
            raise ValueError(f"reader layer {rl} outside 1..{L - 1}")
        idx = np.flatnonzero(rl_all == rl)
        sub = edges.subset(idx)
        if (sub.writer_layer >= rl).any():
            raise ValueError("an edge's writer must be in an earlier layer than its reader")
        block = model.blocks[rl]
        x = cc[site(rl, "hook_resid_pre")][:, p:]  # (B, S, D)
        clean_x = [cc[site(rl, f"attn.hook_{n}")] for n in "qkv"]  # (B, T, H, d)
        # the reader once per (writer, example), shared by the 3·H edges of that writer
        writers = sorted(
            set(zip(sub.writer_layer.tolist(), sub.writer_head.tolist(), strict=False))
        )
        w_index = {w: i for i, w in enumerate(writers)}
        # row 0 is the clean x, so "unchanged" compares outputs of one and the same call
        delta = torch.stack([torch.zeros_like(x)] + [deltas[wl][:, p:, wh] for wl, wh in writers])
        patched = block.attn.reader((x[None] + delta).flatten(0, 1))[:3]
        patched = [t.unflatten(0, (len(writers) + 1, B)) for t in patched]  # (1+W, B, S, H, d)
        same_call = [t[0].permute(2, 0, 1, 3) for t in patched]  # (H, B, S, d)
        w_of = 1 + np.array(
            [
                w_index[w]
                for w in zip(sub.writer_layer.tolist(), sub.writer_head.tolist(), strict=False)
            ]
        )
        per = max(1, int(max_rows) // B)
        last = rl == L - 1
        for e0 in range(0, len(sub), per):
            e = slice(e0, min(len(sub), e0 + per))
            w_t = torch.as_tensor(w_of[e], device=clean.device)
            j_t = torch.as_tensor(sub.reader_head[e], device=clean.device)
            x_t = torch.as_tensor(sub.read_type[e], device=clean.device)
            E = len(w_t)
            qkv = []
            changed = torch.zeros(E, B, dtype=torch.bool, device=clean.device)
            for n in range(3):
                c = clean_x[n][:, p:].permute(2, 0, 1, 3)[j_t]  # (E, B, S, d)
                new = patched[n][w_t, :, :, j_t]  # (E, B, S, d)
                use = (x_t == n)[:, None, None, None]
                qkv.append(torch.where(use, new, c))
                changed |= (use & (new != same_call[n][j_t])).flatten(2).any(-1)
            rows = changed.flatten().nonzero()[:, 0]  # row e·B + b
            if len(rows) == 0:
                continue
            eb = rows // B, rows % B
            q, k, v = (t.flatten(0, 1)[rows] for t in qkv)  # (R, S, d)
            past = [
                cc[site(rl, f"attn.hook_{n}")][:, :p].permute(2, 0, 1, 3)[j_t].flatten(0, 1)[rows]
                for n in "kv"
            ]
            zj = _attend(q, k, v, past[0], past[1], last)  # (R, S', d)
            start = T - 1 if last else p
            z = z_clean[rl][eb[1], start:].clone()  # (R, S', H, d)
            z[torch.arange(len(rows)), :, j_t[eb[0]]] = zj
            h = block.after_z(cc[site(rl, "hook_resid_pre")][eb[1], start:], z)
            h = _downstream(model, cc, rl, p, h, eb[1])
            out[eb[1], torch.as_tensor(idx[e0 : e0 + E], device=clean.device)[eb[0]]] = final_kl(
                model, clean_logp, eb[1], h
            )
        if progress is not None:
            progress(len(sub))
    return out


def _downstream(model, cc, layer: int, p: int, x: torch.Tensor, example: torch.Tensor):
    """Blocks after ``layer`` on suffix rows ``x`` (R, S, D); row r continues example
    ``example[r]``, attending to its cached clean prefix keys/values (positions < p)."""
    L = model.cfg.n_layer
    for m in range(layer + 1, L):
        past_k = cc[site(m, "attn.hook_k")][example, :p]  # (R, p, H, d): one prefix per row
        past_v = cc[site(m, "attn.hook_v")][example, :p]
        x, _, _ = model.blocks[m].forward_suffix(x, past_k, past_v, last_only=m == L - 1)
    return x


def _per_batch(model, clean_ids, ref_ids, batch_size, run) -> np.ndarray:
    lengths = check_pairs(clean_ids, ref_ids)
    device = model_device(model)
    result = None
    for index in length_batches(lengths, batch_size):
        kl = run(stack_rows(clean_ids, index, device), stack_rows(ref_ids, index, device))
        if result is None:
            result = np.empty((len(lengths), kl.shape[1]), dtype=np.float64)
        result[index] = kl.cpu().numpy()
    return result


def edge_kl(
    model,
    clean_ids: Sequence,
    ref_ids: Sequence,
    edges: Edges | None = None,
    *,
    batch_size: int,
    max_rows: int,
    progress: Progress = None,
) -> np.ndarray:
    """KL(P_clean ‖ P_edge-patched) (N, E) float64 per example and edge (default: every edge,
    :func:`all_edges` order). ``batch_size`` bounds the examples and ``max_rows`` the
    edge × example rows of one forward (memory ∝ max_rows · T · max(d_mlp, d_model), plus a
    few 256 × V float64 arrays for the KL). The KL's noise floor is the module's: run a
    float64 model where KLs are small (~1e-11 where KL → 0 in float32, ~1e-13 in float64).
    ``progress(k)``: k more edges done per batch."""
    _require(model)
    edges = all_edges(model.cfg.n_layer, model.cfg.n_head) if edges is None else edges
    return _per_batch(
        model,
        clean_ids,
        ref_ids,
        batch_size,
        lambda c, r: edge_kl_batch(model, c, r, edges, max_rows, progress),
    )


# --------------------------------------------------------------------------- reference
@torch.no_grad()
def edge_kl_naive(
    model,
    clean_ids: Sequence,
    ref_ids: Sequence,
    edges: Edges,
    resume: bool = False,
    batch_size: int = 16,
    progress: Progress = None,
) -> np.ndarray:
    """:func:`edge_kl` one forward per edge, the way hook libraries do it: the patched X of
    reader j is computed from the cached clean residual plus δ_i and set by a hook on
    ``blocks.{l'}.attn.hook_{x}`` (head j only); then the whole model runs (``resume``
    False) or blocks l'..L−1 from the cached clean residual (``resume`` True).
    ``progress(1)`` after each edge."""
    _require(model)
    L = model.cfg.n_layer

    def run(clean, ref):
        clean_logp, cc, z_clean, z_ref = _caches(model, clean, ref)
        deltas = writer_deltas(model, z_clean, z_ref, range(L - 1))
        out = torch.empty(clean.shape[0], len(edges), dtype=torch.float64)
        for n, (wl, wh, rl, rh, x) in enumerate(
            zip(*(a.tolist() for a in edges.arrays()), strict=False)
        ):
            x_in = cc[site(rl, "hook_resid_pre")]
            value = model.blocks[rl].attn.reader(x_in + deltas[wl][:, :, wh])[x][:, :, rh]

            def swap(t, value=value, rh=rh):
                t = t.clone()
                t[:, :, rh] = value
                return t

            with model.hooks({site(rl, f"attn.hook_{'qkv'[x]}"): swap}):
                if resume:
                    h = x_in
                    for block in model.blocks[rl:]:
                        h = block(h)
                    logits = final_logits(model, h)
                else:
                    logits = model(clean, last_only=True)
            out[:, n] = kl_from_logits(clean_logp, logits).cpu()
            if progress is not None:
                progress(1)
        return out

    return _per_batch(model, clean_ids, ref_ids, batch_size, run)


# --------------------------------------------------------------------------- Table 7
def edge_frame(model, clean_ids, ref_ids, batch_size: int, max_rows: int):
    """One row per edge (docs §15.1): writer, reader, X, the mean KL over the examples and
    the edge PK between Im W_O^i and reader j's weight-space X rows (effective W_X = A_X S_hᵀ
    for block readers; ``weightspace.write_read_pk``)."""

    edges = all_edges(model.cfg.n_layer, model.cfg.n_head)
    kl = edge_kl(model, clean_ids, ref_ids, edges, batch_size=batch_size, max_rows=max_rows)
    frame = pd.DataFrame(
        {
            "writer_layer": edges.writer_layer,
            "writer_head": edges.writer_head,
            "reader_layer": edges.reader_layer,
            "reader_head": edges.reader_head,
            "read_type": np.asarray(READ_TYPES)[edges.read_type],
            "kl": kl.mean(axis=0),
            "kl_max": kl.max(axis=0),
        }
    )
    pk = weightspace.write_read_pk(weightspace.head_spaces(weightspace.head_maps(model)))
    pk = pk.rename(
        columns={
            "source_layer": "writer_layer",
            "source_head": "writer_head",
            "target_layer": "reader_layer",
            "target_head": "reader_head",
        }
    )
    keys = ["writer_layer", "writer_head", "reader_layer", "reader_head", "read_type"]
    frame = frame.merge(pk[[*keys, "pk", "same_index"]], on=keys, how="left", validate="1:1")
    if frame["pk"].isna().any():
        raise AssertionError("an edge has no PK row")
    return frame


def edge_correlations(frame) -> dict:
    """Pooled Spearman(PK, KL) over every edge and the median within-(reader, X) Spearman
    for Q, K and V (groups whose PK or KL is constant have no ρ and are left out; their
    number is reported)."""
    rho, p = spearman(frame["pk"].to_numpy(), frame["kl"].to_numpy())
    out = {
        "n_edges": len(frame),
        "pooled_spearman": rho,
        "pooled_p": p,
        "pk_min": float(frame["pk"].min()),
        "pk_max": float(frame["pk"].max()),
        "zero_pk_share": float((frame["pk"] < 1e-12).mean()),
    }
    for X in READ_TYPES:
        rows = frame[frame["read_type"] == X]
        rhos = [
            spearman(g["pk"].to_numpy(), g["kl"].to_numpy())[0]
            for _, g in rows.groupby(["reader_layer", "reader_head"])
        ]
        rhos = np.asarray(rhos, dtype=np.float64)
        ok = np.isfinite(rhos)
        out[f"median_within_{X}"] = float(np.median(rhos[ok])) if ok.any() else float("nan")
        out[f"n_groups_{X}"] = int(ok.sum())
        out[f"n_groups_undefined_{X}"] = int((~ok).sum())
    return out


def stage_metadata(model, manifest, task, frame, dtype: str) -> dict:
    """What the edge and ACDC files of one run record (docs §15.1, §15.4): provenance, the
    KL's definition, the dtype and its logit rounding bound, and which examples were used."""
    return {
        # version 2: the exact KL and the examples by condition
        **results.file_metadata("edges", "2", manifest, task_dataset_sha256=task.dataset_sha256),
        "kl": "KL(P_clean || P_patched) = sum_v p_v (log p_v - log q_v), full vocabulary, "
        "final position, float64 log-softmax of the final-position logits",
        "dtype": dtype,
        "logit_rounding_bound": logit_rounding(model),
        "example_selection": "first n/4 of each condition by ascending example_id",
        "example_ids": [int(i) for i in frame["example_id"]],
        "examples_per_condition": {
            str(c): int(k) for c, k in frame["condition"].value_counts(sort=False).items()
        },
    }


@dataclass
class StageInputs:
    """What the edge and ACDC stages of one run read: the verified model in its dtype, the
    examples (``model_inputs`` of the first n of the split, a quarter per condition), the
    run's identity columns and the files' metadata (:func:`stage_metadata`)."""

    model: torch.nn.Module
    inputs: PatchInputs
    identity: dict
    metadata: dict
    n_examples: int


def stage_inputs(checkpoint, manifest_path, task_path, split: str, n_examples: int,
                 dtype: str, device: torch.device) -> StageInputs:  # fmt: skip
    """Load and verify the checkpoint, convert it to ``dtype`` (after the verified load, so
    the checkpoint's hash is of the stored weights) and pick the examples (docs §15.1)."""
    model, vocab, manifest = load_verified(checkpoint, manifest_path)
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    task = read_task(task_path, [split])
    frame = first_per_condition(task, split, n_examples, task_path)
    identity = {"model": manifest["model_name"], "seed": int(manifest["init_seed"]),
                "task": task.name, "split": split}  # fmt: skip
    metadata = stage_metadata(model, manifest, task, frame, dtype)
    return StageInputs(model, model_inputs(frame, vocab), identity, metadata, len(frame))


#: The dtypes the edge and ACDC stages run the model in (float64 by default, docs §15.1).
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def add_stage_arguments(parser) -> None:
    """The arguments heads/stages/edges.py and heads/stages/acdc.py share: the run, its
    examples, the dtype."""
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--n-examples", type=int, required=True)
    parser.add_argument("--dtype", choices=tuple(DTYPES), required=True,
                        help="dtype the model runs in")  # fmt: skip
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
