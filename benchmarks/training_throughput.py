"""Training throughput: tokens/s and MFU of the training step of heads/stages/train.py, per
geometry.

    python benchmarks/training_throughput.py --shape cpu-small --threads 1
    python benchmarks/training_throughput.py --shape paper --device cuda --geometries learned

Each step is the real one (``headgeom.training.loop.optimizer_step``: autocast forward, fp32 loss,
backward, clipping, AdamW with the run's parameter groups) on random tokens. Models are timed
round-robin, one step each per round, and the median step time is reported, so a machine
whose load drifts slows every model alike; with one CPU thread the step's CPU time is
measured (a busy machine inflates wall time, not CPU time). Prints, per model: tokens/s,
the ratio to the learned model (goal for frozen geometries: ≥ 0.95), model FLOPs per token
and MFU.

* FLOPs per token and MFU: ``headgeom.training.throughput`` (6 × trainable + 4 × frozen
  matmul weights + attention, against ``--peak-tflops`` or its table of known GPUs).
* On CPU (``--hf``, default there) the same step is timed on ``transformers``'
  GPT2LMHeadModel with the same sizes, batch, optimizer groups and loss, and the ratio of
  our learned model's tokens/s to it is printed (goal ≥ 1.0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headgeom.training.loop import (  # noqa: E402
    configure_matmuls,
    resolve_device,
    resolve_precision,
)
from headgeom.training.throughput import (  # noqa: E402
    PAPER_SHAPE,
    autocast_for,
    flops_per_token,
    model_for,
    peak_tflops,
    random_batches,
    timed_step,
    training_setup,
)

SHAPES = {
    "paper": PAPER_SHAPE,
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = shape_of(args)
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_matmuls(device, precision)
    compare_hf = device.type == "cpu" if args.hf is None else args.hf
    tokens = shape["batch"] * shape["n_ctx"]
    autocast = autocast_for(device, precision)

    models: dict[str, nn.Module] = {g: model_for(g, shape) for g in args.geometries}
    if compare_hf:
        models["GPT2LMHeadModel"] = hf_gpt2(shape)
    runs = {}
    for name, model in models.items():
        forward, opt, params = training_setup(model, device, args.compile)
        runs[name] = (forward, opt, params, [])

    # One CPU thread: the step's CPU time, which a busy machine does not inflate (wall time
    # there measures the other processes too); wall time on GPUs and with several threads.
    one_thread = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if one_thread else time.perf_counter
    batch = random_batches(shape, device)

    print(
        f"shape {args.shape} {shape}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", {precision}, compile={args.compile}, threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}, timing {'CPU' if one_thread else 'wall'} time",
        flush=True,
    )
    for r in range(args.warmup + args.rounds):
        for forward, opt, params, times in runs.values():
            seconds = timed_step(forward, opt, params, batch, device, autocast, clock)
            if r >= args.warmup:
                times.append(seconds)
        print(f"round {r + 1}/{args.warmup + args.rounds} done", file=sys.stderr, flush=True)

    peak, _ = peak_tflops(device, precision, args.peak_tflops)
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
