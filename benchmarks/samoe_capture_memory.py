"""Peak host memory of a pool's capture, whole versus chunked (``capture.batch_sequences``).

    python benchmarks/samoe_capture_memory.py [--sequences 256] [--seq 128] [--vocab 8192] \\
        [--batch 2]

Each mode runs in its own subprocess on the CPU (one thread) and reports that process's peak
resident set (``ru_maxrss``) above its RSS just before the capture (model built, ids made):

* ``whole``: ``capture(model, ids)``, the unchunked code: one forward of the pool keeping every
  site and the output logits.
* ``capture_chunked``: what ``samoe_capture`` now does with the final pool: ``captures(...,
  batch, ("router_in", "state"))`` reduced chunk by chunk (``PoolStates``, ``PoolSetChanges``).
* ``probes_chunked``: ``samoe_probes.PoolData`` of the pool, two source layers, 10,000 kept
  positions (a budget), ``batch`` sequences a forward.

The model is a random Persistent SA-MoE of the toy's shape (N = 8, d = 64, E = 16, r = 16)
with a ``--vocab`` tied head (the output logits are what a large vocabulary makes large).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def run_mode(mode: str, sequences: int, seq: int, vocab: int, batch: int) -> dict:
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    import numpy as np
    import torch

    from headgeom.samoe.capture import PoolStates, capture, captures
    from headgeom.samoe.config import DenseConfig, MoEConfig
    from headgeom.samoe.model import SAMoE
    from headgeom.samoe.stages import (
        probes as samoe_probes,  # imported before the baseline: its imports are not the capture's
    )
    from headgeom.samoe.suppression import PoolSetChanges
    from tests.helpers.samoe import random_init

    torch.set_num_threads(1)
    dense = DenseConfig(n_layer=8, d_model=64, n_head=4, d_head=16, d_mlp=128, n_ctx=seq)
    moe = MoEConfig(n_experts=16, top_k=2, state_dim=16)
    model = SAMoE(dense.model_config(vocab), moe, "persistent")
    random_init(model, torch.Generator().manual_seed(0), write_std=0.4).eval()
    ids = torch.randint(0, vocab, (sequences, seq), generator=torch.Generator().manual_seed(1))
    before = rss_mb()
    if mode == "whole":
        cap = capture(model, ids)
        kept = sum(v.numel() * v.element_size() for v in vars(cap).values()
                   if isinstance(v, torch.Tensor))  # fmt: skip
    elif mode == "capture_chunked":
        states, changes = PoolStates(moe.clamp), PoolSetChanges(model, [1.0, 0.5, 0.0])
        for _, chunk in captures(model, ids, batch, ("router_in", "state")):
            states.add(chunk)
            changes.add(chunk)
            del chunk
        kept = sum(n.numel() * n.element_size() for n in states.norms) + sum(
            c.numel() * c.element_size() for v in changes.changes.values() for c in v
        )
    else:
        keep = np.random.default_rng(0).permutation(sequences * seq)[:10_000]
        data = samoe_probes.PoolData(model, ids, [str(i) for i in range(sequences)], [2, 3],
                                     [2, 3, 5, 7], keep, batch)  # fmt: skip
        kept = sum(a.nbytes for d in (data.hidden, data.state, data.top2) for a in d.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MB on Linux
    return {"mode": mode, "peak_above_start_mb": round(peak - before, 1),
            "kept_mb": round(kept / 2**20, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = (args.sequences, args.seq, args.vocab, args.batch)
    if args.mode:
        print(json.dumps(run_mode(args.mode, *shape)))
        return 0
    print(f"pool {args.sequences} x {args.seq} tokens, N=8 d=64 E=16 r=16 V={args.vocab}, "
          f"chunks of {args.batch} sequences (CPU, 1 thread)")  # fmt: skip
    for mode in ("whole", "capture_chunked", "probes_chunked"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--sequences",
                              str(args.sequences), "--seq", str(args.seq), "--vocab",
                              str(args.vocab), "--batch", str(args.batch)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {r['mode']:<16} peak RSS above start {r['peak_above_start_mb']:>8.1f} MB, "
              f"kept {r['kept_mb']:>7.1f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
