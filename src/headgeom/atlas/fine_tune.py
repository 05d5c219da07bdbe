"""Checkpoint B of a two-checkpoint pair made cheaply from a demo model A: a copy of A after a
few AdamW updates on one task's prompts (the answer token at each prompt's final position),
so the blend dial, grafts and drift have a base and a fine-tuned model of one lineage.

Deterministic on CPU: the batches are drawn (with replacement) from a generator seeded
``seed``, the learning rate is constant, and frozen buffers are never updated.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def answer_loss(model: nn.Module, prompts: Sequence[Sequence[int]], answers: torch.Tensor):
    """Mean cross-entropy of ``answers`` (n,) at the final positions of ``prompts`` (n id
    sequences, any lengths: one forward per length)."""
    lengths = np.array([len(p) for p in prompts])
    total = 0.0
    for n in np.unique(lengths):
        rows = np.flatnonzero(lengths == n)
        ids = torch.as_tensor(np.asarray([prompts[i] for i in rows], dtype=np.int64))
        logits = model(ids, last_only=True)  # (rows, V)
        total = total + F.cross_entropy(logits.float(), answers[rows], reduction="sum")
    return total / len(prompts)


def fine_tune(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[int],
    *,
    steps: int,
    lr: float,
    batch_size: int = 32,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    seed: int = 0,
) -> tuple[nn.Module, np.ndarray]:
    """(a fine-tuned copy of ``model``, the training loss of each step): ``steps`` AdamW
    updates at learning rate ``lr`` on batches of ``batch_size`` (prompt, answer) pairs, the
    cross-entropy of the answer at the prompt's final position; weight decay on tensors of
    rank ≥ 2, gradients clipped at global norm ``grad_clip``. ``model`` is left unchanged."""
    if len(prompts) != len(answers) or not prompts:
        raise ValueError(f"{len(prompts)} prompts and {len(answers)} answers: need equal, > 0")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps ({steps}) and batch_size ({batch_size}) must be positive")
    tuned = copy.deepcopy(model).train()
    params = [p for p in tuned.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr)
    gen = torch.Generator().manual_seed(int(seed))
    targets = torch.as_tensor(np.asarray(answers, dtype=np.int64))
    losses = np.empty(steps)
    for step in range(steps):
        rows = torch.randint(0, len(prompts), (batch_size,), generator=gen).tolist()
        loss = answer_loss(tuned, [prompts[i] for i in rows], targets[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        losses[step] = float(loss.detach())
    return tuned.eval(), losses
