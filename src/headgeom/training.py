"""Training (METHODS §7): run config, learning-rate schedule, the two data orders, validation
loss, the AdamW loop, intermediate checkpoints and the resumable state.

Step convention: step s ∈ {1, …, steps} is the s-th optimizer update. It uses the learning
rate ``lr_at(s, cfg)`` and the batch ``batch_at(tokens, s, …)``; after it the model has seen
``s · batch_size · n_ctx`` tokens. Step 0 is the initialisation, so ``lr_at(0) == 0``
(warmup starts from 0), ``lr_at(warmup_steps) == lr_max`` and ``lr_at(steps) == lr_min``.

Exact resume: the batch and the learning rate of step s are pure functions of (data seed, s),
so a run restored from its resumable state after step s (weights and frozen buffers,
AdamW moments, RNG states, the partial log) continues to the same bytes as one that never
stopped (CPU, fp32; CUDA kernels need not be bitwise deterministic).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from tqdm import tqdm

from headgeom.hashing import canonical_json, content_hash
from headgeom.io import atomic_path
from headgeom.model.checkpoint import model_config_from_dict, model_from_config
from headgeom.model.gpt import GPT

SCHEDULES = ("cosine", "linear")
PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA, fp32 on CPU (§7.2)
# Data orders (METHODS §3.2, §3.3), named by the corpus manifest's ``sampling`` field.
SAMPLINGS = ("with_replacement", "read_once")
# METHODS §7.3: the analyses need steps 0, 256, 1,024, 4,096, 16,384 and the final one.
DEFAULT_CHECKPOINT_STEPS = (0, 256, 1024, 4096, 16384)
RUN_KEYS_REQUIRED = ("model_name", "seed", "data_seed", "model", "training")
RUN_KEYS_OPTIONAL = ("repository_name", "display_name", "corpus")


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"training config: {key}={value!r} is not allowed; expected {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


@dataclass(frozen=True)
class TrainConfig:
    """The ``training`` section of a run config; every choice of METHODS §7.2 is a field.

    ``checkpoint_steps``: steps whose weights are kept besides the final ones (those at or
    past ``steps`` are dropped: the final checkpoint is the run's own). ``resume_every``:
    steps between two writes of the resumable state. ``compile``: ``torch.compile`` the
    forward pass. All of them are part of the hashed run config.
    """

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
    checkpoint_steps: tuple[int, ...] = DEFAULT_CHECKPOINT_STEPS
    resume_every: int = 1024
    compile: bool = False

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
        steps = self.checkpoint_steps
        if isinstance(steps, str | bytes) or not all(_is_int(s) and s >= 0 for s in steps):
            _fail("checkpoint_steps", steps, "a list of integers >= 0")
        object.__setattr__(self, "checkpoint_steps", tuple(sorted({int(s) for s in steps})))
        if not _is_int(self.resume_every) or self.resume_every < 1:
            _fail("resume_every", self.resume_every, "an integer >= 1")
        if not isinstance(self.compile, bool):
            _fail("compile", self.compile, "true or false")

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


def checkpoint_schedule(cfg: TrainConfig) -> tuple[int, ...]:
    """Steps of the intermediate checkpoints: ``checkpoint_steps`` below ``steps`` (the final
    step's checkpoint is the run's ``model.safetensors``)."""
    return tuple(s for s in cfg.checkpoint_steps if s < cfg.steps)


def checkpoint_name(step: int) -> str:
    """File name of the intermediate checkpoint of ``step`` (zero-padded: sorts by step)."""
    return f"step{step:06d}.safetensors"


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
    """Random-offset windows (METHODS §3.2, corpus R): inputs ``tokens[o:o+n_ctx]``, targets
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
    """Sequential windows (METHODS §3.3, corpus S): step s reads the buffer
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
    replacement; steps × batch_size × n_ctx + 1 read once (METHODS §3.3: 2^30 + 1)."""
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


# --------------------------------------------------------------------------- resumable state
RESUME_FORMAT = 1
RESUME_HEADER_KEY = "headgeom_resume"  # canonical JSON: identity, step, RNG states, records


class ResumeMismatchError(RuntimeError):
    """A resumable state belongs to another run (config, corpus or format differ)."""


@dataclass
class Resume:
    """Where a run keeps its resumable state and what identifies the run.

    ``identity`` (JSON: config hash, corpus manifest hash, ...) must equal the stored one for
    the state to be used; ``runtime`` (device, precision, threads) is only reported when it
    changed, since it can change bits on CPU only through the thread count.
    """

    path: Path
    identity: dict
    runtime: dict = field(default_factory=dict)
    config: dict | None = None  # the run config, stored to name what changed on a refusal

    def __post_init__(self) -> None:
        self.path = Path(self.path)


def _python_rng_state() -> list:
    version, internal, gauss_next = random.getstate()
    return [version, list(internal), gauss_next]


def _rng_tensors_and_record() -> tuple[dict[str, torch.Tensor], dict]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    tensors = {
        "rng.torch": torch.get_rng_state(),
        "rng.numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    record = {
        "numpy": {"name": name, "pos": int(pos), "has_gauss": int(has_gauss), "cached": cached},
        "python": _python_rng_state(),
    }
    return tensors, record


def _restore_rng(tensors: dict[str, torch.Tensor], record: dict) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(t for t in tensors if t.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = record["numpy"]
    keys = tensors["rng.numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))
    version, internal, gauss_next = record["python"]
    random.setstate((version, tuple(internal), gauss_next))


@dataclass
class _Progress:
    """Per-update log arrays of a run, filled up to ``step``."""

    step: int
    loss: torch.Tensor  # (steps,) float32 on the training device: no per-step host sync
    grad_norm: torch.Tensor  # (steps,) float32 on the training device
    seconds: np.ndarray  # (steps,) float64
    val_loss: np.ndarray  # (steps,) float64, NaN where not evaluated
    checkpoints: dict[int, dict]  # intermediate checkpoint step -> its record

    @classmethod
    def empty(cls, steps: int, device: torch.device) -> _Progress:
        return cls(
            step=0,
            loss=torch.full((steps,), float("nan"), dtype=torch.float32, device=device),
            grad_norm=torch.full((steps,), float("nan"), dtype=torch.float32, device=device),
            seconds=np.full(steps, np.nan),
            val_loss=np.full(steps, np.nan),
            checkpoints={},
        )


def save_resume_state(
    resume: Resume,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    progress: _Progress,
    cursor: dict | None = None,
) -> None:
    """Write the state after update ``progress.step`` as one safetensors file (atomic: a kill
    while writing leaves the previous state intact). Tensors: the model state dict (frozen
    buffers included), AdamW's per-parameter state, the RNG states and the partial log;
    the header holds the identity, the step and the checkpoint records as canonical JSON."""
    s = progress.step
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    opt_state = opt.state_dict()["state"]
    for index, state in opt_state.items():
        for key, value in state.items():
            if not torch.is_tensor(value):
                value = torch.tensor(value)
            tensors[f"optim.{index}.{key}"] = value.detach().cpu().contiguous()
    rng_tensors, rng_record = _rng_tensors_and_record()
    tensors.update(rng_tensors)
    tensors["log.loss"] = progress.loss[:s].cpu()
    tensors["log.grad_norm"] = progress.grad_norm[:s].cpu()
    tensors["log.seconds"] = torch.from_numpy(progress.seconds[:s].copy())
    tensors["log.val_loss"] = torch.from_numpy(progress.val_loss[:s].copy())
    record = {
        "format": RESUME_FORMAT,
        "identity": resume.identity,
        "runtime": resume.runtime,
        "config": resume.config,
        "step": s,
        "data_cursor": cursor or {},  # where the data order continues (a function of s)
        "rng": rng_record,
        "checkpoints": {str(k): v for k, v in progress.checkpoints.items()},
    }
    header = {RESUME_HEADER_KEY: canonical_json(record).decode("utf-8")}
    with atomic_path(resume.path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def discard_partial_writes(path: Path) -> None:
    """Remove temporary files a killed atomic write of ``path`` left beside it."""
    path = Path(path)
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        tmp.unlink(missing_ok=True)


def read_resume_record(path: Path) -> dict:
    """The JSON header of a resumable state (identity, step, ...), without loading tensors."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        return json.loads(header[RESUME_HEADER_KEY])
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as err:
        raise ResumeMismatchError(
            f"{path}: not a resumable training state of this code ({err}); delete it to "
            "start the run over"
        ) from None


def check_resume_state(resume: Resume) -> dict | None:
    """The header of the state at ``resume.path`` (None when there is none), after checking
    that it belongs to this run: ResumeMismatchError names every differing identity key with
    both values otherwise. Cheap (no tensors read): call it before loading any data."""
    path = resume.path
    if not path.exists():
        return None
    record = read_resume_record(path)
    if record.get("format") != RESUME_FORMAT:
        raise ResumeMismatchError(
            f"{path}: resumable state format {record.get('format')!r}, this code writes "
            f"{RESUME_FORMAT}; delete {path} to start the run over"
        )
    stored = record.get("identity", {})
    if stored != resume.identity:
        diff = [
            f"{k}: state has {stored.get(k)!r}, this run has {resume.identity.get(k)!r}"
            for k in sorted(set(stored) | set(resume.identity))
            if stored.get(k) != resume.identity.get(k)
        ]
        changed = _config_changes(record.get("config"), resume.config)
        raise ResumeMismatchError(
            f"{path}: refusing to resume a run with a different identity ("
            + "; ".join(diff)
            + ")"
            + (f"; config changes: {changed}" if changed else "")
            + f". Restore the original config and corpus, or delete {path.parent} to "
            "train from scratch"
        )
    return record


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def _config_changes(stored: Mapping | None, current: Mapping | None, limit: int = 8) -> str:
    """``key: old -> new`` for the config keys that differ (empty when unknown)."""
    if stored is None or current is None:
        return ""
    a, b = _flatten(stored), _flatten(current)
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    parts = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:limit]]
    return ", ".join(parts) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_resume_state(
    resume: Resume, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: _Progress
) -> None:
    """Restore ``model``, ``opt``, the RNG states and ``progress`` from ``resume.path``
    (refused, before anything is modified, when :func:`check_resume_state` refuses)."""
    path = resume.path
    record = check_resume_state(resume)
    if record is None:
        raise FileNotFoundError(f"{path}: no resumable state")
    tensors = load_file(str(path))
    s = record["step"]
    if not 0 < s <= len(progress.seconds):
        raise ResumeMismatchError(f"{path}: state at step {s} is outside this run's steps")
    model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(model_state, strict=True)
    opt_dict = opt.state_dict()
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            opt_state.setdefault(int(index), {})[name] = value
    opt_dict["state"] = opt_state
    opt.load_state_dict(opt_dict)
    _restore_rng(tensors, record["rng"])
    progress.step = s
    progress.loss[:s] = tensors["log.loss"].to(progress.loss.device)
    progress.grad_norm[:s] = tensors["log.grad_norm"].to(progress.grad_norm.device)
    progress.seconds[:s] = tensors["log.seconds"].numpy()
    progress.val_loss[:s] = tensors["log.val_loss"].numpy()
    progress.checkpoints = {int(k): v for k, v in record["checkpoints"].items()}
    if record.get("runtime") != resume.runtime:
        print(
            f"warning: {path} was written with runtime {record.get('runtime')}, resuming with "
            f"{resume.runtime}; on CPU a different thread count can change the final bits",
            file=sys.stderr,
        )


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
) -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` AdamW updates (METHODS §7).

    Weight decay goes to tensors of rank ≥ 2 (``model.optim_groups``); frozen bases are
    buffers, so AdamW never sees them. Gradients are clipped at global norm ``grad_clip``.
    Validation runs every ``eval_every`` steps, at every checkpoint step and after the last
    step. ``on_checkpoint(step, model, val_loss)`` is called at step 0 and at every step of
    :func:`checkpoint_schedule`; the JSON record it returns is kept (and saved in the
    resumable state). With ``resume``, the state is written every ``resume_every`` steps and
    at the final step, and a state found at ``resume.path`` is continued from. On CPU the run
    is deterministic: same model bytes, ids, config and thread count ⇒ same weights, with or
    without interruptions.
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
    state = _Progress.empty(steps, device)
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
        if resume is not None and (step % cfg.resume_every == 0 or step == steps):
            cursor = {"sampling": sampling, "next_step": step + 1}
            if sampling == "read_once":
                cursor["next_token_offset"] = step * cfg.batch_size * n_ctx
            save_resume_state(resume, model, opt, state, cursor)
        overhead += time.perf_counter() - t0
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
