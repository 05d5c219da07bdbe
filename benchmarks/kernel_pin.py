"""What the CPU kernel pin (``headgeom.kernels``) costs and what it changes: the demo's
training step under each kernel setting, side by side, each in a fresh process (the
libraries read their variables once, at start-up).

    python benchmarks/kernel_pin.py --steps 60 --rounds 3

Settings: ``native`` (each library's fastest path on this CPU), ``avx2`` (the pin the
workflow sets), and the two portable paths a pin could use instead: torch's ``default``
kernels and MKL's ``COMPATIBLE`` path. Each round runs every setting once (round-robin, so
a drifting machine slows all alike); each run trains a demo-shape learned model from the
same seed on the same random batches for ``--steps`` real training steps
(``headgeom.training.loop.optimizer_step``, one thread) and prints its median step time
and the SHA-256 of its final parameters. The report gives, per setting, the median ms/step
over rounds, its ratio to ``native``, and whether its parameters are the same bytes as
``native``'s: a setting that changes them takes other kernel paths on this machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from headgeom.kernels import AVX2_PIN, CHOICE, cpuinfo_value  # noqa: E402

SETTINGS = {
    "native": {CHOICE: "native"},
    "avx2": AVX2_PIN,
    "aten default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl compatible": {"MKL_CBWR": "COMPATIBLE"},
}
#: config/config.yaml's architecture and batch; the demo corpus's compact vocabulary is
#: about this size (results/demo/corpus/default/vocab.parquet).
DEMO_SHAPE = dict(n_layer=4, n_head=4, d_model=64, d_head=16, d_mlp=256, n_ctx=64, batch=32,
                  vocab=2048)  # fmt: skip


def child(steps: int) -> None:
    """One run: train, print JSON (median step seconds, parameter SHA-256, capability)."""
    import torch

    from headgeom.training.throughput import (
        autocast_for,
        model_for,
        random_batches,
        timed_step,
        training_setup,
    )

    torch.set_num_threads(1)
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
    print(json.dumps({"step_s": statistics.median(times[2:] or times), "sha256": sha.hexdigest(),
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
    base = {k: v for k, v in os.environ.items() if k not in {CHOICE, *AVX2_PIN}}
    base["PYTHONPATH"] = str(SRC)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name, env in SETTINGS.items():
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--steps", str(args.steps)],
                env={**base, **env}, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    cpu = cpuinfo_value("model name") or "?"
    print(f"CPU {cpu}; demo shape {DEMO_SHAPE}; {args.steps} steps × {args.rounds} rounds, "
          "1 thread")  # fmt: skip
    native = statistics.median(r["step_s"] for r in runs["native"])
    reference = runs["native"][0]["sha256"]
    print(f"{'setting':<16} {'capability':<10} {'ms/step':>8} {'vs native':>9}  "
          "same bytes as native")  # fmt: skip
    for name, results in runs.items():
        step = statistics.median(r["step_s"] for r in results)
        shas = {r["sha256"] for r in results}
        same = "yes" if shas == {reference} else ("no" if len(shas) == 1 else "varies")
        print(f"{name:<16} {results[0]['capability']:<10} {step * 1e3:>8.2f} "
              f"{step / native:>9.3f}  {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
