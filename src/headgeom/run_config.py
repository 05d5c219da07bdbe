"""The run config (docs §7.2): one (model, seed) run as ``heads/stages/train.py`` receives it
(``RunConfig``), its ``training`` section (``TrainConfig``), and the intermediate
checkpoints a run keeps and their file names (docs §7.3). A run's identity: its content hash
names the run in every manifest, so training, imports and manifests all read it here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from headgeom.hashing import content_hash
from headgeom.model import registry

SCHEDULES = ("cosine", "linear")
PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA, fp32 on CPU (§7.2)
# docs §7.3: the analyses need steps 0, 256, 1,024, 4,096, 16,384 and the final one.
DEFAULT_CHECKPOINT_STEPS = (0, 256, 1024, 4096, 16384)
RUN_KEYS_REQUIRED = ("model_name", "seed", "data_seed", "model", "training")
RUN_KEYS_OPTIONAL = ("repository_name", "display_name", "corpus")


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"training config: {key}={value!r} is not allowed; expected {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


@dataclass(frozen=True)
class TrainConfig:
    """The ``training`` section of a run config; every choice of docs §7.2 is a field.

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


def checkpoint_manifest_name(step: int) -> str:
    """File name of the manifest beside the intermediate checkpoint of ``step``."""
    return checkpoint_name(step).removesuffix(".safetensors") + ".manifest.json"


@dataclass(frozen=True)
class RunConfig:
    """One (model, seed) training run: the JSON that ``heads/stages/train.py`` receives."""

    raw: dict
    model_name: str
    seed: int
    data_seed: int
    model: dict  # ModelConfig fields except n_vocab (that comes from the vocabulary)
    training: TrainConfig

    @property
    def config_hash(self) -> str:
        """Content hash of exactly the config given (docs §2.3 ``config_hash``)."""
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
    registry.config_from_dict(run.model_config(n_vocab=1))  # bad model keys fail before any data
    return run
