"""The SA-MoE configs (SAMOE §4, §5, §7, §19.1): the toy dense source, the MoE block and the
continued-pretraining recipe, each a frozen dataclass whose ``to_dict`` is what the study
hashes. Every [UNSPECIFIED → CHOICE] of those sections is a field here, with the proposed
default; a bad value raises one ValueError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from headgeom.model.config import ModelConfig

#: The three matched architectures (SAMOE §1): Ordinary MoE, latest-write-only, Persistent.
VARIANTS = ("ordinary", "latest", "persistent")
#: Variants whose routers read a routing state (SAMOE §5.1).
STATE_VARIANTS = ("latest", "persistent")
WRITE_INPUTS = ("moe_output", "residual_post")
GATES = ("softmax_topk_unnormalised", "softmax_topk_renormalised")
#: How the hidden-stream router block W^x of the ordinary router relates to the state
#: routers' (see ``headgeom.samoe.upcycle``): ``own_fan_in`` keeps each variant's normative
#: kaiming fan-in (d or d + r), ``state_block`` gives all three the state routers' W^x bytes.
ROUTER_X_INITS = ("own_fan_in", "state_block")


def _fail(section: str, key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"samoe {section} config: {key}={value!r} is not allowed; expected {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_positive_ints(section: str, obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        v = getattr(obj, name)
        if not _is_int(v) or v < 1:
            _fail(section, name, v, "an integer >= 1")


def _from_dict(cls: type, section: str, d: Mapping) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"samoe {section} config: unknown keys {sorted(unknown)}; known: "
                         f"{sorted(names)}")  # fmt: skip
    return cls(**d)


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"samoe variant {variant!r} is not one of {list(VARIANTS)}")
    return variant


# --------------------------------------------------------------------------- dense source
@dataclass(frozen=True)
class DenseConfig:
    """The toy dense source (SAMOE §4, §19.1 ``families.toy.dense``): the workspace GPT's
    sizes plus its dense training schedule. The model itself is a ``ModelConfig`` with the
    ``learned`` geometry (pre-LN LayerNorm, GELU MLP with biases, learned positions, tied
    unembedding), built by :meth:`model_config`."""

    n_layer: int = 8
    d_model: int = 64
    n_head: int = 4
    d_head: int = 16
    d_mlp: int = 128
    n_ctx: int = 128
    steps: int = 400
    batch_size: int = 16
    lr_max: float = 3.0e-3
    lr_min: float = 3.0e-4
    warmup_steps: int = 40
    seed: int = 1729

    def __post_init__(self) -> None:
        _check_positive_ints("dense", self, ("n_layer", "d_model", "n_head", "d_head", "d_mlp",
                                             "n_ctx", "steps", "batch_size"))  # fmt: skip
        if self.n_head * self.d_head != self.d_model:
            _fail("dense", "d_head", self.d_head, f"n_head·d_head == d_model={self.d_model}")
        if not self.lr_max > 0:
            _fail("dense", "lr_max", self.lr_max, "a number > 0")
        if not 0 <= self.lr_min <= self.lr_max:
            _fail("dense", "lr_min", self.lr_min, f"a number in [0, lr_max={self.lr_max}]")
        if not _is_int(self.warmup_steps) or not 0 <= self.warmup_steps < self.steps:
            _fail("dense", "warmup_steps", self.warmup_steps, f"an integer in [0, {self.steps})")
        if not _is_int(self.seed):
            _fail("dense", "seed", self.seed, "an integer")

    def model_config(self, n_vocab: int) -> ModelConfig:
        """The workspace GPT config of this dense source (``learned`` geometry)."""
        return ModelConfig(n_vocab=n_vocab, n_ctx=self.n_ctx, n_layer=self.n_layer,
                           n_head=self.n_head, d_model=self.d_model, d_head=self.d_head,
                           d_mlp=self.d_mlp, geometry="learned")  # fmt: skip

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> DenseConfig:
        return _from_dict(cls, "dense", d)


# --------------------------------------------------------------------------- MoE block
@dataclass(frozen=True)
class MoEConfig:
    """The MoE block, state and upcycling (SAMOE §5, §6, §19.1 ``moe``).

    ``write_input``   [CHOICE §5.2] q_l of the write head: the MoE output y_l
                      (``moe_output``) or the post-block residual h_{l+1} (``residual_post``).
    ``gate``          [CHOICE §5.1] softmax over all E logits kept for the Top-k, not
                      renormalised (default) or renormalised over the k.
    ``router_x_init`` [CHOICE, this module's ``ROUTER_X_INITS``] how the ordinary router's
                      W^x relates to the state routers' (``headgeom.samoe.upcycle``).
    ``reinit_std``    [CHOICE §6] the "original tensor's standard deviation": ``unbiased``
                      (torch.std, n − 1) — the difference is O(1/n).
    """

    n_experts: int = 16
    n_shared: int = 1
    top_k: int = 2
    state_dim: int = 16
    clamp: float = 5.0
    write_input: str = "moe_output"
    gate: str = "softmax_topk_unnormalised"
    drop_prob: float = 0.55
    router_init_a: float = 0.01
    router_x_init: str = "own_fan_in"
    reinit_std: str = "unbiased"

    def __post_init__(self) -> None:
        _check_positive_ints("moe", self, ("n_experts", "state_dim"))
        if self.n_shared != 1:
            _fail("moe", "n_shared", self.n_shared, "1 (SAMOE §5.1: one shared expert)")
        if not _is_int(self.top_k) or not 1 <= self.top_k < self.n_experts:
            _fail("moe", "top_k", self.top_k, f"an integer in [1, n_experts={self.n_experts})")
        if not (isinstance(self.clamp, int | float) and math.isfinite(self.clamp)
                and self.clamp > 0):  # fmt: skip
            _fail("moe", "clamp", self.clamp, "a finite number > 0")
        if self.write_input not in WRITE_INPUTS:
            _fail("moe", "write_input", self.write_input, f"one of {list(WRITE_INPUTS)}")
        if self.gate not in GATES:
            _fail("moe", "gate", self.gate, f"one of {list(GATES)}")
        if not 0 <= self.drop_prob <= 1:
            _fail("moe", "drop_prob", self.drop_prob, "a probability in [0, 1]")
        if not self.router_init_a >= 0:
            _fail("moe", "router_init_a", self.router_init_a, "a number >= 0")
        if self.router_x_init not in ROUTER_X_INITS:
            _fail("moe", "router_x_init", self.router_x_init, f"one of {list(ROUTER_X_INITS)}")
        if self.reinit_std != "unbiased":
            _fail("moe", "reinit_std", self.reinit_std, "'unbiased'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> MoEConfig:
        return _from_dict(cls, "moe", d)


# --------------------------------------------------------------------------- recipe
#: Forward precisions of continued pretraining.
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class AuxConfig:
    """[CHOICE §5.3] Auxiliary loss coefficients (§19.1 ``cpt.aux``); 0 switches one off."""

    load_balance: float = 0.01
    z_loss: float = 1e-3

    def __post_init__(self) -> None:
        for name in ("load_balance", "z_loss"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                _fail("cpt.aux", name, v, "a finite number >= 0")


@dataclass(frozen=True)
class CPTConfig:
    """Continued pretraining (SAMOE §7, §19.1 ``cpt``; toy defaults). Step s ∈ {1..steps} is
    the s-th optimizer update, as in ``headgeom.training``."""

    steps: int = 120
    batch_size: int = 8
    lr: float = 1.0e-3
    shared_lr_mult: float = 0.1
    shared_freeze_steps: int = 12
    router_write_lr_mult: float = 2.0
    warmup_steps: int = 6
    final_lr_frac: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    aux: AuxConfig = field(default_factory=AuxConfig)
    #: Forward precision: fp32, or bf16 autocast over float32 masters (paper scale).
    precision: str = "fp32"
    #: Sequences per forward and backward on one rank; 0: the rank's whole share at once.
    #: The rank's share is accumulated over ``share / micro_batch`` passes.
    micro_batch: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if isinstance(self.aux, Mapping):
            object.__setattr__(self, "aux", _from_dict(AuxConfig, "cpt.aux", self.aux))
        _check_positive_ints("cpt", self, ("steps", "batch_size"))
        for name in ("lr", "shared_lr_mult", "router_write_lr_mult"):
            if not getattr(self, name) > 0:
                _fail("cpt", name, getattr(self, name), "a number > 0")
        if not _is_int(self.warmup_steps) or not 0 <= self.warmup_steps < self.steps:
            _fail("cpt", "warmup_steps", self.warmup_steps, f"an integer in [0, {self.steps})")
        if not _is_int(self.shared_freeze_steps) or not 0 <= self.shared_freeze_steps < self.steps:
            _fail("cpt", "shared_freeze_steps", self.shared_freeze_steps,
                  f"an integer in [0, {self.steps})")  # fmt: skip
        if not 0 <= self.final_lr_frac <= 1:
            _fail("cpt", "final_lr_frac", self.final_lr_frac, "a number in [0, 1]")
        if self.weight_decay < 0:
            _fail("cpt", "weight_decay", self.weight_decay, "a number >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail("cpt", "betas", self.betas, "two numbers in [0, 1)")
        if not self.eps > 0:
            _fail("cpt", "eps", self.eps, "a number > 0")
        if not self.grad_clip > 0:
            _fail("cpt", "grad_clip", self.grad_clip, "a number > 0")
        if self.precision not in PRECISIONS:
            _fail("cpt", "precision", self.precision, f"one of {list(PRECISIONS)}")
        if not _is_int(self.micro_batch) or self.micro_batch < 0:
            _fail("cpt", "micro_batch", self.micro_batch, "an integer >= 0")

    def accumulation(self, world_size: int = 1) -> int:
        """Forward/backward passes per update on each of ``world_size`` ranks: the batch is
        split evenly over ranks, each rank's share into micro-batches."""
        share, rest = divmod(self.batch_size, world_size)
        micro = self.micro_batch or share
        if rest or share % micro:
            raise ValueError(f"cpt: batch_size {self.batch_size} is not {world_size} rank(s) × "
                             f"a whole number of micro-batches of {micro}")  # fmt: skip
        return share // micro

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> CPTConfig:
        return _from_dict(cls, "cpt", d)
