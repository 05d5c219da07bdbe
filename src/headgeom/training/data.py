"""What each update reads (docs §3.2–§3.4, §7.2): the learning rate of step s, the batch
of step s in the corpus's data order, and the validation windows.

Both are pure functions of (data seed, step): a resumed run reads exactly the batches and
uses exactly the learning rates of one that never stopped.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from headgeom.run_config import TrainConfig

# Data orders (docs §3.2, §3.3), named by the corpus manifest's ``sampling`` field.
SAMPLINGS = ("with_replacement", "read_once")


# --------------------------------------------------------------------------- schedule
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of update ``step`` (docs §7.2): linear warmup from 0 to ``lr_max`` at
    ``warmup_steps``, then cosine (or linear) decay to ``lr_min`` at ``steps``."""
    if not 0 <= step <= cfg.steps:
        raise ValueError(f"step {step} outside [0, {cfg.steps}]")
    if step < cfg.warmup_steps:
        return cfg.lr_max * step / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        return cfg.lr_min + 0.5 * (cfg.lr_max - cfg.lr_min) * (1.0 + math.cos(math.pi * frac))
    return cfg.lr_max - (cfg.lr_max - cfg.lr_min) * frac


# --------------------------------------------------------------------------- batches
def sample_batch(
    tokens: np.ndarray, step: int, batch_size: int, n_ctx: int, data_seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random-offset windows (docs §3.2, corpus R): inputs ``tokens[o:o+n_ctx]``, targets
    shifted by one.

    Offsets are uniform on {0, …, N − n_ctx − 1} from ``default_rng([data_seed, step])``: a
    pure function of (data seed, step), so a resumed run draws exactly the same batches.
    Returns int64 tensors of shape (batch_size, n_ctx).
    """
    n = len(tokens)
    if n < n_ctx + 1:
        raise ValueError(f"token array of length {n} is shorter than one window ({n_ctx} + 1)")
    offsets = np.random.default_rng([data_seed, step]).integers(0, n - n_ctx, size=batch_size)
    buf = np.asarray(tokens)[offsets[:, None] + np.arange(n_ctx + 1)].astype(np.int64)
    buf = torch.from_numpy(buf)  # (B, n_ctx + 1)
    return buf[:, :-1], buf[:, 1:]


def read_once_batch(
    tokens: np.ndarray, step: int, batch_size: int, n_ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential windows (docs §3.3, corpus S): step s reads the buffer
    ``tokens[p : p + B·n_ctx + 1]`` with p = (s − 1)·B·n_ctx, inputs ``buf[:-1]`` and targets
    ``buf[1:]`` reshaped to (B, n_ctx). Consecutive steps share one boundary token (the
    previous step's last target is this step's first input); no window is read twice."""
    per_step = batch_size * n_ctx
    p = (step - 1) * per_step
    if step < 1 or p + per_step + 1 > len(tokens):
        raise ValueError(
            f"read-once step {step} needs tokens [{p}, {p + per_step + 1}) but the corpus has "
            f"{len(tokens)}"
        )
    buf = torch.from_numpy(np.asarray(tokens[p : p + per_step + 1]).astype(np.int64))
    return buf[:-1].view(batch_size, n_ctx), buf[1:].view(batch_size, n_ctx)


def tokens_needed(cfg: TrainConfig, n_ctx: int, sampling: str) -> int:
    """Smallest training corpus the data order can serve: one window (+1 target) with
    replacement; steps × batch_size × n_ctx + 1 read once (docs §3.3: 2^30 + 1)."""
    if sampling == "read_once":
        return cfg.steps * cfg.batch_size * n_ctx + 1
    return n_ctx + 1


def check_sampling(sampling: str, n_tokens: int, cfg: TrainConfig, n_ctx: int) -> None:
    """Fail before training when the data order is unknown or the corpus too small for it."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"corpus sampling {sampling!r} is not known; expected one of {SAMPLINGS}")
    need = tokens_needed(cfg, n_ctx, sampling)
    if n_tokens < need:
        how = (
            f"steps × batch_size × n_ctx + 1 = {cfg.steps} × {cfg.batch_size} × {n_ctx} + 1"
            if sampling == "read_once"
            else f"one window of n_ctx + 1 = {n_ctx} + 1"
        )
        raise ValueError(
            f"training corpus has {n_tokens:,} tokens but {sampling} sampling needs {how} = "
            f"{need:,}; build a larger corpus or train fewer steps"
        )


def batch_at(
    tokens: np.ndarray,
    step: int,
    batch_size: int,
    n_ctx: int,
    data_seed: int,
    sampling: str = "with_replacement",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of update ``step`` in the corpus's data order (pure in (seed, step))."""
    if sampling == "read_once":
        return read_once_batch(tokens, step, batch_size, n_ctx)
    if sampling == "with_replacement":
        return sample_batch(tokens, step, batch_size, n_ctx, data_seed)
    raise ValueError(f"corpus sampling {sampling!r} is not known; expected one of {SAMPLINGS}")


def validation_windows(val_ids: np.ndarray, n_ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ⌊(N−1)/n_ctx⌋ non-overlapping windows that cover the validation file, tail dropped
    (docs §3.4): inputs and next-token targets, int64 of shape (n_windows, n_ctx)."""
    n_windows = (len(val_ids) - 1) // n_ctx
    if n_windows < 1:
        raise ValueError(f"validation file of {len(val_ids)} tokens has no {n_ctx}-token window")
    ids = torch.from_numpy(np.asarray(val_ids[: n_windows * n_ctx + 1]).astype(np.int64))
    return ids[:-1].view(n_windows, n_ctx), ids[1:].view(n_windows, n_ctx)
