"""The continued-pretraining recipe (SAMOE §7, paper §4, App. A.5): LR groups, the schedule,
weight decay, AdamW.

LR groups (normative): routed experts and every other base parameter at η; the shared
expert at ``shared_lr_mult``·η, exactly 0 for the first ``shared_freeze_steps`` updates;
routers and write heads at ``router_write_lr_mult``·η. Every group follows one multiplier:
linear warmup from 0 to 1 over ``warmup_steps``, then cosine to ``final_lr_frac`` at
``steps`` — so each group ends at ``final_lr_frac`` × its own peak. After the freeze the
shared expert takes its peak × the common multiplier (no own warmup) [CHOICE §7].

Step convention (``headgeom.training``): update s ∈ {1..steps} uses ``lr_at(s, …)``; step 0
is the initialisation. Weight decay only on tensors of rank ≥ 2 (matrices, embeddings
included), never on biases or norm parameters.
"""

from __future__ import annotations

import math

import torch

from headgeom.samoe import checks
from headgeom.samoe.config import CPTConfig
from headgeom.samoe.model import MoEModel, param_kind

#: The LR groups of SAMOE §7.
LR_GROUPS = ("base", "shared", "router_write")


def lr_group(name: str) -> str:
    """The LR group of parameter ``name``: routed experts and the rest of the base model are
    ``base``; the shared expert ``shared``; routers and write heads ``router_write``."""
    kind = param_kind(name)
    if kind == "shared":
        return "shared"
    if kind in ("router", "write"):
        return "router_write"
    return "base"


def peak_lr(group: str, cpt: CPTConfig) -> float:
    mult = {"base": 1.0, "shared": cpt.shared_lr_mult, "router_write": cpt.router_write_lr_mult}
    return cpt.lr * mult[group]


def schedule_multiplier(step: int, cpt: CPTConfig) -> float:
    """The common multiplier of update ``step``: 0 → 1 linearly over the warmup, then cosine
    to ``final_lr_frac`` at ``steps``."""
    if not 0 <= step <= cpt.steps:
        raise ValueError(f"step {step} outside [0, {cpt.steps}]")
    if step < cpt.warmup_steps:
        return step / cpt.warmup_steps
    frac = (step - cpt.warmup_steps) / (cpt.steps - cpt.warmup_steps)
    lo = cpt.final_lr_frac
    return lo + 0.5 * (1.0 - lo) * (1.0 + math.cos(math.pi * frac))


def lr_at(step: int, group: str, cpt: CPTConfig) -> float:
    """Learning rate of ``group`` at update ``step`` (module text)."""
    if group not in LR_GROUPS:
        raise ValueError(f"LR group {group!r} is not one of {list(LR_GROUPS)}")
    if group == "shared" and step <= cpt.shared_freeze_steps:
        return 0.0  # held at exactly 0 while frozen
    return peak_lr(group, cpt) * schedule_multiplier(step, cpt)


def param_groups(model: MoEModel, cpt: CPTConfig) -> list[dict]:
    """AdamW groups: each LR group split into decayed (rank ≥ 2) and undecayed tensors;
    every group carries its ``lr_group`` name."""
    groups: dict[tuple[str, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((lr_group(name), p.dim() >= 2), []).append(p)
    return [
        {
            "params": params,
            "lr_group": group,
            "weight_decay": cpt.weight_decay if decay else 0.0,
            "lr": lr_at(0, group, cpt),
        }  # fmt: skip
        for (group, decay), params in sorted(groups.items())
    ]


def make_optimizer(model: MoEModel, cpt: CPTConfig) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (betas, eps from ``cpt``); fused on CUDA."""
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(param_groups(model, cpt), betas=cpt.betas, eps=cpt.eps,
                             **({"fused": True} if fused else {}))  # fmt: skip


def set_lrs(opt: torch.optim.Optimizer, step: int, cpt: CPTConfig) -> dict[str, float]:
    """Set every group's LR for update ``step``; returns the LR of each LR group (to log)."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step, g["lr_group"], cpt)
    return {group: lr_at(step, group, cpt) for group in LR_GROUPS}


def check_lr_groups(cpt: CPTConfig) -> dict:
    """K4 (SAMOE §7 [CHECK]): the shared LR is 0 at every update before the freeze ends, and
    every group's final LR is ``final_lr_frac`` × its own peak (relative residual)."""
    frozen = max((abs(lr_at(s, "shared", cpt)) for s in range(cpt.shared_freeze_steps + 1)),
                 default=0.0)  # fmt: skip
    final = max(
        abs(lr_at(cpt.steps, g, cpt) - cpt.final_lr_frac * peak_lr(g, cpt)) / peak_lr(g, cpt)
        for g in LR_GROUPS
    )
    return {
        **checks.enforce("K4.frozen", frozen, 0.0, what="shared-expert LR during the freeze"),
        **checks.enforce("K4.final", final, 1e-12, "rel",
                         what=f"final LR against {cpt.final_lr_frac} × each group's peak"),
    }  # fmt: skip
