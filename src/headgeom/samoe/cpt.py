"""Continued pretraining of an upcycled SA-MoE (SAMOE §7): the same loop for all three
variants, so they differ only in the state.

Update s (1-based) draws its batch with the workspace's loader (random windows with
replacement, a pure function of (data seed, s): ``headgeom.training.data.sample_batch``),
sets every LR group for s (:mod:`headgeom.samoe.recipe`), and minimises next-token
cross-entropy plus the auxiliary losses (§5.3: load balance and z-loss, layer means, with
the config's coefficients), clipping the global gradient norm. The log has one row per
update with each part of the loss, each group's LR and the gradient norm before clipping.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F

from headgeom.samoe.config import CPTConfig
from headgeom.samoe.model import SAMoE
from headgeom.samoe.recipe import make_optimizer, set_lrs
from headgeom.training.data import sample_batch


def objective(
    model: SAMoE, x: torch.Tensor, y: torch.Tensor, cpt: CPTConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one batch and its parts (floats, for the log)."""
    logits, aux = model(x, return_aux=True)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    total = ce + cpt.aux.load_balance * aux.load_balance + cpt.aux.z_loss * aux.z_loss
    parts = {
        "loss": ce.item(),
        "load_balance": aux.load_balance.item(),
        "z_loss": aux.z_loss.item(),
        "total_loss": total.item(),
    }
    return total, parts


def continued_pretraining(
    model: SAMoE,
    tokens: np.ndarray,
    cpt: CPTConfig,
    data_seed: int,
    on_step: Callable[[int, dict], None] | None = None,
) -> pd.DataFrame:
    """Train ``model`` in place for ``cpt.steps`` updates on ``tokens``; the log."""
    model.train()
    opt = make_optimizer(model, cpt)
    n_ctx = model.cfg.n_ctx
    rows = []
    for step in range(1, cpt.steps + 1):
        lrs = set_lrs(opt, step, cpt)
        x, y = sample_batch(tokens, step, cpt.batch_size, n_ctx, data_seed)
        loss, parts = objective(model, x, y, cpt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cpt.grad_clip)
        opt.step()
        row = {"step": step, **parts, "grad_norm": float(grad_norm),
               **{f"lr_{group}": lr for group, lr in lrs.items()}}  # fmt: skip
        rows.append(row)
        if on_step is not None:
            on_step(step, row)
    model.eval()
    return pd.DataFrame(rows)
