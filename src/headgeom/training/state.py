"""The resumable state of a training run: weights and frozen buffers, AdamW moments, RNG
states and the partial log after update s, in one safetensors file written atomically. A
state that belongs to another run (config, corpus, format) is refused, every difference
named, before anything is loaded."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from headgeom.hashing import canonical_json
from headgeom.io import atomic_path

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
class Progress:
    """Per-update log arrays of a run, filled up to ``step``."""

    step: int
    loss: torch.Tensor  # (steps,) float32 on the training device: no per-step host sync
    grad_norm: torch.Tensor  # (steps,) float32 on the training device
    seconds: np.ndarray  # (steps,) float64
    val_loss: np.ndarray  # (steps,) float64, NaN where not evaluated
    checkpoints: dict[int, dict]  # intermediate checkpoint step -> its record

    @classmethod
    def empty(cls, steps: int, device: torch.device) -> Progress:
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
    progress: Progress,
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
    resume: Resume, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: Progress
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
