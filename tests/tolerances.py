"""Tolerances of the unit tests' comparisons of two floating-point routes to one value (an
engine against a naive loop, a resumed forward against a full one, batched against one at a
time, ours against TransformerLens or transformers): from the dtype's epsilon, the largest
magnitude on the compared path and the number of rounded stages between the point where the
routes part and the output (``headgeom.heads.analysis.tolerance``, docs §18), never an absolute
float32 number, which holds for one CPU's kernels and model size and not for another's."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from headgeom.heads.analysis.tolerance import forward_tolerance, model_dtype, rounding_tolerance


def largest(*values) -> float:
    """The largest |entry| over tensors, arrays and numbers: the scale of a comparison."""
    out = 0.0
    for v in values:
        if torch.is_tensor(v):
            v = v.detach().cpu().double().numpy()
        out = max(out, float(np.max(np.abs(np.asarray(v, dtype=np.float64)))))
    return out


def _batches(prompts) -> Iterable[torch.Tensor]:
    """(B, T) id tensors from a (B, T) tensor or array, or a list of 1-D id sequences of any
    lengths (one batch per length)."""
    if torch.is_tensor(prompts) or (isinstance(prompts, np.ndarray) and prompts.ndim == 2):
        yield torch.as_tensor(prompts, dtype=torch.int64)
        return
    by_length: dict[int, list] = {}
    for x in prompts:
        by_length.setdefault(len(x), []).append(np.asarray(x, dtype=np.int64))
    for rows in by_length.values():
        yield torch.as_tensor(np.stack(rows))


@torch.no_grad()
def logit_scale(model: torch.nn.Module, *prompts) -> float:
    """The largest |final-position logit| of ``model`` (whole vocabulary) over every prompt
    of each of ``prompts`` (see :func:`_batches`)."""
    return max(
        float(model(ids, last_only=True).abs().max()) for p in prompts for ids in _batches(p)
    )


def patch_tolerance(model: torch.nn.Module, clean, ref, from_layer: int = 0) -> float:
    """Tolerance of two routes to the clean and patched logit differences of ``clean`` /
    ``ref`` prompts that part at block ``from_layer`` (block 0 where batching, chunking or
    prefix reuse differ): one stage per block from there plus the unembedding, at the largest
    |logit| of the clean and the reference forwards."""
    return forward_tolerance(model, logit_scale(model, clean, ref), from_layer)


def peer_tolerance(model: torch.nn.Module, scale: float) -> float:
    """Tolerance of ``model`` against an independent implementation of the same weights
    (transformers, TransformerLens): the two share no kernel from the embeddings on (their
    LayerNorm, attention, GELU and W_O sums are their own), so the roundings of both routes'
    L + 1 stages count: 2 (L + 1) stages at the largest |logit| ``scale``."""
    return rounding_tolerance(model_dtype(model), scale, 2 * (model.cfg.n_layer + 1))


def peer_patch_tolerance(model: torch.nn.Module, clean, ref) -> float:
    """:func:`peer_tolerance` of the clean and patched logit differences of ``clean`` /
    ``ref`` prompts, at the largest |logit| of their forwards."""
    return peer_tolerance(model, logit_scale(model, clean, ref))
