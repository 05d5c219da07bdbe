"""Training dynamics of lanes and value self-alignment (docs §13.2, §13.4, §14.2, §14.4).

* :func:`task_gradients` — τ_l = ∂ mean LD / ∂ (layer l's attention output) at every position
  of every prompt (docs §13.4), and :func:`tau_summary` its adjacent-layer cosines,
  same-index (and different-index) projected cosines and the gradient lane share;
* :func:`value_gradient_traces` — per head, whether |tr(G_h O_h)| is the largest of the
  layer's |tr(G_h O_j)| for G_h = ∂L_LM/∂W_V^h (docs §14.4), and :func:`scalar_signs`;

The scalar-part ablation of §14.5 is :mod:`headgeom.heads.analysis.scalar_ablation`.

Every function reads the model through the geometry API (``writer.write_maps()``,
``reader.read_maps("V")``) and named sites (``blocks.{l}.hook_attn_out``), never a geometry
name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F

from headgeom import results
from headgeom.heads.analysis.evaluation import length_groups
from headgeom.heads.analysis.weightspace import head_maps, head_spaces
from headgeom.io import read_parquet_metadata, read_table
from headgeom.model.gpt import site

# ----------------------------------------------------------------------------- τ (§13.4)


def task_gradients(
    model, ids: Sequence[Sequence[int]], correct: Sequence[int], incorrect: Sequence[int]
) -> list[np.ndarray]:
    """τ_l for every layer l: (Σ_i T_i, D) float64, the gradient of the *mean* logit
    difference over the prompts with respect to ``blocks.{l}.hook_attn_out`` (Σ_h W_O z + b_O
    before the residual add), prompts in input order and positions in order, flattened.
    Prompts are batched by length (never padded); the model's parameters get no gradient."""
    n, n_layer = len(ids), len(model.blocks)
    correct = np.asarray(correct, dtype=np.int64)
    incorrect = np.asarray(incorrect, dtype=np.int64)
    device = next(model.parameters()).device
    per_example: list[list[np.ndarray | None]] = [[None] * n for _ in range(n_layer)]
    was_training = model.training
    model.eval()
    try:
        for _, index in length_groups(ids).items():
            x = torch.as_tensor(np.asarray([ids[i] for i in index]), device=device)
            saved: dict[int, torch.Tensor] = {}

            def keep(layer: int, saved: dict = saved):
                def fn(a: torch.Tensor) -> None:
                    saved[layer] = a

                return fn

            with (
                torch.enable_grad(),
                model.hooks(
                    {site(layer, "hook_attn_out"): keep(layer) for layer in range(n_layer)}
                ),
            ):
                logits = model(x, last_only=True)
                pick = torch.arange(len(index), device=device)
                ld = (
                    logits[pick, torch.as_tensor(correct[index], device=device)]
                    - logits[pick, torch.as_tensor(incorrect[index], device=device)]
                )
                grads = torch.autograd.grad(ld.sum() / n, [saved[k] for k in range(n_layer)])
            for layer, g in enumerate(grads):
                g = g.detach().cpu().double().numpy()
                for row, i in enumerate(index):
                    per_example[layer][i] = g[row]
    finally:
        model.train(was_training)
    return [np.concatenate(rows, axis=0) for rows in per_example]


def _mean(values: Sequence[float], how=np.mean) -> float:
    """``how`` of the defined (non-NaN) values; NaN when none is."""
    kept = [v for v in values if v == v]
    return float(how(kept)) if kept else float("nan")


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(np.sum(a * b) / (na * nb)) if na > 0 and nb > 0 else float("nan")


def tau_summary(
    taus: Sequence[np.ndarray],
    write_bases: Sequence[Sequence[np.ndarray]],
    write_maps: np.ndarray,
    lane_index: int | None,
) -> dict:
    """The docs §13.4 statistics of one checkpoint's τ_l.

    ``write_bases[l][h]``: orthonormal (D, r) basis of U^{l,h} (P_{l,h} = U Uᵀ, applied
    position-wise); ``write_maps`` (L, H, D, d): W_O^{l,h} (internal coordinates W_Oᵀτ).
    Same-index projected cosine: cos(P_{l,h}τ_l, P_{l',h}τ_{l'}) averaged over layer pairs
    l < l' and heads h; different-index: the same with heads h ≠ k (zero by geometry where
    write spaces are shared and orthogonal across indices). The internal-coordinate cosines
    compare (W_O^{l,h})ᵀτ_l with (W_O^{l',k})ᵀτ_{l'} (k = h, or k ≠ h). Lane share of head
    index h: ‖P_{l,h}τ_l‖²/‖τ_l‖² averaged over layers (uniform: 1/H)."""
    n_layer, n_head = len(taus), len(write_bases[0])
    proj = [[t @ U @ U.T for U in layer] for t, layer in zip(taus, write_bases, strict=True)]
    coords = [
        [taus[layer] @ write_maps[layer, h] for h in range(n_head)] for layer in range(n_layer)
    ]
    adjacent = [_cos(taus[layer], taus[layer + 1]) for layer in range(n_layer - 1)]
    same, other, same_c, other_c = [], [], [], []
    for a in range(n_layer):
        for b in range(a + 1, n_layer):
            for h in range(n_head):
                for k in range(n_head):
                    (same if h == k else other).append(_cos(proj[a][h], proj[b][k]))
                    (same_c if h == k else other_c).append(_cos(coords[a][h], coords[b][k]))
    norms = np.array([np.sum(t * t) for t in taus])
    share = np.array(
        [[np.sum(proj[layer][h] ** 2) / norms[layer] for h in range(n_head)]
         for layer in range(n_layer)]
    )  # fmt: skip
    by_index = share.mean(axis=0)
    out = {
        "n_positions": int(taus[0].shape[0]),
        "adjacent_cosine_mean": _mean(adjacent),
        "adjacent_cosine_min": _mean(adjacent, np.min),
        "adjacent_cosine_max": _mean(adjacent, np.max),
        "same_index_cosine": _mean(same),
        "different_index_cosine": _mean(other),
        "same_index_internal_cosine": _mean(same_c),
        "different_index_internal_cosine": _mean(other_c),
        "lane_index": lane_index,
        "lane_share": float(by_index[lane_index]) if lane_index is not None else float("nan"),
        "lane_share_max_other": float(np.delete(by_index, lane_index).max())
        if lane_index is not None and n_head > 1
        else float("nan"),
        "lane_share_chance": 1.0 / n_head,
    }
    return out


def final_lane_index(heads: pd.DataFrame, split: str, top: int = 3) -> int:
    """The head index holding most of the top-``top`` heads by ``split`` effect (ties: the
    index of the best of the tied; heads ranked as tables/lane_heads ranks them: e, then
    layer, head), the "final SVA lane index" of docs §13.4. ``heads``: results.HEADS rows."""
    rows = heads[heads["split"] == split]
    if rows.empty:
        raise ValueError(f"no {split!r} rows in the heads table")
    best = rows.sort_values(["e", "layer", "head"], ascending=[False, True, True]).head(top)
    counts = best["head"].value_counts()
    tied = set(counts[counts == counts.max()].index)
    return int(next(h for h in best["head"] if h in tied))


# ----------------------------------------------------------------------------- V-gradients (§14.4)
def _reader_grads(reader, loss_grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """``reader.read_maps("V")`` evaluated at the gradient: read maps are a linear selection
    of the reader's parameters (W_V^h is a block of W_V), so putting each parameter's
    gradient in its place and reading the map again gives ∂L/∂W_V^h (H, d, D)."""
    params = list(reader.parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p, g in zip(params, loss_grads, strict=True):
                p.copy_(g)
            return reader.read_maps("V").detach().double().clone()
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


def lm_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of ``inputs`` (B, T) against ``targets``."""
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # fp32 models: fp32


def value_gradient_traces(
    model, inputs: torch.Tensor, targets: torch.Tensor, chunk: int | None = None
) -> pd.DataFrame:
    """One row per (layer, head): tr(G_h O_j) for every j of the layer (``traces``), the own
    term, the largest other |tr| and ``own_largest`` (|tr(G_h O_h)| > every other), for
    G_h = ∂L/∂W_V^h of the LM loss on ``inputs``/``targets`` (docs §14.4). O_j is the
    forward pass's write block; a frozen write's gain g is one scalar per model, so it
    scales every term of a layer alike and no comparison changes.

    The gradient of the mean loss over all B·T tokens is accumulated over ``chunk``
    sequences at a time (default all): Σ_c (B_c/B)·∂L_c. Peak memory beyond the model is
    that of one chunk's backward, about c·T·(L·(12·D + 3·d_mlp + 3·H·T) + 3·V)·s bytes
    (saved activations per layer, then the logits, their softmax and its gradient; s the
    dtype's size): 1.2 GB a sequence at the paper's shape (T = 512, V = 50,257, float32),
    against 39 GB for the paper's 32 sequences at once."""
    model.eval()
    readers = [block.attn.reader for block in model.blocks]
    params = [list(r.parameters()) for r in readers]
    wanted = [p for ps in params for p in ps]
    n = len(inputs)
    chunk = n if chunk is None else max(1, chunk)
    flat: list[torch.Tensor | None] = [None] * len(wanted)
    for start in range(0, n, chunk):
        part = slice(start, start + chunk)
        with torch.enable_grad():
            loss = lm_loss(model, inputs[part], targets[part]) * (len(inputs[part]) / n)
            grads = torch.autograd.grad(loss, wanted, allow_unused=True)
        flat = [g if f is None else (f if g is None else f + g)
                for f, g in zip(flat, grads, strict=True)]  # fmt: skip
    rows, at = [], 0
    for layer, (block, reader, ps) in enumerate(zip(model.blocks, readers, params, strict=True)):
        grads = [g if g is not None else torch.zeros_like(p)
                 for g, p in zip(flat[at : at + len(ps)], ps, strict=True)]  # fmt: skip
        at += len(ps)
        G = _reader_grads(reader, grads).numpy()  # (H, d, D)
        with torch.no_grad():
            W_O = block.attn.writer.write_maps().detach().double().numpy()  # (H, D, d)
        traces = np.einsum("hdD,jDd->hj", G, W_O)  # tr(G_h O_j)
        for h in range(traces.shape[0]):
            others = np.abs(np.delete(traces[h], h))
            rows.append(
                {
                    "layer": layer,
                    "head": h,
                    "own_trace": float(traces[h, h]),
                    "max_other_abs_trace": float(others.max()) if others.size else float("nan"),
                    "own_largest": bool(others.size == 0 or abs(traces[h, h]) > others.max()),
                }
            )
    return pd.DataFrame(rows)


def scalar_signs(model) -> pd.DataFrame:
    """tr(V_hᵀ O_h) = tr(W_V^h O_h) of every head (the scalar part of its own-block value
    map up to the width), one row per (layer, head)."""
    rows = []
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            V = block.attn.reader.read_maps("V").double()  # (H, d, D)
            W_O = block.attn.writer.write_maps().double()  # (H, D, d)
            tr = torch.einsum("hdD,hDd->h", V, W_O).numpy()
            rows += [
                {"layer": layer, "head": h, "scalar_trace": float(t)} for h, t in enumerate(tr)
            ]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- tables
def _head_bases(model) -> tuple[list[list[np.ndarray]], np.ndarray]:
    maps = head_maps(model)
    return head_spaces(maps).write, maps.write


def _step_fields(step: int, manifest: dict, final_step: int) -> dict:
    return {"step": int(step), "is_final": int(step) == int(final_step),
            "checkpoint_sha256": manifest["checkpoint_file_sha256"]}  # fmt: skip


def tau_table(checkpoints, sva, lane_index: int, final_step: int) -> pd.DataFrame:
    """One results.TAU row per ``checkpoints`` entry ``(step, model, manifest)``; ``sva`` is
    the SVA evaluation-split PatchInputs."""
    rows = []
    for step, model, manifest in checkpoints:
        taus = task_gradients(model, sva.clean_ids, sva.correct, sva.incorrect)
        bases, maps = _head_bases(model)
        rows.append({**_step_fields(step, manifest, final_step), "n_examples": len(sva.clean_ids),
                     **tau_summary(taus, bases, maps, lane_index)})  # fmt: skip
    return pd.DataFrame(rows)


def value_gradient_table(
    checkpoints, inputs, targets, final_step: int, chunk: int | None = None
) -> pd.DataFrame:
    """results.VALUE_GRADIENTS rows of every ``(step, model, manifest)`` (``chunk``: see
    :func:`value_gradient_traces`)."""
    frames = []
    for step, model, manifest in checkpoints:
        traces = value_gradient_traces(model, inputs, targets, chunk)
        traces = traces.merge(scalar_signs(model), on=["layer", "head"], validate="one_to_one")
        for key, value in _step_fields(step, manifest, final_step).items():
            traces[key] = value
        traces["n_tokens"] = int(inputs.numel())
        frames.append(traces)
    return pd.concat(frames, ignore_index=True)


def timeline_table(entries, final_step: int, lane_split: str) -> pd.DataFrame:
    """One results.TIMELINE row per ``(step, manifest, eval, lanes, geometry)``: the SVA
    evaluation accuracy, Λ and p on ``lane_split``, own-best and median P(T_h), each Parquet
    refused unless it was computed from that step's checkpoint (its provenance)."""

    rows = []
    for step, manifest, eval_path, lanes_path, geometry_path in entries:
        sha = manifest["checkpoint_file_sha256"]
        for path in (eval_path, lanes_path, geometry_path):
            meta = read_parquet_metadata(path)
            results.require_provenance(meta, {results.CHECKPOINT_SHA256: sha}, path)
        ev = read_table(eval_path).to_pandas()
        ev = ev[(ev["task"] == "sva") & (ev["split"] == "evaluation")]
        lanes = read_table(lanes_path).to_pandas()
        lanes = lanes[(lanes["task"] == "sva") & (lanes["split"] == lane_split)]
        geo = read_table(geometry_path).to_pandas()
        if len(ev) != 1 or len(lanes) != 1 or len(geo) != 1:
            raise ValueError(
                f"step {step}: expected one SVA evaluation row in {eval_path}, one SVA "
                f"{lane_split} row in {lanes_path} and one row in {geometry_path}"
            )
        ev, lanes, geo = ev.iloc[0], lanes.iloc[0], geo.iloc[0]
        rows.append(
            {
                "model": manifest["model_name"],
                "seed": int(manifest["init_seed"]),
                **_step_fields(step, manifest, final_step),
                "tokens_seen": int(manifest["tokens_seen"]),
                "val_loss": float(manifest["val_loss_nats"]),
                "sva_accuracy": float(ev["accuracy"]),
                "sva_margin": float(ev["margin"]),
                "sva_n": int(ev["n"]),
                "lambda_score": lanes["lambda_score"],
                "lambda_p": lanes["p_value"],
                "lane_split": lane_split,
                "chance": float(lanes["chance"]),
                **{k: float(geo[k]) for k in ("own_best_fraction", "own_best_fraction_layer0",
                                               "rho_self_mean", "idempotence_median")},
            }
        )  # fmt: skip
    return pd.DataFrame(rows)
