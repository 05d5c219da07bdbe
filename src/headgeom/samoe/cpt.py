"""Continued pretraining of an upcycled SA-MoE (SAMOE §7): the same loop for all three
variants, so they differ only in the state.

Update s (1-based) draws its batch with the workspace's loader (random windows with
replacement, a pure function of (data seed, s): ``headgeom.training.data.sample_batch``),
sets every LR group for s (:mod:`headgeom.samoe.recipe`), and minimises next-token
cross-entropy plus the auxiliary losses (§5.3: load balance and z-loss, layer means, with
the config's coefficients), clipping the global gradient norm. The log has one row per
update with each part of the loss, each group's LR and the gradient norm before clipping.

**Resumable** (as the workspace's training, docs §7.3): with a ``Resume`` the loop writes
its state (model, AdamW state, the log so far; one safetensors file, atomic) once
``save_every_s`` seconds have passed since the last one, and when ``stop`` reports a signal
(then it raises ``Preempted``); a
rerun with the same identity continues from it to the same bytes (the loop draws no random
numbers: each batch is a function of (data seed, step)). A state of another run is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from headgeom.hashing import canonical_json
from headgeom.io import atomic_path
from headgeom.samoe.config import CPTConfig
from headgeom.samoe.model import MoEModel
from headgeom.samoe.recipe import make_optimizer, set_lrs
from headgeom.training.data import sample_batch
from headgeom.training.preemption import Preempted
from headgeom.training.state import (
    RESUME_FORMAT,
    RESUME_HEADER_KEY,
    Resume,
    ResumeMismatchError,
    check_resume_state,
)

#: The log's numeric columns, in order (``lr_<group>`` follow).
LOG_COLUMNS = ("loss", "load_balance", "z_loss", "total_loss", "grad_norm")


def objective(
    model: MoEModel, x: torch.Tensor, y: torch.Tensor, cpt: CPTConfig
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


def save_state(
    resume: Resume, model: MoEModel, opt: torch.optim.Optimizer, rows: list[dict]
) -> None:
    """The state after ``len(rows)`` updates (the format of ``headgeom.training.state``'s
    header, so ``check_resume_state`` reads and checks it)."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for index, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            value = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"optim.{index}.{key}"] = value.detach().cpu().contiguous()
    log = pd.DataFrame(rows)
    for column in log.columns:
        tensors[f"log.{column}"] = torch.tensor(log[column].to_numpy(dtype=np.float64))
    record = {"format": RESUME_FORMAT, "identity": resume.identity, "runtime": resume.runtime,
              "config": resume.config, "step": len(rows), "columns": list(log.columns)}  # fmt: skip
    with atomic_path(resume.path) as tmp:
        save_file(tensors, str(tmp), metadata={RESUME_HEADER_KEY: canonical_json(record).decode()})


def load_state(resume: Resume, model: MoEModel, opt: torch.optim.Optimizer) -> list[dict]:
    """Restore model and optimizer from ``resume.path``; the log rows so far (refused before
    anything changes when the state belongs to another run)."""
    record = check_resume_state(resume)
    if record is None:
        return []
    tensors = load_file(str(resume.path))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    opt_dict = opt.state_dict()
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    opt_dict["state"] = state
    opt.load_state_dict(opt_dict)
    columns = record["columns"]
    log = pd.DataFrame({c: tensors[f"log.{c}"].numpy() for c in columns})
    if len(log) != record["step"]:
        raise ResumeMismatchError(f"{resume.path}: log has {len(log)} rows, state step "
                                  f"{record['step']}")  # fmt: skip
    log["step"] = log["step"].astype(np.int64)
    return log.to_dict("records")


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) unless a process group is running."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _average_over_ranks(params: list[torch.nn.Parameter], parts: dict[str, float], n: int):
    """Gradients and loss parts averaged over the ``n`` ranks. A parameter no rank's batch
    reached keeps no gradient (so AdamW skips it, as it would in one process)."""
    dist = torch.distributed
    device = params[0].device
    reached = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=device)
    dist.all_reduce(reached, op=dist.ReduceOp.MAX)
    for p, r in zip(params, reached.tolist(), strict=True):
        if r and p.grad is None:
            p.grad = torch.zeros_like(p)
    works = [dist.all_reduce(p.grad, async_op=True) for p in params if p.grad is not None]
    values = torch.tensor(list(parts.values()), dtype=torch.float64, device=device)
    works.append(dist.all_reduce(values, async_op=True))
    for work in works:
        work.wait()
    for p in params:
        if p.grad is not None:
            p.grad /= n
    return dict(zip(parts, (values / n).tolist(), strict=True))


def _any_rank(why: str | None, n: int) -> str | None:
    """A stop on any rank stops every rank at the same update."""
    if n == 1:
        return why
    flag = torch.tensor([why is not None], dtype=torch.uint8)
    if torch.distributed.get_backend() == "nccl":
        flag = flag.cuda()
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return why or ("a stop on another rank" if flag.item() else None)


def continued_pretraining(
    model: MoEModel,
    tokens: np.ndarray,
    cpt: CPTConfig,
    data_seed: int,
    on_step: Callable[[int, dict], None] | None = None,
    resume: Resume | None = None,
    stop: Callable[[], str | None] | None = None,
    save_every_s: float = 0.0,
    seq_len: int | None = None,
) -> pd.DataFrame:
    """Train ``model`` in place for ``cpt.steps`` updates on ``tokens``; the log. With
    ``resume``: continue from its state, save every ``save_every_s`` seconds (0: only when
    stopped) and on ``stop``; the state file is deleted when training ends. Sequences are
    ``seq_len`` tokens (default: the model's context); batches go to the model's device.

    Under a process group (``torchrun``), rank r trains on the r-th share of each update's
    batch and gradients are averaged before clipping, so every rank takes the same step, the
    step one process would take with the same micro-batches (up to summation order); only
    rank 0 writes the resumable state."""
    model.train()
    opt = make_optimizer(model, cpt)
    n_ctx = seq_len or model.n_ctx
    rank, n_ranks = world()
    accumulation = cpt.accumulation(n_ranks)
    share = cpt.batch_size // n_ranks
    micro = share // accumulation
    params = [p for p in model.parameters() if p.requires_grad]
    rows = load_state(resume, model, opt) if resume is not None else []
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cpt.precision == "bf16")
    last_save = time.monotonic()
    for step in range(len(rows) + 1, cpt.steps + 1):
        lrs = set_lrs(opt, step, cpt)
        x, y = sample_batch(tokens, step, cpt.batch_size, n_ctx, data_seed)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        opt.zero_grad(set_to_none=True)
        parts: dict[str, float] = {}
        for xm, ym in zip(x.split(micro), y.split(micro), strict=True):
            with autocast:
                loss, got = objective(model, xm.to(device), ym.to(device), cpt)
            (loss / accumulation if accumulation > 1 else loss).backward()
            for key, value in got.items():
                parts[key] = parts.get(key, 0.0) + value / accumulation
        if n_ranks > 1:
            parts = _average_over_ranks(params, parts, n_ranks)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cpt.grad_clip)
        opt.step()
        row = {"step": step, **parts, "grad_norm": float(grad_norm),
               **{f"lr_{group}": lr for group, lr in lrs.items()}}  # fmt: skip
        rows.append(row)
        if on_step is not None:
            on_step(step, row)
        why = _any_rank(stop() if stop is not None else None, n_ranks)
        due = why or (save_every_s and time.monotonic() - last_save >= save_every_s)
        if resume is not None and rank == 0 and step < cpt.steps and due:
            save_state(resume, model, opt, rows)
            last_save = time.monotonic()
        if why:
            raise Preempted(step, why, None if resume is None else resume.path)
    model.eval()
    if resume is not None and rank == 0 and resume.path.exists():
        resume.path.unlink()
    return pd.DataFrame(rows)
