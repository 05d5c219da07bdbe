"""Edge patching, ours beside auto-circuit's own edge patching in its own environment
(benchmarks/peers/envs.py), on the same paper-shape model and examples, in one run.

    python benchmarks/peers/envs.py auto-circuit-1.0   # once
    python benchmarks/peer_edges.py                    # 4 SVA validation examples
    python benchmarks/peer_edges.py --sample-per-layer 8 --dtype float32

The model is benchmarks/patching_engine.py's paper-shape one (12 × 12, D = 768, V = 50,257,
seeded GPT-2 initialisation), in float64 by default (the edge stage's dtype, docs §15.1);
the examples are the first 4 SVA validation examples. Both go to an exchange folder
(benchmarks/peers/exchange.py). The edge is ours (writer head → reader head's q/k/v input,
every position, KL(P_clean ‖ P_patched) at the last one); auto-circuit computes it with its
factorized ``patchable_model`` and ``patch_mode``, one edge mask per forward (the script's
docstring shows the two are the same patch).

All 28,512 edges take auto-circuit about an hour here, so it runs on a FIXED sample,
stratified by reader layer (``--sample-per-layer`` per reader layer, seed 0, as
benchmarks/edge_engine.py), and its total is EXTRAPOLATED: its seconds per sampled edge ×
28,512. Ours is timed on every edge into reader head 0 of each layer (1/H of all edges, the
same work per edge as any other reader head) × H, and also computes the sample, untimed,
for max |ΔKL| (absolute, and relative where KL ≥ 1e-9).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from edge_engine import edge_flops  # noqa: E402
from patching_engine import paper_model, task_examples  # noqa: E402
from peers import envs, exchange  # noqa: E402

from headgeom.heads.analysis import edges as E  # noqa: E402
from headgeom.heads.analysis.batching import first_difference  # noqa: E402

PEER = envs.PEERS["auto-circuit-1.0"]


def stratified(edges: E.Edges, per_layer: int, seed: int = 0) -> np.ndarray:
    """Sorted indices into ``edges``: ``per_layer`` edges into each reader layer ≥ 1."""
    rng = np.random.default_rng(seed)
    L = int(edges.reader_layer.max()) + 1
    return np.sort(np.concatenate([
        rng.choice(np.flatnonzero(edges.reader_layer == rl), per_layer, replace=False)
        for rl in range(1, L)]))  # fmt: skip


def matmul_rate(dtype: torch.dtype, n: int = 768, seconds: float = 2.0) -> float:
    """This CPU's matmul FLOP/s at the model's width (n × n by n × 4n, as the MLP), in
    ``dtype``, the best of repeated products over about ``seconds``."""
    a, b = torch.randn(256, n, dtype=dtype), torch.randn(n, 4 * n, dtype=dtype)
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * 256 * n * 4 * n / (time.perf_counter() - t))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-examples", type=int, default=4)
    parser.add_argument("--sample-per-layer", type=int, default=20)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-rows", type=int, default=2048, help="ours: rows per forward")
    parser.add_argument("--keep", type=Path, help="keep the exchange folder here")
    args = parser.parse_args(argv)
    if not PEER.ready():
        print(f"skipped {PEER.name}: no environment (python benchmarks/peers/envs.py "
              f"{PEER.name})")  # fmt: skip
        return 0
    model = paper_model(args.threads)
    L, H = model.cfg.n_layer, model.cfg.n_head
    pairs = task_examples("sva", args.n_examples, "validation")
    clean, ref = pairs[0], pairs[1]
    root = args.keep or Path(tempfile.mkdtemp(prefix="peer-edges-"))
    exchange.write_exchange(model, pairs, root)
    model = model.to(getattr(torch, args.dtype))
    edges = E.all_edges(L, H)
    total = len(edges)
    sample = stratified(edges, args.sample_per_layer)
    np.savez(root / "edges.npz", index=sample)
    print(f"model 12×12, D=768, V={model.cfg.n_vocab}, {args.dtype}; {len(clean)} SVA "
          f"validation examples; {args.threads} torch thread(s) per engine; sample: "
          f"{len(sample)} of {total:,} edges ({args.sample_per_layer} per reader "
          "layer)")  # fmt: skip

    head0 = edges.subset(edges.reader_head == 0)
    wall, cpu = time.perf_counter(), time.process_time()
    E.edge_kl(model, clean, ref, head0, batch_size=len(clean), max_rows=args.max_rows)
    ours_wall = (time.perf_counter() - wall) * total / len(head0)
    ours_cpu = (time.process_time() - cpu) * total / len(head0)
    ours_kl = E.edge_kl(model, clean, ref, edges.subset(sample), batch_size=len(clean),
                        max_rows=args.max_rows).mean(axis=0)  # fmt: skip

    out = root / f"{PEER.name}.npz"
    cmd = [str(PEER.python), str(HERE / "peers" / PEER.script), "--exchange", str(root),
           "--out", str(out), "--edges", str(root / "edges.npz"), "--dtype", args.dtype,
           "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{PEER.name} failed:\n{proc.stderr[-2000:]}")
    with np.load(out) as f:
        peer = {k: f[k] for k in f.files}
    assert np.array_equal(peer["writer"][:, 0], edges.writer_layer[sample])
    assert np.array_equal(peer["reader"][:, 1], edges.reader_head[sample])
    peer_wall = float(peer["wall"]) / len(sample) * total
    peer_cpu = float(peer["cpu"]) / len(sample) * total
    diff = np.abs(peer["kl"] - ours_kl)
    big = ours_kl >= 1e-9
    rel = float((diff[big] / ours_kl[big]).max()) if big.any() else float("nan")

    print(f"\n{'engine':<34}{'edges/s':>10}{'28,512 edges, s (wall/CPU)':>30}{'× ours':>10}"
          f"{'max |ΔKL|':>12}{'max rel':>10}")  # fmt: skip
    print(f"{'headgeom edge_kl (ours)':<34}{total / ours_wall:>10.1f}"
          f"{f'{ours_wall:,.0f}/{ours_cpu:,.0f}':>30}{1.0:>10.1f}{'—':>12}{'—':>10}"
          f"  measured on {len(head0):,} (reader head 0), ×{H}")  # fmt: skip
    print(f"{str(peer['version'])[:33]:<34}{total / peer_wall:>10.1f}"
          f"{f'{peer_wall:,.0f}/{peer_cpu:,.0f}':>30}{peer_wall / ours_wall:>10.1f}"
          f"{diff.max():>12.2e}{rel:>10.2e}  measured on {len(sample)}, extrapolated")  # fmt: skip
    print(f"KL on the sample: max {ours_kl.max():.3e}, median {np.median(ours_kl):.3e}")
    # our rate against the FLOP model of its work and this CPU's matmul rate, same run
    flops = 0
    for c, r in zip(clean, ref, strict=True):
        p = min(first_difference(c, r), len(c) - 1)
        flops += sum(edge_flops(model.cfg, rl, len(c), p, "ours") * (edges.reader_layer == rl)
                     .sum() for rl in range(1, L))  # fmt: skip
    rate = matmul_rate(model.wte.weight.dtype)
    achieved = flops / ours_wall
    print(f"ours: {flops / 1e12:.2f} TFLOP of matmuls by the FLOP model (edge_engine.edge_flops) "
          f"for all edges, {achieved / 1e9:.1f} GFLOP/s; this CPU's {args.dtype} matmul rate "
          f"{rate / 1e9:.1f} GFLOP/s ({args.threads} thread(s)): {achieved / rate:.2f} of the "
          "ceiling")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
