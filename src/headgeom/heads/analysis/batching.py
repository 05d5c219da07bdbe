"""How every patching engine feeds a model: examples grouped by equal length (no padding
ever enters a forward pass), batches of token ids on the model's device, and results
scattered back into input order. The engines of :mod:`headgeom.heads.analysis.patching`,
:mod:`~headgeom.heads.analysis.clamps`, :mod:`~headgeom.heads.analysis.edges`,
:mod:`~headgeom.heads.analysis.coordinates` and :mod:`~headgeom.heads.analysis.leakage` share it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from headgeom.heads.analysis.evaluation import length_groups


def length_batches(
    lengths: Sequence[int], batch_size: int, order: Sequence[int] | None = None
) -> list[np.ndarray]:
    """Indices of examples grouped by equal length (``evaluation.length_groups``), in chunks
    of at most ``batch_size``.

    Groups come in increasing length, examples within a group in their original order (or
    stably sorted by ``order``, e.g. the first differing position, so a batch shares a long
    common prefix), so the batching (and therefore every float) is a deterministic function
    of the inputs. ``order`` never changes the number of batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    groups = length_groups([range(n) for n in lengths])
    if order is not None:
        key = np.asarray(order)
        groups = {n: m[np.argsort(key[m], kind="stable")] for n, m in groups.items()}
    return [
        members[start : start + batch_size]
        for _, members in sorted(groups.items())
        for start in range(0, len(members), batch_size)
    ]


def first_difference(clean: Sequence[int], ref: Sequence[int]) -> int:
    """Index of the first token where ``clean`` and ``ref`` differ (their length if none).

    With causal attention every activation before it is the same in both runs, so a patch
    of z changes nothing there (z_ref − z = 0)."""
    a, b = np.asarray(clean), np.asarray(ref)
    differ = np.flatnonzero(a != b)
    return int(differ[0]) if len(differ) else len(a)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's parameters: where every batch is placed."""
    return next(model.parameters()).device


def stack_rows(
    ids: Sequence[Sequence[int]], index: np.ndarray, device: torch.device
) -> torch.Tensor:
    """The prompts ``ids[index]`` (all of one length) as one (B, T) int64 tensor."""
    return torch.as_tensor(
        np.stack([np.asarray(ids[i], dtype=np.int64) for i in index]), device=device
    )


def check_pairs(clean_ids: Sequence, ref_ids: Sequence, *per_example: Sequence) -> list[int]:
    """Each example's prompt length, after checking that clean and reference prompts pair
    up (equal, non-zero lengths) and that every per-example array has one entry each."""
    n = len(clean_ids)
    if len(ref_ids) != n or any(len(a) != n for a in per_example):
        raise ValueError(
            f"clean ({n}), reference ({len(ref_ids)}) and answer arrays "
            f"({[len(a) for a in per_example]}) must have one entry per example"
        )
    lengths = []
    for i, (clean, ref) in enumerate(zip(clean_ids, ref_ids, strict=True)):
        if len(clean) != len(ref) or len(clean) == 0:
            raise ValueError(
                f"example {i}: clean and reference prompts must be non-empty and of equal "
                f"length (docs §8.1), got {len(clean)} and {len(ref)} tokens"
            )
        lengths.append(len(clean))
    return lengths


def patch_in_batches(
    model,
    clean_ids,
    ref_ids,
    correct,
    incorrect,
    batch_size,
    progress,
    run,
    order=None,
    shape=None,
):
    """Group examples by length, run ``run(model, clean, ref, correct, incorrect, progress)``
    on each batch and scatter its ``(clean_ld, patched_ld)`` back into input order.
    ``order(clean_ids, ref_ids)``, if given, sorts examples within a length group; ``shape``
    is one example's patched_ld shape (default: one value per head, (L, H))."""
    lengths = check_pairs(clean_ids, ref_ids, correct, incorrect)
    key = None if order is None else order(clean_ids, ref_ids)
    device = model_device(model)
    n = len(lengths)
    clean_ld = np.empty(n, dtype=np.float64)
    shape = (model.cfg.n_layer, model.cfg.n_head) if shape is None else tuple(shape)
    patched_ld = np.empty((n, *shape), dtype=np.float64)
    correct_t = torch.as_tensor(np.array(correct, dtype=np.int64), device=device)
    incorrect_t = torch.as_tensor(np.array(incorrect, dtype=np.int64), device=device)
    for index in length_batches(lengths, batch_size, key):
        index_t = torch.as_tensor(index, device=device)
        ld, patched = run(
            model,
            stack_rows(clean_ids, index, device),
            stack_rows(ref_ids, index, device),
            correct_t[index_t],
            incorrect_t[index_t],
            progress,
        )
        clean_ld[index] = ld.cpu().numpy()
        patched_ld[index] = patched.cpu().numpy()
    return clean_ld, patched_ld
