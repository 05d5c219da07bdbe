"""What the CPU kernel pin (``headgeom.kernels``) costs and what it changes: the demo's
training step, and the numpy/scipy linear algebra of both demos, under each kernel setting,
side by side, each in a fresh process (the libraries read their variables once, at
start-up).

    python benchmarks/kernel_pin.py --steps 60 --rounds 3

Settings: ``native`` (each library's fastest path on this CPU), ``avx2`` (the pin the
workflow sets), ``avx2 torch only`` (the pin without numpy's and OpenBLAS's variables: what
it was before it covered them), and the two portable paths a pin could use instead: torch's
``default`` kernels and MKL's ``COMPATIBLE`` path. Each round runs every setting once
(round-robin, so a drifting machine slows all alike). Each run, on one thread:

* ``train``: a demo-shape learned model from the same seed on the same random batches for
  ``--steps`` real training steps (``headgeom.training.loop.optimizer_step``): the median
  step time and the SHA-256 of its final parameters;
* ``linalg``: the numpy/scipy steps the pin's OpenBLAS and numpy variables decide: a
  768×768 Haar draw (numpy's QR; the paper's width), the weight-space geometry of a demo
  ``all-rotated`` model (its SVDs), 2,000 bootstrap resamples of N_eff (a GEMM and float64
  ``exp``), and an SA-MoE probe fit (scipy's L-BFGS-B): the median seconds of the four and
  the SHA-256 of their results.

The report gives, per setting and workload, the median over rounds, its ratio to
``native``, and whether its bytes are ``native``'s: a setting that changes them takes
other kernel paths on this machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from headgeom.kernels import (  # noqa: E402
    CHOICE,
    SAME_LIBRARY,
    cpu_flags,
    cpuinfo_value,
    kernel_pin,
)

PIN = kernel_pin("avx2", cpu_flags(), platform.machine())
TORCH_ONLY = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
SETTINGS = {
    "native": {CHOICE: "native"},
    "avx2": PIN,
    "avx2 torch only": {CHOICE: "native", **{k: v for k, v in PIN.items() if k in TORCH_ONLY}},
    "aten default": {CHOICE: "native", "ATEN_CPU_CAPABILITY": "default"},
    "mkl compatible": {CHOICE: "native", "MKL_CBWR": "COMPATIBLE"},
}
#: config/config.yaml's architecture and batch; the demo corpus's compact vocabulary is
#: about this size (results/demo/corpus/default/vocab.parquet).
DEMO_SHAPE = dict(n_layer=4, n_head=4, d_model=64, d_head=16, d_mlp=256, n_ctx=64, batch=32,
                  vocab=2048)  # fmt: skip


def train(steps: int) -> dict:
    """The demo's training step: median seconds, SHA-256 of the final parameters."""
    import torch

    from headgeom.training.throughput import (
        autocast_for,
        model_for,
        random_batches,
        timed_step,
        training_setup,
    )

    device = torch.device("cpu")
    model = model_for("learned", DEMO_SHAPE, seed=42)
    forward, opt, params = training_setup(model, device)
    batch = random_batches(DEMO_SHAPE, device, seed=42)
    autocast = autocast_for(device, "fp32")
    times = [timed_step(forward, opt, params, batch, device, autocast) for _ in range(steps)]
    sha = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(tensor.detach().contiguous().numpy().tobytes())
    return {"seconds": statistics.median(times[2:] or times), "sha256": sha.hexdigest()}


def linalg() -> dict:
    """The numpy/scipy steps of the demos: seconds of the four together, SHA-256 of results."""
    import numpy as np
    import yaml

    from headgeom.heads.analysis.geometry_summary import geometry_tables
    from headgeom.heads.analysis.stats import bootstrap_n_eff
    from headgeom.heads.study import Study
    from headgeom.samoe.probes import fit_logistic
    from headgeom.subspace import haar_orthogonal
    from headgeom.training.loop import initial_model

    demo = yaml.safe_load((SRC.parent / "config" / "config.yaml").read_text())
    model = initial_model(Study.from_config(demo).train_config("all-rotated", 42),
                          DEMO_SHAPE["vocab"])  # fmt: skip
    rng = np.random.default_rng(0)
    drops = rng.standard_normal((64, 4, 4))
    x = rng.standard_normal((2000, 64)).astype(np.float32)
    y = np.argmax(x[:, :5] + 0.5 * rng.standard_normal((2000, 5)), axis=1)
    start = time.perf_counter()
    q = haar_orthogonal(768, np.random.default_rng(1))
    geo = geometry_tables(model, "all-rotated", 42, "benchmark")
    n_eff = bootstrap_n_eff(drops, 2000, seed=3)
    probe = fit_logistic(x, y, 5, C=1.0)
    seconds = time.perf_counter() - start
    sha = hashlib.sha256()
    for array in (q, geo.pk.select_dtypes("number").to_numpy(), n_eff, probe.weight):
        sha.update(np.ascontiguousarray(array).tobytes())
    return {"seconds": seconds, "sha256": sha.hexdigest()}


def child(steps: int) -> None:
    """One run: print JSON (per workload: seconds and SHA-256; torch's capability)."""
    import torch

    torch.set_num_threads(1)
    print(json.dumps({"train": train(steps), "linalg": linalg(),
                      "capability": torch.backends.cpu.get_cpu_capability()}))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="training steps per run")
    p.add_argument("--rounds", type=int, default=3, help="runs per setting")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.steps)
        return 0
    others = {o for k in PIN for o in SAME_LIBRARY.get(k, ())}
    base = {k: v for k, v in os.environ.items() if k not in {CHOICE, *PIN, *others}}
    base["PYTHONPATH"] = str(SRC)
    base["OPENBLAS_NUM_THREADS"] = base["OMP_NUM_THREADS"] = base["MKL_NUM_THREADS"] = "1"
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name, env in SETTINGS.items():
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--steps", str(args.steps)],
                env={**base, **env}, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode:
                sys.exit(f"setting {name!r}: the child failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    cpu = cpuinfo_value("model name") or "?"
    width = "AVX-512" if "avx512f" in cpu_flags() else "AVX2" if "avx2" in cpu_flags() else "?"
    print(f"CPU {cpu} ({cpuinfo_value('vendor_id') or '?'}, {width}); demo shape {DEMO_SHAPE}; "
          f"{args.steps} steps × {args.rounds} rounds, 1 thread")  # fmt: skip
    for workload, unit, scale in (("train", "ms/step", 1e3), ("linalg", "s", 1.0)):
        native = statistics.median(r[workload]["seconds"] for r in runs["native"])
        reference = runs["native"][0][workload]["sha256"]
        print(f"\n{workload}\n{'setting':<16} {'capability':<10} {unit:>8} {'vs native':>9}  "
              "same bytes as native")  # fmt: skip
        for name, results in runs.items():
            value = statistics.median(r[workload]["seconds"] for r in results)
            shas = {r[workload]["sha256"] for r in results}
            same = "yes" if shas == {reference} else ("no" if len(shas) == 1 else "varies")
            print(f"{name:<16} {results[0]['capability']:<10} {value * scale:>8.3f} "
                  f"{value / native:>9.3f}  {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
