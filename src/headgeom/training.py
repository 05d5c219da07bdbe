"""Training (METHODS §7): run config, learning-rate schedule, random-offset loader,
validation loss and the AdamW loop.

Step convention: step s ∈ {1, …, steps} is the s-th optimizer update. It uses the learning
rate ``lr_at(s, cfg)`` and the batch ``sample_batch(tokens, s, …)``; after it the model has
seen ``s · batch_size · n_ctx`` tokens. Step 0 is the initialisation, so ``lr_at(0) == 0``
(warmup starts from 0), ``lr_at(warmup_steps) == lr_max`` and ``lr_at(steps) == lr_min``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F
from tqdm import tqdm

from headgeom.checkpoint import model_config_from_dict, model_from_config
from headgeom.hashing import content_hash
from headgeom.model import GPT

SCHEDULES = ("cosine", "linear")
PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA, fp32 on CPU (§7.2)
RUN_KEYS_REQUIRED = ("model_name", "seed", "data_seed", "model", "training")
RUN_KEYS_OPTIONAL = ("repository_name", "display_name", "corpus")


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"training config: {key}={value!r} is not allowed; expected {allowed}")


@dataclass(frozen=True)
class TrainConfig:
    """The ``training`` section of a run config; every choice of METHODS §7.2 is a field."""

    steps: int
    batch_size: int
    lr_max: float
    lr_min: float
    warmup_steps: int
    eval_every: int
    eval_batch_size: int
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.steps < 1:
            _fail("steps", self.steps, "an integer >= 1")
        if self.batch_size < 1:
            _fail("batch_size", self.batch_size, "an integer >= 1")
        if not self.lr_max > 0:
            _fail("lr_max", self.lr_max, "a number > 0")
        if not 0 <= self.lr_min <= self.lr_max:
            _fail("lr_min", self.lr_min, f"a number in [0, lr_max={self.lr_max}]")
        if not 0 <= self.warmup_steps < self.steps:
            _fail("warmup_steps", self.warmup_steps, f"an integer in [0, steps={self.steps})")
        if self.schedule not in SCHEDULES:
            _fail("schedule", self.schedule, f"one of {list(SCHEDULES)}")
        if self.weight_decay < 0:
            _fail("weight_decay", self.weight_decay, "a number >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail("betas", list(self.betas), "two numbers in [0, 1)")
        if not self.eps > 0:
            _fail("eps", self.eps, "a number > 0")
        if not self.grad_clip > 0:
            _fail("grad_clip", self.grad_clip, "a number > 0")
        if self.eval_every < 1:
            _fail("eval_every", self.eval_every, "an integer >= 1")
        if self.eval_batch_size < 1:
            _fail("eval_batch_size", self.eval_batch_size, "an integer >= 1")
        if self.precision not in PRECISIONS:
            _fail("precision", self.precision, f"one of {list(PRECISIONS)}")

    @classmethod
    def from_dict(cls, d: Mapping) -> TrainConfig:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(d) - set(fields)
        if unknown:
            raise ValueError(
                f"unknown training config keys {sorted(unknown)}; known: {sorted(fields)}"
            )
        required = {n for n, f in fields.items() if f.default is dataclasses.MISSING}
        missing = required - set(d)
        if missing:
            raise ValueError(f"training config lacks required keys {sorted(missing)}")
        return cls(**d)


@dataclass(frozen=True)
class RunConfig:
    """One (model, seed) training run: the JSON that ``src/train.py`` receives."""

    raw: dict
    model_name: str
    seed: int
    data_seed: int
    model: dict  # ModelConfig fields except n_vocab (that comes from the vocabulary)
    training: TrainConfig

    @property
    def config_hash(self) -> str:
        """Content hash of exactly the config given (METHODS §2.3 ``config_hash``)."""
        return content_hash(self.raw)

    @property
    def config_id(self) -> str:
        """Repository name when configured, else ``{model_name}-s{seed}``."""
        return self.raw.get("repository_name") or f"{self.model_name}-s{self.seed}"

    @property
    def display_name(self) -> str:
        return self.raw.get("display_name") or self.model_name

    def model_config(self, n_vocab: int) -> dict:
        """The model config dict with the vocabulary size filled in."""
        return {**self.model, "n_vocab": int(n_vocab)}


def parse_run_config(obj: Mapping) -> RunConfig:
    """Validate a run config (keys, types, ranges) and split it into its parts."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"run config must be a JSON object, got {type(obj).__name__}")
    allowed = RUN_KEYS_REQUIRED + RUN_KEYS_OPTIONAL
    unknown = set(obj) - set(allowed)
    if unknown:
        raise ValueError(f"unknown run config keys {sorted(unknown)}; known: {sorted(allowed)}")
    missing = set(RUN_KEYS_REQUIRED) - set(obj)
    if missing:
        raise ValueError(f"run config lacks required keys {sorted(missing)}")
    for key in ("seed", "data_seed"):
        if isinstance(obj[key], bool) or not isinstance(obj[key], int) or obj[key] < 0:
            raise ValueError(f"run config: {key}={obj[key]!r} must be an integer >= 0")
    if "n_vocab" in obj["model"]:
        raise ValueError("run config: model.n_vocab is not allowed; it comes from the vocabulary")
    run = RunConfig(
        raw=dict(obj),
        model_name=str(obj["model_name"]),
        seed=int(obj["seed"]),
        data_seed=int(obj["data_seed"]),
        model=dict(obj["model"]),
        training=TrainConfig.from_dict(obj["training"]),
    )
    model_config_from_dict(run.model_config(n_vocab=1))  # bad model keys fail before any data
    return run


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (METHODS §7.2: before model construction)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(config: Mapping | RunConfig, n_vocab: int) -> torch.nn.Module:
    """The step-0 model of a run: seeded from ``seed``, then constructed (same bytes each time)."""
    run = config if isinstance(config, RunConfig) else parse_run_config(config)
    seed_everything(run.seed)
    return model_from_config(run.model_config(n_vocab))


# --------------------------------------------------------------------------- schedule
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of update ``step`` (METHODS §7.2): linear warmup from 0 to ``lr_max`` at
    ``warmup_steps``, then cosine (or linear) decay to ``lr_min`` at ``steps``."""
    if not 0 <= step <= cfg.steps:
        raise ValueError(f"step {step} outside [0, {cfg.steps}]")
    if step < cfg.warmup_steps:
        return cfg.lr_max * step / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        return cfg.lr_min + 0.5 * (cfg.lr_max - cfg.lr_min) * (1.0 + math.cos(math.pi * frac))
    return cfg.lr_max - (cfg.lr_max - cfg.lr_min) * frac


# --------------------------------------------------------------------------- data
def sample_batch(
    tokens: np.ndarray, step: int, batch_size: int, n_ctx: int, data_seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random-offset windows (METHODS §3.2): inputs ``tokens[o:o+n_ctx]``, targets shifted by one.

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


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def validation_loss(model: GPT, val_ids: np.ndarray, n_ctx: int, batch_size: int) -> float:
    """Mean next-token cross-entropy in nats over the ⌊(N−1)/n_ctx⌋ non-overlapping windows
    that cover the file, tail dropped (METHODS §3.4); float32 forward, float64 sum."""
    n_windows = (len(val_ids) - 1) // n_ctx
    if n_windows < 1:
        raise ValueError(f"validation file of {len(val_ids)} tokens has no {n_ctx}-token window")
    device = _device_of(model)
    ids = torch.from_numpy(np.asarray(val_ids[: n_windows * n_ctx + 1]).astype(np.int64))
    inputs, targets = ids[:-1].view(n_windows, n_ctx), ids[1:].view(n_windows, n_ctx)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    try:
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
    seconds: float  # wall-clock training time, validation excluded


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "bf16" and device.type != "cuda":
        raise ValueError("training config: precision='bf16' needs a CUDA device; use fp32/auto")
    return precision


def train(
    model: GPT,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    cfg: TrainConfig,
    *,
    data_seed: int,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` AdamW updates (METHODS §7).

    Weight decay goes to tensors of rank ≥ 2 (``model.optim_groups``); frozen bases are
    buffers, so AdamW never sees them. Gradients are clipped at global norm ``grad_clip``.
    Validation runs every ``eval_every`` steps and after the last step. On CPU the run is
    deterministic: same model bytes, ids, config and thread count ⇒ same weights.
    """
    device = resolve_device(device)
    precision = _resolve_precision(cfg.precision, device)
    n_ctx = model.cfg.n_ctx
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        model.optim_groups(cfg.weight_decay),
        lr=lr_at(0, cfg),
        betas=cfg.betas,
        eps=cfg.eps,
        **({"fused": True} if device.type == "cuda" else {}),
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    steps = cfg.steps
    lrs = np.array([lr_at(s, cfg) for s in range(1, steps + 1)])
    losses = torch.empty(steps, dtype=torch.float32, device=device)  # no per-step sync
    grad_norms = torch.empty(steps, dtype=torch.float32, device=device)
    seconds = np.empty(steps)
    val_loss = np.full(steps, np.nan)
    eval_seconds = 0.0
    every = max(1, steps // 100)  # refresh the progress bar's loss 100 times per run

    bar = tqdm(
        range(1, steps + 1),
        desc="train",
        unit="step",
        file=sys.stderr,
        disable=not progress,
        mininterval=1.0 if sys.stderr.isatty() else 15.0,
        dynamic_ncols=True,
    )
    start = time.perf_counter()
    for step in bar:
        x, y = sample_batch(train_ids, step, cfg.batch_size, n_ctx, data_seed)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norms[step - 1] = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        for group in opt.param_groups:
            group["lr"] = float(lrs[step - 1])
        opt.step()
        losses[step - 1] = loss.detach()
        seconds[step - 1] = time.perf_counter() - start - eval_seconds

        if step % every == 0 or step == steps:
            loss_now = f"{losses[step - 1].item():.4f}"
            bar.set_postfix(loss=loss_now, lr=f"{lrs[step - 1]:.2e}", refresh=False)
        if step % cfg.eval_every == 0 or step == steps:
            t0 = time.perf_counter()
            seen = losses[:step].cpu().numpy()
            if not np.isfinite(seen).all():
                bad = int(np.flatnonzero(~np.isfinite(seen))[0]) + 1
                raise FloatingPointError(f"training loss became non-finite at step {bad}")
            val_loss[step - 1] = validation_loss(model, val_ids, n_ctx, cfg.eval_batch_size)
            if progress:
                bar.write(
                    f"step {step}/{steps}: train loss {seen[-1]:.4f}, "
                    f"val loss {val_loss[step - 1]:.4f} nats",
                    file=sys.stderr,
                )
            eval_seconds += time.perf_counter() - t0
    bar.close()
    model.eval()

    tokens_per_step = cfg.batch_size * n_ctx
    log = pd.DataFrame(
        {
            "step": np.arange(1, steps + 1, dtype=np.int64),
            "tokens": np.arange(1, steps + 1, dtype=np.int64) * tokens_per_step,
            "loss": losses.cpu().double().numpy(),
            "lr": lrs,
            "grad_norm": grad_norms.cpu().double().numpy(),
            "seconds": seconds,
            "val_loss": val_loss,
        }
    )
    return TrainResult(
        log=log,
        val_loss=float(val_loss[-1]),
        device=str(device),
        precision=precision,
        seconds=float(seconds[-1]),
    )
