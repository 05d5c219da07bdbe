"""Training throughput: tokens/s and MFU of the training step of src/train.py, per geometry.

    python benchmarks/training_throughput.py --shape cpu-small --threads 1
    python benchmarks/training_throughput.py --shape paper --device cuda --geometries learned

Each step is the real one (``headgeom.training.loop.optimizer_step``: autocast forward, fp32 loss,
backward, clipping, AdamW with the run's parameter groups) on random tokens. Models are timed
round-robin, one step each per round, and the median step time is reported, so a machine
whose load drifts slows every model alike; with one CPU thread the step's CPU time is
measured (a busy machine inflates wall time, not CPU time). Prints, per model: tokens/s,
the ratio to the learned model (goal for frozen geometries: ≥ 0.95), model FLOPs per token
and MFU.

* FLOPs per token = 6 × (trainable parameters in matmuls: every parameter but the position
  embedding) + 4 × (frozen matmul weights: forward and input-gradient, no weight gradient)
  + 12 · L · H · d_head · n_ctx (attention scores and mixing, forward and backward; the
  PaLM/nanoGPT convention that does not halve for causality).
* MFU = FLOPs per token × tokens/s over the peak of the device: ``--peak-tflops``, or the
  table below for known GPUs (dense bf16 tensor-core peak; fp32 peak for fp32 runs).
* On CPU (``--hf``, default there) the same step is timed on ``transformers``'
  GPT2LMHeadModel with the same sizes, batch, optimizer groups and loss, and the ratio of
  our learned model's tokens/s to it is printed (goal ≥ 1.0).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headgeom.model.registry import build_model  # noqa: E402
from headgeom.model.zoo import derive_model_config  # noqa: E402
from headgeom.training.loop import (  # noqa: E402
    configure_matmuls,
    optimizer_step,
    resolve_device,
    resolve_precision,
)

SHAPES = {
    # docs §4.1 / §7.1: GPT-2 small, 32 × 512 tokens per step.
    "paper": dict(
        n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512, vocab=50257, batch=32
    ),
    # Fits a CPU benchmark in minutes; the full GPT-2 vocabulary keeps the unembedding's share.
    "cpu-small": dict(
        n_layer=4, n_head=4, d_model=256, d_head=64, d_mlp=1024, n_ctx=128, vocab=50257, batch=8
    ),
}
DEFAULT_GEOMETRIES = (
    "learned",
    "write-common-axis",
    "write-rotated",
    "read-common",
    "all-common-axis",
    "all-rotated",
    "all-rotated-self",
)
# Dense peak TFLOP/s: (bf16 tensor core, fp32 without TF32), from the vendors' data sheets.
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="cpu-small")
    for key in ("n_layer", "n_head", "d_model", "d_head", "d_mlp", "n_ctx", "vocab", "batch"):
        p.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"override the shape's {key}")
    p.add_argument("--geometries", nargs="+", default=list(DEFAULT_GEOMETRIES))
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="torch.compile the forward pass")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--rounds", type=int, default=5, help="timed steps per model")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table)")
    hf = p.add_mutually_exclusive_group()
    hf.add_argument("--hf", dest="hf", action="store_true", default=None)
    hf.add_argument("--no-hf", dest="hf", action="store_false")
    return p.parse_args(argv)


def shape_of(args: argparse.Namespace) -> dict[str, int]:
    shape = dict(SHAPES[args.shape])
    for key in shape:
        value = getattr(args, key)
        if value is not None:
            shape[key] = value
    return shape


def ours(geometry: str, shape: dict[str, int]) -> nn.Module:
    arch = {k: shape[k] for k in ("n_layer", "n_head", "d_model", "d_head", "d_mlp", "n_ctx")}
    torch.manual_seed(0)
    return build_model(derive_model_config(geometry, arch), n_vocab=shape["vocab"])


def hf_gpt2(shape: dict[str, int]) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=shape["vocab"],
        n_positions=shape["n_ctx"],
        n_embd=shape["d_model"],
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        n_inner=shape["d_mlp"],
        activation_function="gelu_new",  # the tanh approximation, as ours
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)

    class Logits(nn.Module):  # same interface as ours: ids -> logits
        def __init__(self, inner: nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids).logits

        def optim_groups(self, weight_decay: float) -> list[dict]:
            params = [p for p in self.parameters() if p.requires_grad]
            return [
                {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ]

    return Logits(model)


def flops_per_token(model: nn.Module, shape: dict[str, int]) -> float:
    trainable = sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.requires_grad and not name.endswith(("wpe.weight", "wpe"))
    )
    frozen = sum(b.numel() for name, b in model.named_buffers() if name.endswith("basis"))
    attention = 12 * shape["n_layer"] * shape["n_head"] * shape["d_head"] * shape["n_ctx"]
    return 6.0 * trainable + 4.0 * frozen + attention


def peak_tflops(args: argparse.Namespace, device: torch.device, precision: str) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (bf16, fp32) in PEAK_TFLOPS.items():
        if key in name:
            return bf16 if precision == "bf16" else fp32
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = shape_of(args)
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_matmuls(device, precision)
    compare_hf = device.type == "cpu" if args.hf is None else args.hf
    tokens = shape["batch"] * shape["n_ctx"]
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )

    models: dict[str, nn.Module] = {g: ours(g, shape) for g in args.geometries}
    if compare_hf:
        models["GPT2LMHeadModel"] = hf_gpt2(shape)
    runs = {}
    for name, model in models.items():
        model.to(device).train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            model.optim_groups(0.1),
            lr=1e-4,
            betas=(0.9, 0.95),
            **({"fused": True} if device.type == "cuda" else {}),
        )
        forward = torch.compile(model) if args.compile else model
        runs[name] = (forward, opt, params, [])

    # One CPU thread: the step's CPU time, which a busy machine does not inflate (wall time
    # there measures the other processes too); wall time on GPUs and with several threads.
    one_thread = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if one_thread else time.perf_counter
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["n_ctx"] + 1), generator=gen)
        ids = ids.to(device)
        return ids[:, :-1], ids[:, 1:]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    print(
        f"shape {args.shape} {shape}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", {precision}, compile={args.compile}, threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}, timing {'CPU' if one_thread else 'wall'} time",
        flush=True,
    )
    for r in range(args.warmup + args.rounds):
        for forward, opt, params, times in runs.values():
            x, y = batch()
            sync()
            t0 = clock()
            loss, _ = optimizer_step(forward, opt, params, x, y, 1e-4, 1.0, autocast)
            loss.item()
            sync()
            if r >= args.warmup:
                times.append(clock() - t0)
        print(f"round {r + 1}/{args.warmup + args.rounds} done", file=sys.stderr, flush=True)

    peak = peak_tflops(args, device, precision)
    learned = statistics.median(runs["learned"][3]) if "learned" in runs else None
    print(
        f"{'model':<20} {'params':>12} {'ms/step':>9} {'tokens/s':>10} {'vs learned':>10} "
        f"{'GFLOP/tok':>9} {'MFU':>7}"
    )
    for name, (_, _, params, times) in runs.items():
        step = statistics.median(times)
        tps = tokens / step
        fpt = flops_per_token(models[name], shape)
        mfu = f"{fpt * tps / (peak * 1e12):.1%}" if peak else "n/a"
        ratio = f"{learned / step:.3f}" if learned else "-"
        n = sum(p.numel() for p in params)
        print(
            f"{name:<20} {n:>12,} {step * 1e3:>9.1f} {tps:>10,.0f} {ratio:>10} "
            f"{fpt / 1e9:>9.3f} {mfu:>7}"
        )
    if compare_hf and learned:
        hf = statistics.median(runs["GPT2LMHeadModel"][3])
        print(f"ours (learned) / GPT2LMHeadModel tokens/s: {hf / learned:.3f}")
    if peak is None:
        print("MFU: n/a (no --peak-tflops and no known GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
