"""Training throughput: the real training step (``loop.optimizer_step``) on random tokens,
its model FLOPs per token and the device's peak, for benchmarks/training_throughput.py and
benchmarks/gpu_check.py.

* FLOPs per token = 6 × (trainable parameters in matmuls: every parameter but the position
  embedding) + 4 × (frozen matmul weights: forward and input-gradient, no weight gradient)
  + 12 · L · H · d_head · n_ctx (attention scores and mixing, forward and backward; the
  PaLM/nanoGPT convention that does not halve for causality).
* MFU = FLOPs per token × tokens/s over the peak of the device: a given peak, or
  :data:`PEAK_TFLOPS` for known GPUs (dense bf16 tensor-core peak; fp32 peak for fp32 runs).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from headgeom.model.registry import build_model
from headgeom.model.zoo import derive_model_config
from headgeom.training.loop import optimizer_step

ARCH_KEYS = ("n_layer", "n_head", "d_model", "d_head", "d_mlp", "n_ctx")
# docs §4.1 / §7.1: GPT-2 small, 32 × 512 tokens per step.
PAPER_SHAPE = dict(
    n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512, vocab=50257, batch=32
)
# Dense peak TFLOP/s: (bf16 tensor core, fp32 without TF32), from the vendors' data sheets.
# Matched as substrings of torch.cuda.get_device_name, first match wins (H100 NVL before H100).
PEAK_TFLOPS = {
    "H200": (989.0, 67.0),
    "H100 SXM": (989.0, 67.0),
    "H100 NVL": (835.0, 60.0),
    "H100 PCIe": (756.0, 51.0),
    "H100": (989.0, 67.0),
    "GH200": (989.0, 67.0),
    "A100": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "A10": (125.0, 31.2),
    "L4": (121.0, 30.3),
}


def model_for(geometry: str, shape: Mapping[str, int], seed: int = 0) -> nn.Module:
    """A ``geometry`` model of ``shape`` (ARCH_KEYS + ``vocab``), seeded weights."""
    torch.manual_seed(seed)
    arch = {k: shape[k] for k in ARCH_KEYS}
    return build_model(derive_model_config(geometry, arch), n_vocab=shape["vocab"])


def flops_per_token(model: nn.Module, shape: Mapping[str, int]) -> float:
    """Training FLOPs per token (module text) of ``model``; ``shape`` gives n_layer, n_head,
    d_head and n_ctx of the attention term."""
    trainable = sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.requires_grad and not name.endswith(("wpe.weight", "wpe"))
    )
    frozen = sum(b.numel() for name, b in model.named_buffers() if name.endswith("basis"))
    attention = 12 * shape["n_layer"] * shape["n_head"] * shape["d_head"] * shape["n_ctx"]
    return 6.0 * trainable + 4.0 * frozen + attention


def peak_tflops(
    device: torch.device, precision: str, override: float | None = None
) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it came from): ``override`` when given, else the table entry of
    the CUDA device's name; (None, why) when neither applies."""
    if override:
        return float(override), "given"
    if device.type != "cuda":
        return None, "no peak for a CPU"
    name = torch.cuda.get_device_name(device)
    for key, (bf16, fp32) in PEAK_TFLOPS.items():
        if key in name:
            return (bf16 if precision == "bf16" else fp32), f"table: {key}"
    return None, f"{name!r} is not in the table"


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def training_setup(model: nn.Module, device: torch.device, compile: bool | str = False):
    """(forward, AdamW, trainable params) as the training loop makes them: the run's
    parameter groups, the fused kernel on CUDA, ``torch.compile`` when asked (``compile``
    True: the default inductor backend; a string: that backend, e.g. "eager")."""
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        model.optim_groups(0.1),
        lr=1e-4,
        betas=(0.9, 0.95),
        **({"fused": True} if device.type == "cuda" else {}),
    )
    if not compile:
        return model, opt, params
    backend = compile if isinstance(compile, str) else "inductor"
    return torch.compile(model, backend=backend), opt, params


def random_batches(shape: Mapping[str, int], device: torch.device, seed: int = 0) -> Callable:
    """A function returning a fresh random (inputs, targets) batch of ``shape`` on device."""
    gen = torch.Generator().manual_seed(seed)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["n_ctx"] + 1), generator=gen)
        ids = ids.to(device)
        return ids[:, :-1], ids[:, 1:]

    return batch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(
    forward, opt, params, batch: Callable, device: torch.device, autocast, clock=time.perf_counter
) -> float:
    """Seconds of one real training step (``loop.optimizer_step``, loss read back)."""
    x, y = batch()
    sync(device)
    t0 = clock()
    loss, _ = optimizer_step(forward, opt, params, x, y, 1e-4, 1.0, autocast)
    loss.item()
    sync(device)
    return clock() - t0


@dataclass
class StepTiming:
    """Timed training steps of one model."""

    warmup_seconds: list[float]  # the untimed steps (the first includes any compilation)
    step_seconds: list[float]
    tokens_per_step: int
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated; None on CPU
    notes: list[str] = field(default_factory=list)

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.median_step


def time_training(
    model: nn.Module,
    shape: Mapping[str, int],
    device: torch.device,
    precision: str,
    *,
    compile: bool | str = False,
    warmup: int = 2,
    steps: int = 5,
) -> StepTiming:
    """``warmup`` untimed then ``steps`` timed training steps of ``model`` on random batches
    of ``shape``; the peak memory of the whole (CUDA)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    forward, opt, params = training_setup(model, device, compile)
    autocast = autocast_for(device, precision)
    batch = random_batches(shape, device)
    run = [timed_step(forward, opt, params, batch, device, autocast) for _ in range(warmup + steps)]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return StepTiming(run[:warmup], run[warmup:], shape["batch"] * shape["n_ctx"], peak)
