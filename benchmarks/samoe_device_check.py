"""One prepared device check of the SA-MoE analyses (docs/samoe.md "Analyses on a GPU"): each
library computation of capture, the ledger, suppression, gradient×write, Li attribution,
the probes and perplexity, run on the CPU and on ``--device``, with the largest difference
between the two, the acceptance checks on the device (K6, K7, K8, K9, K11, K13 in float64,
K14, K10) and both wall times.

    python benchmarks/samoe_device_check.py OUT                     # CUDA: under a minute
    python benchmarks/samoe_device_check.py OUT --device cpu --shape tiny   # dry mode, seconds

Writes ``OUT/samoe_device_check.json``. Random models with nonzero writes (the unit tests'
helper) of the toy's shape (N = 8, d = 64, E = 16, r = 16, T = 128; ``--shape wide``: a
12-layer d = 256 model), 8 sequences, 4 targets per sequence. Differences are expected at
float32 rounding (kernels differ between devices); a selection flip (a Top-2 set that
differs) is counted, not a failure. Exits 1 when a check fails on the device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from headgeom.checks import CheckFailed  # noqa: E402
from headgeom.runtime import analysis_device, environment, synchronize  # noqa: E402
from headgeom.samoe import li, probes  # noqa: E402
from headgeom.samoe.capture import capture, check_state_bounds  # noqa: E402
from headgeom.samoe.config import DenseConfig, MoEConfig  # noqa: E402
from headgeom.samoe.ledger import (  # noqa: E402
    Targets,
    boundary_pair,
    check_ledger,
    check_replay,
    ledger,
    state_only_replay,
)
from headgeom.samoe.model import SAMoE  # noqa: E402
from headgeom.samoe.quality import perplexity  # noqa: E402
from headgeom.samoe.rankings import check_gradient, finite_difference, gradient_x_write  # noqa: E402
from headgeom.samoe.suppression import (  # noqa: E402
    Rows,
    check_hook_no_op,
    check_unit_lambda,
    set_change_rates,
    suppression_outcomes,
)
from tests.helpers.samoe import random_init  # noqa: E402

SHAPES = {
    "toy": (DenseConfig(n_layer=8, d_model=64, n_head=4, d_head=16, d_mlp=128, n_ctx=128),
            MoEConfig(n_experts=16, state_dim=16)),
    "wide": (DenseConfig(n_layer=12, d_model=256, n_head=8, d_head=32, d_mlp=1024, n_ctx=128),
             MoEConfig(n_experts=16, state_dim=64)),
    # dry mode: the unit tests' shape, every path in seconds on a CPU
    "tiny": (DenseConfig(n_layer=6, d_model=32, n_head=2, d_head=16, d_mlp=48, n_ctx=32),
             MoEConfig(n_experts=8, state_dim=8)),
}  # fmt: skip
N_VOCAB, N_SEQ = 512, 8
#: Targets of the per-target computations (suppression grid, gradients, K13, Li's oracle).
FEW = 8


def first(targets: Targets) -> Targets:
    return Targets(*(v[:FEW] for v in (targets.batch, targets.position, targets.layer)))


def model_of(shape: str, variant: str, seed: int) -> SAMoE:
    dense, moe = SHAPES[shape]
    model = SAMoE(dense.model_config(N_VOCAB), moe, variant)
    return random_init(model, torch.Generator().manual_seed(seed), write_std=0.3).eval()


def targets_of(n_layer: int, T: int) -> Targets:
    """4 targets per sequence at the last two layers, distinct positions in [T/8, T − 1)."""
    stride = (T - T // 8 - 1 - N_SEQ) // 4
    rows = [
        (b, T // 8 + stride * slot + b, layer)
        for b in range(N_SEQ)
        for slot, layer in enumerate((n_layer - 2, n_layer - 1, n_layer - 2, n_layer - 1))
    ]
    return Targets(*map(list, zip(*rows, strict=True)))  # fmt: skip


def largest_difference(a, b) -> float:
    """max |a − b| over every tensor of two results (NaN where both are NaN ignored)."""
    if isinstance(a, torch.Tensor):
        a, b = a.detach().cpu().double(), b.detach().cpu().double()
        both = a.isnan() & b.isnan()
        return float((a - b).abs().masked_fill(both, 0).max()) if a.numel() else 0.0
    if isinstance(a, np.ndarray):
        return largest_difference(torch.as_tensor(a), torch.as_tensor(b))
    if isinstance(a, dict):
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, tuple | list):
        return max((largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if hasattr(a, "__dataclass_fields__"):
        return largest_difference(vars(a), vars(b))
    if isinstance(a, float | int):
        return abs(float(a) - float(b))
    return 0.0


def timed(fn, device: torch.device):
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def compare(name: str, fn, device: torch.device, cpu_args, dev_args, report: dict) -> tuple:
    """Run ``fn`` on the CPU and on ``device``; record the difference and both times."""
    cpu_out, cpu_s = timed(lambda: fn(*cpu_args), torch.device("cpu"))
    fn(*dev_args)  # warm-up (kernels, allocator)
    dev_out, dev_s = timed(lambda: fn(*dev_args), device)
    report["comparisons"][name] = {"max_abs_difference": largest_difference(cpu_out, dev_out),
                                   "cpu_s": cpu_s, "device_s": dev_s}  # fmt: skip
    return cpu_out, dev_out


def check(report: dict, name: str, fn, *args) -> None:
    """Record ``fn(*args)`` (a check's record) or its failure."""
    try:
        report["checks"][name] = fn(*args)
    except CheckFailed as err:
        report["checks"][name] = {"failed": str(err)}
        report["failed"].append(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda", help="the device to compare with the CPU")
    parser.add_argument("--shape", choices=list(SHAPES), default="toy")
    args = parser.parse_args(argv)
    try:
        device = analysis_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    cpu = torch.device("cpu")
    report: dict = {"device": str(device), "shape": args.shape, "environment": environment(),
                    "comparisons": {}, "checks": {}, "failed": []}  # fmt: skip
    T = SHAPES[args.shape][0].n_ctx
    ids = torch.randint(0, N_VOCAB, (N_SEQ, T), generator=torch.Generator().manual_seed(0))
    for variant in ("latest", "persistent"):
        m_cpu = model_of(args.shape, variant, seed=1)
        m_dev = model_of(args.shape, variant, seed=1).to(device)
        targets = targets_of(len(m_cpu.blocks), T)
        x_dev, t_dev = ids.to(device), targets.to(device)
        cap_c, cap_d = compare(f"{variant}.capture", capture, device, (m_cpu, ids),
                               (m_dev, x_dev), report)  # fmt: skip
        led_c, led_d = compare(f"{variant}.ledger", ledger, device, (m_cpu, cap_c, targets),
                               (m_dev, cap_d, t_dev), report)  # fmt: skip
        check(report, f"{variant}.K2", check_state_bounds, cap_d, variant, m_dev.moe_cfg.clamp)
        check(report, f"{variant}.K6_K7", check_ledger, m_dev, cap_d, led_d)
        check(report, f"{variant}.K9", check_unit_lambda, m_dev, cap_d)
        compare(
            f"{variant}.set_change_rates",
            set_change_rates,
            device,
            (m_cpu, cap_c, [1.0, 0.5, 0.0]),
            (m_dev, cap_d, [1.0, 0.5, 0.0]),
            report,
        )
        if variant == "persistent":
            rep = state_only_replay(m_dev, cap_d, t_dev, led_d)
            check(report, f"{variant}.K8", check_replay, led_d, rep)
        rows = Rows(t_dev.batch, t_dev.position, t_dev.layer - 1)
        check(report, f"{variant}.K11", check_hook_no_op, m_dev, x_dev, rows)
        compare(
            f"{variant}.suppression_outcomes",
            suppression_outcomes,
            device,
            (m_cpu, ids, cap_c, first(targets)),
            (m_dev, x_dev, cap_d, first(t_dev)),
            report,
        )
        e2c, e3c, e2d, e3d = led_c.e2, led_c.e3, led_d.e2, led_d.e3
        report["checks"][f"{variant}.boundary_pairs_differing"] = int(
            ((e2c != e2d.cpu()) | (e3c != e3d.cpu())).sum())  # fmt: skip
        compare(
            f"{variant}.gradient_x_write",
            gradient_x_write,
            device,
            (m_cpu, ids, first(targets), e2c[:FEW], e3c[:FEW]),
            (m_dev, x_dev, first(t_dev), e2d[:FEW], e3d[:FEW]),
            report,
        )
        if variant == "persistent":  # K13 in float64 on the device, as samoe_interventions
            m64 = model_of(args.shape, variant, seed=1).double().to(device)
            few = first(t_dev)
            g = gradient_x_write(m64, x_dev, few, e2d[:FEW], e3d[:FEW])
            fd, flip = finite_difference(m64, x_dev, few, e2d[:FEW], e3d[:FEW])
            check(report, "persistent.K13_float64", check_gradient, g, fd, flip)
        compare(f"{variant}.perplexity", perplexity, device, (m_cpu, ids), (m_dev, x_dev), report)
    # Li on the ordinary MoE
    m_cpu = model_of(args.shape, "ordinary", seed=2)
    m_dev = model_of(args.shape, "ordinary", seed=2).to(device)
    targets = targets_of(len(m_cpu.blocks), T)
    t_dev, x_dev = targets.to(device), ids.to(device)
    cap_c, cap_d = capture(m_cpu, ids), capture(m_dev, x_dev)
    (e2c, e3c), (e2d, e3d) = boundary_pair(cap_c, targets), boundary_pair(cap_d, t_dev)
    _, att = compare("ordinary.li_attribute", li.attribute, device,
                     (m_cpu, ids, cap_c, targets, e2c, e3c),
                     (m_dev, x_dev, cap_d, t_dev, e2d, e3d), report)  # fmt: skip
    check(report, "ordinary.K14", li.check_reconstruction, att)
    few_c = first(targets)
    few_d = few_c.to(device)
    compare(
        "ordinary.li_gradient",
        li.gradient_x_component,
        device,
        (m_cpu, ids, few_c, e2c[:FEW], e3c[:FEW]),
        (m_dev, x_dev, few_d, e2d[:FEW], e3d[:FEW]),
        report,
    )
    compare(
        "ordinary.li_oracle",
        li.oracle_effects,
        device,
        (m_cpu, ids, few_c, e2c[:FEW], e3c[:FEW]),
        (m_dev, x_dev, few_d, e2d[:FEW], e3d[:FEW]),
        report,
    )
    # probes: float64 L-BFGS and the MLP on the device, features from the persistent capture
    feats = cap_c.router_in[2].reshape(-1, cap_c.router_in.shape[-1]).numpy()
    labels = cap_c.top_ids[5, ..., 0].reshape(-1).numpy()
    half = len(labels) // 2
    train, calib = (feats[:half], labels[:half]), (feats[half:], labels[half:])
    E = m_cpu.moe_cfg.n_experts
    p_cpu, p_dev = compare("probes.fit_selected", lambda d: probes.fit_selected(
        train, calib, E, device=d), device, (cpu,), (device,), report)  # fmt: skip
    check(report, "probes.K10", probes.check_converged, [p_dev])
    compare(
        "probes.pca_basis",
        lambda d: np.abs(probes.pca_basis(train[0], 8, device=d)),
        device,
        (cpu,),
        (device,),
        report,
    )  # |V|: the signs of singular vectors are free
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "samoe_device_check.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    worst = max(report["comparisons"].items(), key=lambda kv: kv[1]["max_abs_difference"])
    print(f"{path}: {len(report['comparisons'])} comparisons (largest difference "
          f"{worst[1]['max_abs_difference']:.3g} in {worst[0]}), {len(report['checks'])} checks, "
          f"failed: {report['failed'] or 'none'}")  # fmt: skip
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
