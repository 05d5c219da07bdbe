"""Directional leakage of a patch perturbation into later readers (docs §9.5, §11.2–11.3).

L_{i→j} = Σ‖P_R δ_i‖² / Σ‖δ_i‖², pooled over every row of ``delta`` (rows are
examples × positions). With an orthonormal reader basis ``R`` (D, r), ‖P_R δ‖ = ‖Rᵀδ‖,
so the numerator is one matrix product and never needs the D×D projector.

A perturbation with no energy (Σ‖δ‖² = 0, e.g. a head whose reference and clean outputs
coincide) has no direction; its leakage is NaN, never 0, so it cannot pass as "no leakage".

:func:`leakage_table` runs the whole analysis of one model and task split: for every source
head i = (l, h), every head j of every later layer l' > l and X ∈ {Q, K, V}, the leakage
L_{i→j} of the real patch perturbation δ_i = W_O^i (z_ref − z) (pooled over all positions of
all examples) into the folded read space R_X^j = Im(P_c diag(γ) W_X^jᵀ) of reader j (γ: the
gain of the norm before its projections, P_c the centring of a LayerNorm, I for an RMSNorm),
the isotropic expectation ρ = PK(Im W_O^i, R) / dim Im W_O^i, and L/ρ. Two numerical checks
run with it and stop the run before anything is written:

* C8: the z-patched attention output of layer l minus the clean one equals δ_i (1e-5);
* C9: the effects recomputed by adding δ_i to the attention output reproduce the stored
  head-patch effects e_{l,h} of the effects file (1e-5).

The maps come from the registry's ``heads`` access (``headgeom.model.heads``): our GPT
models' readers and writers, or a transformers causal LM's projections through its family
record, whose key/value read spaces belong to the shared key/value head and are attributed
to every query head that reads it (docs §11.8). Models whose readers are not free (block
readers, multiscreen tiles: no shared norm before learned W_Q, W_K, W_V, docs §11.1) and
families whose attention output passes a norm before the residual (Gemma 2/3) are refused
(``Heads.leakage_refusal``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from headgeom.data.task_files import PatchInputs
from headgeom.heads.analysis.batching import first_difference, length_batches
from headgeom.heads.analysis.effects import drops_array, single_identity
from headgeom.heads.analysis.leakage_hooked import hooked_pass
from headgeom.heads.analysis.leakage_sums import (
    TV_CONDITIONS,
    Sums,
    attention_final,
    total_variation,
)
from headgeom.heads.analysis.patching import (
    add_to,
    head_perturbations,
    logit_difference,
    replace_head,
)
from headgeom.heads.analysis.stats import effects_from_drops
from headgeom.heads.analysis.tolerance import (
    Residual,
    forward_tolerance,
    model_dtype,
    rounding_tolerance,
)
from headgeom.model import registry
from headgeom.model.geometries import READ_TYPES
from headgeom.model.gpt import site
from headgeom.model.heads import Heads, query_read_maps
from headgeom.subspace import orthonormal_bases, projection_kernel

#: docs §11.2 / §18: checks C8 and C9 compare two routes to one value; their tolerances
#: follow from the dtype and the magnitudes (``analysis.tolerance``): C8 two rounded W_O sums
#: of attention outputs up to their largest |value|, C9 the whole forward at the largest
#: |logit|.
C8_STAGES = 2


def _rows(delta: np.ndarray) -> np.ndarray:
    """Flatten ``(..., D)`` perturbations to ``(N, D)`` float64 rows."""
    delta = np.asarray(delta, dtype=np.float64)
    if delta.ndim < 1:
        raise ValueError("delta must have a trailing residual axis D")
    return delta.reshape(-1, delta.shape[-1])


def directional_leakage(delta: np.ndarray, R: np.ndarray) -> float:
    """L = Σ‖Rᵀδ‖² / Σ‖δ‖² for perturbations ``delta`` (N, D) and reader basis ``R`` (D, r).

    ``delta`` may also be ``(examples, positions, D)``; all leading axes are pooled.
    ``R`` must have orthonormal columns. Returns NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return float("nan")
    return float(np.sum(np.square(rows @ R))) / total


def leakage_to_readers(delta: np.ndarray, readers: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """L for one source perturbation and many readers at once, shape ``(J,)``.

    ``delta``: ``(N, D)`` or ``(..., D)``, the source head's perturbation rows.
    ``readers``: a sequence of J orthonormal bases ``(D, r_j)`` (ranks may differ, r_j = 0
    gives 0), or a stack ``(J, D, r)``.

    All bases are concatenated into one ``(D, Σr_j)`` matrix so a single product gives every
    column's captured energy. When there are more rows than residual dimensions (N > D) the
    energies come from the Gram matrix G = δᵀδ instead (column k: r_kᵀ G r_k), which needs
    N·D² + D²·Σr operations and a D×Σr buffer rather than N·D·Σr and an N×Σr buffer.
    Returns all-NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    bases = list(readers)
    if not bases:
        return np.zeros(0)
    widths = np.array([basis.shape[1] for basis in bases])
    stacked = np.concatenate([np.asarray(basis, dtype=np.float64) for basis in bases], axis=1)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return np.full(len(bases), np.nan)
    if rows.shape[0] > rows.shape[1]:
        gram = rows.T @ rows  # (D, D)
        column_energy = np.einsum("dk,dk->k", gram @ stacked, stacked)
    else:
        column_energy = np.sum(np.square(rows @ stacked), axis=0)  # (Σr,)
    owner = np.repeat(np.arange(len(bases)), widths)  # which reader each column belongs to
    captured = np.bincount(owner, weights=column_energy, minlength=len(bases))
    # The Gram form can round a zero energy to -1e-17; energies are nonnegative by definition.
    return np.maximum(captured, 0.0) / total


def isotropic_expectation(U: np.ndarray, R: np.ndarray) -> float:
    """PK(U, R) / dim U: the leakage of a perturbation isotropic within U (docs §9.5).

    ``U`` (D, a) is the source write space, ``R`` (D, r) the reader's folded read space, both
    orthonormal. When dim U = dim R this equals ρ(U, R); NaN if dim U = 0.
    """
    if U.shape[1] == 0:
        return float("nan")
    return projection_kernel(U, R) / U.shape[1]


# ----------------------------------------------------------------------------- the analysis
def require_free_readers(model, checkpoint: str) -> None:
    """Refuse a model on which leakage is not defined (``Heads.leakage_refusal``: block
    readers, multiscreen tiles, a norm after the output projection), saying why."""
    refusal = registry.heads_of(model).leakage_refusal
    if refusal is not None:
        raise ValueError(f"{checkpoint}: {refusal}")


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def write_bases(model) -> list[list[np.ndarray]]:
    """U^{l,h} = Im W_O^{l,h}: orthonormal (D, r) bases, [layer][head] (one batched SVD)."""
    heads = registry.heads_of(model)
    maps = np.stack([_numpy(w) for layer in range(heads.n_layer) for w in heads.write_maps(layer)])
    flat = orthonormal_bases(maps)  # from (L·H, D, d)
    H = heads.n_head
    return [flat[layer * H : (layer + 1) * H] for layer in range(heads.n_layer)]


def read_bases(model) -> list[dict[str, list[np.ndarray]]]:
    """Folded read spaces R_X^{l,h} = Im(P_c diag(γ) W_Xᵀ) of every query head h from W_X
    and the gain γ of the norm before the projections (P_c = I for an RMSNorm; key/value
    maps of the key/value head h reads), [layer][X][head] (docs §9.2, §11.8; one batched
    SVD)."""
    heads = registry.heads_of(model)
    folded = []
    for layer in range(heads.n_layer):
        norm = heads.read_norm(layer)
        if norm is None:
            raise ValueError(f"layer {layer}: its heads share no norm to fold (docs §9.2)")
        gamma = _numpy(norm.gain)
        for X in READ_TYPES:
            for w in query_read_maps(heads, layer, X):
                scaled = gamma[:, None] * _numpy(w).T  # diag(γ) W_Xᵀ
                folded.append(scaled - scaled.mean(axis=0) if norm.centered else scaled)
    flat = iter(orthonormal_bases(np.stack(folded)))
    return [
        {X: [next(flat) for _ in range(heads.n_head)] for X in READ_TYPES}
        for _ in range(heads.n_layer)
    ]


def stored_effects(
    effects: pd.DataFrame, split: str, example_ids: np.ndarray, shape: tuple[int, int], path: str
) -> tuple[dict, np.ndarray]:
    """(identity, e (L, H)) of ``split`` from an effects table; examples must match the task."""
    rows = effects[effects["split"] == split]
    if rows.empty:
        raise ValueError(
            f"{path}: no effects for split {split!r} (has {list(pd.unique(effects['split']))})"
        )
    identity = single_identity(rows, path)
    ids, d = drops_array(rows, *shape)
    if set(ids.tolist()) != set(example_ids.tolist()) or len(ids) != len(example_ids):
        raise ValueError(f"{path}: the {split} examples differ from the task file's")
    return identity, effects_from_drops(d)


@dataclass(frozen=True)
class Leakage:
    """The leakage rows of one model and split (without identity columns) and the checks."""

    table: pd.DataFrame
    c8: Residual
    c9: Residual


LEAKAGE_COLUMNS = [
    "source_layer",
    "source_head",
    "reader_layer",
    "reader_head",
    "read_type",
    "leakage",
    "rho",
    "pk",
    "write_dim",
    "read_dim",
]
#: Direct vs total responses at the reader's input projection (docs §11.5), pooled.
RESPONSE_COLUMNS = ["response_cosine", "response_norm_ratio", "response_projection"]
#: Attention total variation at the final position (docs §11.6), mean over examples.
TV_COLUMNS = [f"tv_{c}" for c in TV_CONDITIONS]


# ----------------------------------------------------------------------------- primitives
def pooled_response_stats(dot: float, direct_sq: float, total_sq: float) -> tuple[float, ...]:
    """(cosine, norm ratio, projection coefficient) of pooled direct/total responses from
    Σ⟨Δ_d, Δ_t⟩, Σ‖Δ_d‖², Σ‖Δ_t‖² (docs §11.5); NaN where a denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cosine = np.divide(dot, np.sqrt(direct_sq * total_sq))
        ratio = np.sqrt(np.divide(direct_sq, total_sq))
        projection = np.divide(dot, total_sq)
    clean = [np.where(np.isfinite(v), v, np.nan) for v in (cosine, ratio, projection)]
    return tuple(clean)


def write_space_energies(M: np.ndarray, C: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Σ‖P_R δ‖² for every reader from the write-space Gram C = Σ cᵀc, c = Uᵀδ (δ ∈ Im U):
    with M = UᵀR (dim U, Σr) the stacked reader bases seen from U, column k captures
    m_kᵀ C m_k; the columns of one reader (``owner``) add up. Returns (n,)."""
    column = np.einsum("ak,ak->k", C @ M, M)
    return np.maximum(np.bincount(owner, weights=column, minlength=n), 0.0)


# ----------------------------------------------------------------------------- one pass
def _readers_of(layer: int, n_layer: int, n_head: int) -> list[tuple[int, int, str]]:
    return [
        (reader_layer, reader_head, X)
        for reader_layer in range(layer + 1, n_layer)
        for X in READ_TYPES
        for reader_head in range(n_head)
    ]


@torch.no_grad()
def _batch_pass(model, heads: Heads, clean, ref, correct, incorrect, U, acc) -> tuple:
    """Everything §11.2–11.6 needs from one batch of equal-length prompts, in one pass, with
    the KV-prefix forward of our GPT blocks (``forward_suffix``, ``after_z``, ``attn``; the
    registry's ``prefix_reuse`` and ``block_attention``).

    One clean forward caches, per layer, the residual entering the block, q, k, v, z and
    the attention output; one reference forward caches z. For each layer l: δ of every head
    (docs §11.2); check C8 (layer l's attention re-run from the cached clean residual with
    each head's z swapped, against clean + δ); the captured energies of every later reader;
    and ONE forward of all H δ-patched variants stacked as rows, resumed from block l with
    δ_h added to its attention output (the patched forward of check C9), recomputing only
    positions ≥ p (the batch's first clean/reference difference: before it δ = 0 and, by
    causality, every activation is the clean one; later layers attend to the cached clean
    keys/values there). Its q, k, v at every later layer give Δ_total; the reader re-run on
    x + δ_h gives Δ_direct (docs §11.5); both give the four TV conditions (docs §11.6).
    Returns (drops (B, L, H), C8 residual); sums go into ``acc``.
    """
    L, H = model.cfg.n_layer, model.cfg.n_head
    names = {
        kind: [site(layer, kind) for layer in range(L)]
        for kind in ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v",
                     "attn.hook_z", "hook_attn_out")
    }  # fmt: skip
    logits, cc = model.run_with_cache(clean, [n for v in names.values() for n in v], True)
    clean_ld = logit_difference(logits, correct, incorrect)
    _, rc = model.run_with_cache(ref, names["attn.hook_z"], last_only=True)
    B, T = clean.shape
    differ = (clean != ref).any(dim=0).nonzero()
    p = min(int(differ[0]) if len(differ) else T, T - 1)
    good, bad = correct.repeat(H), incorrect.repeat(H)  # row g·B + b: head g, example b
    drops = torch.empty(B, L, H, dtype=torch.float64, device=clean.device)
    c8, attn_scale = 0.0, 0.0
    logit_scale = float(logits.abs().max())

    def cached(kind: str, layer: int) -> torch.Tensor:
        return cc[names[kind][layer]]

    for layer in range(L):
        block = model.blocks[layer]
        z, z_ref = cached("attn.hook_z", layer), rc[names["attn.hook_z"][layer]]
        delta = head_perturbations(heads.write_maps(layer), z, z_ref)  # (B, T, H, D)
        # C8: the real z patch of layer l's attention against clean + δ
        x_in, out_clean = cached("hook_resid_pre", layer), cached("hook_attn_out", layer)
        for head in range(H):
            with model.hooks({names["attn.hook_z"][layer]: replace_head(head, z_ref[:, :, head])}):
                out = block.attn(x_in)
            residual = out.double() - out_clean.double() - delta[:, :, head]
            c8 = max(c8, float(residual.abs().max()))
        attn_scale = max(attn_scale, float(out_clean.abs().max()))
        acc.add_energies(layer, delta, U[layer])
        # the δ-patched forward, all heads stacked as rows
        start = T - 1 if layer == L - 1 else p
        S = T - start
        d_rows = delta[:, start:].permute(2, 0, 1, 3).flatten(0, 1)  # (H·B, S, D)
        x = x_in[:, start:].expand(H, B, S, -1).flatten(0, 1)
        z_rows = z[:, start:].expand(H, *z[:, start:].shape).flatten(0, 1)
        with model.hooks({names["hook_attn_out"][layer]: add_to(d_rows)}):
            x = block.after_z(x, z_rows)
        for j in range(layer + 1, L):
            seen: dict[str, torch.Tensor] = {}

            def saver(kind, seen=seen):
                def save(t):
                    seen[kind] = t

                return save

            hooks = {names[f"attn.hook_{c}"][j]: saver(c) for c in "qkv"}
            past_k, past_v = cached("attn.hook_k", j)[:, :p], cached("attn.hook_v", j)[:, :p]
            with model.hooks(hooks):
                x, _, _ = model.blocks[j].forward_suffix(x, past_k, past_v, last_only=j == L - 1)
            x_j = cached("hook_resid_pre", j)[:, p:]  # (B, S, D)
            shifted = (x_j.double() + delta[:, p:].permute(2, 0, 1, 3)).to(x_j.dtype)
            direct = heads.read(j, shifted.flatten(0, 1))  # 3 × (H·B, S, H, d)
            for c, X in enumerate(READ_TYPES):
                clean_x = cached(f"attn.hook_{X.lower()}", j)[:, p:].double()
                d_t = seen[X.lower()].double().reshape(H, B, *clean_x.shape[1:]) - clean_x
                d_d = direct[c].double().reshape(H, B, *clean_x.shape[1:]) - clean_x
                acc.add_responses(layer, j, c, d_d, d_t)
            # TV at the final position (docs §11.6): rows (H, B, heads, ...)
            q_clean, k_clean = cached("attn.hook_q", j)[:, -1], cached("attn.hook_k", j)
            a = attention_final(q_clean, k_clean)  # (B, H', T)

            def keys(suffix, k_clean=k_clean):
                prefix = k_clean[:, :p].expand(H, *k_clean[:, :p].shape)
                return torch.cat([prefix, suffix.reshape(H, B, -1, *k_clean.shape[2:])], dim=2)

            q_d, k_d = direct[0].reshape(H, B, S, H, -1)[:, :, -1], keys(direct[1])
            q_t, k_t = seen["q"].reshape(H, B, S, H, -1)[:, :, -1], keys(seen["k"])
            conditions = {
                "query": attention_final(q_d, k_clean.expand(H, *k_clean.shape)),
                "keys": attention_final(q_clean.expand(H, *q_clean.shape), k_d),
                "direct": attention_final(q_d, k_d),
                "total": attention_final(q_t, k_t),
            }
            for c, name in enumerate(TV_CONDITIONS):
                tv = total_variation(conditions[name], a[None]).sum(dim=1)  # (H, H')
                acc.tv[layer, :, j, :, c] += tv.cpu().numpy()
        logits = model.answer_logits(x, torch.stack([good, bad], dim=1)).double()
        drops[:, layer] = clean_ld[:, None] - (logits[:, 0] - logits[:, 1]).view(H, B).T
    return drops, c8, attn_scale, logit_scale


def leakage_table(
    model,
    inputs: PatchInputs,
    e_stored: np.ndarray,
    batch_size: int,
    device: torch.device,
    effects_path: str,
) -> Leakage:
    """Leakage of every source head into every later reader (module docstring), with the
    direct/total responses and attention TV of every pair (docs §11.5–11.6) from the same
    pass, and checks C8 and C9 against the stored effects ``e_stored`` (L, H).

    The pass resumes blocks with the KV-prefix forward where the registry declares it
    (``prefix_reuse`` and ``block_attention``: :func:`_batch_pass`), else runs whole forwards
    through the hook sites
    (:func:`headgeom.heads.analysis.leakage_hooked.hooked_pass`: any transformers causal LM). TV
    columns are null where a head's attention is not softmax(q·k/√d) of its hook_q/hook_k
    values (``Heads.attention_from_sites``: rotary positions, q/k norms)."""
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    heads = registry.heads_of(model)
    if heads.leakage_refusal is not None:
        raise ValueError(heads.leakage_refusal)
    arch = registry.architecture_of(model)
    run_pass = _batch_pass if arch.prefix_reuse and arch.block_attention else hooked_pass
    lengths = [len(x) for x in inputs.clean_ids]
    order = [first_difference(c, r) for c, r in zip(inputs.clean_ids, inputs.ref_ids, strict=True)]
    batches = length_batches(lengths, batch_size, order)
    correct = torch.as_tensor(inputs.correct, device=device)
    incorrect = torch.as_tensor(inputs.incorrect, device=device)
    U, R = write_bases(model), read_bases(model)
    readers = [_readers_of(layer, n_layer, n_head) for layer in range(n_layer)]
    bases = [[R[rl][X][rh] for rl, rh, X in readers[layer]] for layer in range(n_layer)]
    U_t = [[torch.as_tensor(u, device=device) for u in layer] for layer in U]
    acc = Sums.empty(n_layer, n_head, [[u.shape[1] for u in layer] for layer in U])

    def stack(ids: list[np.ndarray], index: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.stack([ids[i] for i in index]).astype(np.int64), device=device)

    drops = np.empty((len(inputs.clean_ids), n_layer, n_head))
    c8, attn_scale, logit_scale = 0.0, 0.0, 0.0
    for index in tqdm(batches, desc="leakage", unit="batch", file=sys.stderr):
        index_t = torch.as_tensor(index, device=device)
        d, residual, a_scale, l_scale = run_pass(
            model,
            heads,
            stack(inputs.clean_ids, index),
            stack(inputs.ref_ids, index),
            correct[index_t],
            incorrect[index_t],
            U_t,
            acc,
        )
        c8, attn_scale = max(c8, residual), max(attn_scale, a_scale)
        logit_scale = max(logit_scale, l_scale)
        drops[index] = d.cpu().numpy()

    dtype = model_dtype(model)
    c8 = Residual(c8, rounding_tolerance(dtype, attn_scale, C8_STAGES))
    c9 = Residual(
        float(np.max(np.abs(effects_from_drops(drops) - e_stored))),
        forward_tolerance(model, logit_scale),
    )
    if not c8.passed:
        raise ArithmeticError(
            f"check C8 failed: patched − clean attention output differs from δ by "
            f"{c8.value:.3g} > {c8.tolerance:.3g} (docs §11.2)"
        )
    if not c9.passed:
        raise ArithmeticError(
            f"check C9 failed: effects recomputed from δ differ from {effects_path} by "
            f"{c9.value:.3g} > {c9.tolerance:.3g} (docs §11.2)"
        )
    n_examples = len(inputs.clean_ids)
    records = []
    for layer in range(n_layer):
        if not readers[layer]:
            continue
        stacked = np.concatenate(bases[layer], axis=1)  # (D, Σr)
        widths = [b.shape[1] for b in bases[layer]]
        owner = np.repeat(np.arange(len(widths)), widths)
        for head in range(n_head):
            u, total = U[layer][head], acc.energy[layer, head]
            M = u.T @ stacked  # (dim U, Σr): the readers seen from the write space
            pk = np.bincount(owner, weights=np.sum(M * M, axis=0), minlength=len(widths))
            captured = write_space_energies(M, acc.gram[layer][head], owner, len(widths))
            leak = captured / total if total > 0 else np.full(len(widths), np.nan)
            for k, (rl, rh, X) in enumerate(readers[layer]):
                c = READ_TYPES.index(X)
                response = pooled_response_stats(
                    acc.dot[layer, head, rl, c, rh],
                    acc.direct_sq[layer, head, rl, c, rh],
                    acc.total_sq[layer, head, rl, c, rh],
                )
                records.append(
                    (
                        layer,
                        head,
                        rl,
                        rh,
                        X,
                        leak[k],
                        pk[k] / u.shape[1] if u.shape[1] else np.nan,
                        pk[k],
                        u.shape[1],
                        widths[k],
                        *(float(v) for v in response),
                        *(acc.tv[layer, head, rl, rh] / n_examples),
                    )
                )
    table = pd.DataFrame.from_records(
        records, columns=LEAKAGE_COLUMNS + RESPONSE_COLUMNS + TV_COLUMNS
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table["leakage"].to_numpy() / table["rho"].to_numpy()
    table["leakage_over_rho"] = np.where(np.isfinite(ratio), ratio, np.nan)
    if not heads.attention_from_sites:  # §11.6 is not recomputable from the sites
        table[TV_COLUMNS] = np.nan
    return Leakage(table, c8, c9)
