"""Clean-prompt logit differences (docs §0 "LD", §8.6) shared by evaluation and patching."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from headgeom.model.gpt import GPT


def length_groups(ids: Sequence[Sequence[int]]) -> dict[int, np.ndarray]:
    """Prompt length → indices of the prompts of that length (pad-free batching)."""
    lengths = np.array([len(seq) for seq in ids], dtype=np.int64)
    return {int(n): np.flatnonzero(lengths == n) for n in np.unique(lengths)}


@torch.no_grad()
def logit_differences(
    model: GPT,
    ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int = 256,
) -> np.ndarray:
    """LD = logit(correct) − logit(incorrect) at each prompt's final position, float64 (n,).

    ``ids`` are model-vocabulary ids (one sequence per prompt, lengths may differ: prompts
    are batched by equal length, never padded). The model runs in eval mode, fp32.
    """
    correct = np.asarray(correct, dtype=np.int64)
    incorrect = np.asarray(incorrect, dtype=np.int64)
    if not len(ids) == len(correct) == len(incorrect):
        raise ValueError(
            f"{len(ids)} prompts but {len(correct)} correct and {len(incorrect)} incorrect ids"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = np.empty(len(ids), dtype=np.float64)
    try:
        for length, index in length_groups(ids).items():
            if length < 1:
                raise ValueError("empty prompt")
            block = np.asarray([ids[i] for i in index], dtype=np.int64)  # (n, length)
            for start in range(0, len(index), batch_size):
                rows = index[start : start + batch_size]
                x = torch.from_numpy(block[start : start + batch_size]).to(device)
                logits = model(x, last_only=True).double()  # (b, V)
                pick = torch.arange(len(rows), device=device)
                ld = (
                    logits[pick, torch.from_numpy(correct[rows]).to(device)]
                    - logits[pick, torch.from_numpy(incorrect[rows]).to(device)]
                )
                out[rows] = ld.cpu().numpy()
    finally:
        model.train(was_training)
    return out


def clean_performance(ld: np.ndarray) -> dict[str, float | int]:
    """n, accuracy (fraction LD > 0) and margin (mean LD) of docs §8.6."""
    ld = np.asarray(ld, dtype=np.float64)
    if ld.size == 0:
        raise ValueError("no examples")
    return {"n": int(ld.size), "accuracy": float(np.mean(ld > 0)), "margin": float(np.mean(ld))}


#: Output order of the splits (any other split follows, sorted).
SPLIT_ORDER = ("discovery", "validation", "evaluation", "holdout")


def evaluate_splits(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    splits: Sequence[str],
    batch_size: int = 256,
) -> list[dict]:
    """Clean performance per split (docs §8.6, paper Table 5): one ``{"split", "n",
    "accuracy", "margin"}`` per split, the splits in :data:`SPLIT_ORDER`.

    ``clean_ids``, ``correct`` and ``incorrect`` are model ids of every example and
    ``splits`` each example's split; all examples run through one batched pass.
    """
    ld = logit_differences(model, clean_ids, correct, incorrect, batch_size=batch_size)
    split_of = np.asarray(splits, dtype=object)
    present = list(dict.fromkeys(split_of.tolist()))
    ordered = [s for s in SPLIT_ORDER if s in present] + sorted(set(present) - set(SPLIT_ORDER))
    return [{"split": s, **clean_performance(ld[split_of == s])} for s in ordered]
