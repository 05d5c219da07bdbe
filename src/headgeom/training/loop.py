"""The training loop (docs §7): the seeded step-0 model, the validation loss, and
``train``, the AdamW loop that calls back at every intermediate checkpoint and keeps the
resumable state; and the train log it returns (one row per update)."""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F
from tqdm import tqdm

from headgeom.model import registry
from headgeom.model.gpt import GPT
from headgeom.run_config import RunConfig, TrainConfig, checkpoint_schedule, parse_run_config
from headgeom.training.data import batch_at, check_sampling, lr_at, validation_windows
from headgeom.training.preemption import Preempted
from headgeom.training.state import (
    Progress,
    Resume,
    discard_partial_writes,
    load_resume_state,
    save_resume_state,
)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (docs §7.2: before model construction)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def initial_model(config: Mapping | RunConfig, n_vocab: int) -> torch.nn.Module:
    """The step-0 model of a run: the RNGs seeded from ``seed``, then the model built by the
    model package's builder (same bytes each time: docs §7.3)."""
    run = config if isinstance(config, RunConfig) else parse_run_config(config)
    seed_everything(run.seed)
    return registry.build_model(run.model_config(n_vocab))


# --------------------------------------------------------------------------- validation
def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def _full_fp32_matmuls() -> Iterator[None]:
    """Plain fp32 matmuls (no TF32) inside: validation is a float32 measurement (§3.4)."""
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


@torch.no_grad()
def validation_loss(model: GPT, val_ids: np.ndarray, n_ctx: int, batch_size: int) -> float:
    """Mean next-token cross-entropy in nats over the validation windows (docs §3.4,
    ``validation_windows``); float32 forward, float64 sum."""
    inputs, targets = validation_windows(val_ids, n_ctx)
    n_windows = len(inputs)
    device = _device_of(model)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    try:
        with _full_fp32_matmuls():
            for start in range(0, n_windows, batch_size):
                x = inputs[start : start + batch_size].to(device)
                y = targets[start : start + batch_size].to(device)
                logits = model(x).float()
                ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
                total += ce.double().sum()
    finally:
        model.train(was_training)
    return float(total.item() / (n_windows * n_ctx))


# --------------------------------------------------------------------------- loop
@dataclass
class TrainResult:
    log: pd.DataFrame  # one row per update: step, tokens, loss, lr, grad_norm, seconds, val_loss
    val_loss: float  # final validation loss in nats, unrounded
    device: str
    precision: str  # "fp32" or "bf16" (autocast), as resolved from TrainConfig.precision
    seconds: float  # wall-clock training time, validation and checkpoint writes excluded
    checkpoints: dict[int, Any] = field(default_factory=dict)  # step -> on_checkpoint's record
    resumed_from: int = 0  # step of the resumable state the run started from (0: fresh)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but torch sees no CUDA device")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "bf16" and device.type != "cuda":
        raise ValueError("training config: precision='bf16' needs a CUDA device; use fp32/auto")
    return precision


def make_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (frozen bases are buffers, never seen here);
    the fused CUDA kernel on GPUs."""
    return torch.optim.AdamW(
        model.optim_groups(cfg.weight_decay),
        lr=lr_at(0, cfg),
        betas=cfg.betas,
        eps=cfg.eps,
        **({"fused": True} if device.type == "cuda" else {}),
    )


def configure_matmuls(device: torch.device, precision: str) -> None:
    """TF32 only where it is harmless: in a bf16-autocast run (whose matmuls are bf16
    already) for whatever matmul autocast leaves in fp32; an fp32 run stays exact fp32, and
    validation always switches it off (``validation_loss``)."""
    if device.type == "cuda":
        on = precision == "bf16"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on


def optimizer_step(
    forward: Callable[[torch.Tensor], torch.Tensor],
    opt: torch.optim.Optimizer,
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    grad_clip: float,
    autocast: contextlib.AbstractContextManager,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One AdamW update on the batch (x, y): forward under ``autocast``, fp32 cross-entropy,
    backward, clip at global norm ``grad_clip``, step with learning rate ``lr``. Returns the
    loss and the pre-clip gradient norm as device tensors (no host sync)."""
    with autocast:
        logits = forward(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return loss.detach(), grad_norm


OnCheckpoint = Callable[[int, torch.nn.Module, float], dict]


def train(
    model: GPT,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    cfg: TrainConfig,
    *,
    data_seed: int,
    sampling: str = "with_replacement",
    progress: bool = True,
    device: str | torch.device | None = None,
    resume: Resume | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    stop: Callable[[], str | None] | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` AdamW updates (docs §7).

    Weight decay goes to tensors of rank ≥ 2 (``model.optim_groups``); frozen bases are
    buffers, so AdamW never sees them. Gradients are clipped at global norm ``grad_clip``.
    Validation runs every ``eval_every`` steps, at every checkpoint step and after the last
    step. ``on_checkpoint(step, model, val_loss)`` is called at step 0 and at every step of
    :func:`checkpoint_schedule`; the JSON record it returns is kept (and saved in the
    resumable state). With ``resume``, the state is written every ``resume_every`` steps and
    at the final step, and a state found at ``resume.path`` is continued from. ``stop()``
    is read after every update: when it names a signal (headgeom.training.preemption), the
    state is written and :class:`Preempted` raised, so a rerun redoes no update. On CPU the
    run is deterministic: same model bytes, ids, config and thread count ⇒ same weights,
    with or without interruptions.
    """
    device = resolve_device(device)
    precision = resolve_precision(cfg.precision, device)
    n_ctx = model.cfg.n_ctx
    check_sampling(sampling, len(train_ids), cfg, n_ctx)
    configure_matmuls(device, precision)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(model, cfg, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    forward = torch.compile(model) if cfg.compile else model

    steps = cfg.steps
    schedule = set(checkpoint_schedule(cfg))
    lrs = np.array([lr_at(s, cfg) for s in range(1, steps + 1)])
    state = Progress.empty(steps, device)
    if resume is not None:
        discard_partial_writes(resume.path)
        if resume.path.exists():
            load_resume_state(resume, model, opt, state)
            model.train()
            print(f"resumed from {resume.path} after step {state.step}", file=sys.stderr)
    resumed_from = state.step
    overhead = 0.0  # validation, checkpoint and state writes: not training time
    offset = float(state.seconds[resumed_from - 1]) if resumed_from else 0.0
    start = time.perf_counter()

    def evaluate() -> float:
        return validation_loss(model, val_ids, n_ctx, cfg.eval_batch_size)

    if resumed_from == 0 and 0 in schedule and on_checkpoint is not None:
        t0 = time.perf_counter()
        state.checkpoints[0] = on_checkpoint(0, model, evaluate())
        model.train()
        overhead += time.perf_counter() - t0

    every = max(1, steps // 100)  # refresh the progress bar's loss 100 times per run
    bar = tqdm(
        range(resumed_from + 1, steps + 1),
        initial=resumed_from,
        total=steps,
        desc="train",
        unit="step",
        file=sys.stderr,
        disable=not progress,
        mininterval=1.0 if sys.stderr.isatty() else 15.0,
        dynamic_ncols=True,
    )
    for step in bar:
        x, y = batch_at(train_ids, step, cfg.batch_size, n_ctx, data_seed, sampling)
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss, grad_norm = optimizer_step(
            forward, opt, params, x, y, float(lrs[step - 1]), cfg.grad_clip, autocast
        )
        state.loss[step - 1], state.grad_norm[step - 1] = loss, grad_norm
        state.seconds[step - 1] = offset + time.perf_counter() - start - overhead
        state.step = step

        if step % every == 0 or step == steps:
            loss_now = f"{state.loss[step - 1].item():.4f}"
            bar.set_postfix(loss=loss_now, lr=f"{lrs[step - 1]:.2e}", refresh=False)
        t0 = time.perf_counter()
        if step % cfg.eval_every == 0 or step == steps or step in schedule:
            seen = state.loss[:step].cpu().numpy()
            if not np.isfinite(seen).all():
                bad = int(np.flatnonzero(~np.isfinite(seen))[0]) + 1
                raise FloatingPointError(f"training loss became non-finite at step {bad}")
            state.val_loss[step - 1] = evaluate()
            if progress:
                bar.write(
                    f"step {step}/{steps}: train loss {seen[-1]:.4f}, "
                    f"val loss {state.val_loss[step - 1]:.4f} nats",
                    file=sys.stderr,
                )
        if step in schedule and on_checkpoint is not None:
            state.checkpoints[step] = on_checkpoint(step, model, float(state.val_loss[step - 1]))
            model.train()
        why = stop() if stop is not None and step < steps else None
        due = step % cfg.resume_every == 0 or step == steps
        if resume is not None and (due or why):
            cursor = {"sampling": sampling, "next_step": step + 1}
            if sampling == "read_once":
                cursor["next_token_offset"] = step * cfg.batch_size * n_ctx
            save_resume_state(resume, model, opt, state, cursor)
        overhead += time.perf_counter() - t0
        if why:
            bar.close()
            raise Preempted(step, why, None if resume is None else resume.path)
    bar.close()
    model.eval()

    tokens_per_step = cfg.batch_size * n_ctx
    log = pd.DataFrame(
        {
            "step": np.arange(1, steps + 1, dtype=np.int64),
            "tokens": np.arange(1, steps + 1, dtype=np.int64) * tokens_per_step,
            "loss": state.loss.cpu().double().numpy(),
            "lr": lrs,
            "grad_norm": state.grad_norm.cpu().double().numpy(),
            "seconds": state.seconds,
            "val_loss": state.val_loss,
        }
    )
    return TrainResult(
        log=log,
        val_loss=float(state.val_loss[-1]),
        device=str(device),
        precision=precision,
        seconds=float(state.seconds[-1]),
        checkpoints=dict(sorted(state.checkpoints.items())),
        resumed_from=resumed_from,
    )
