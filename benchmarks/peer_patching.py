"""Head patching, ours beside every peer a user would pick instead, each in its own
environment (benchmarks/peers/envs.py), on the same model and examples, in one run.

    python benchmarks/peers/envs.py            # once: one virtual environment per peer
    python benchmarks/peer_patching.py         # paper shape, 4 and 16 SVA examples
    python benchmarks/peer_patching.py --n-examples 4 --peers nnsight-0.8

The model has the paper's shape (12 layers × 12 heads, D = 768, d_mlp = 3,072, GPT-2
vocabulary V = 50,257, `learned` geometry, seeded GPT-2 initialisation: the engines' cost
does not depend on the weights); the examples are the first n of the real SVA evaluation
split (GPT-2 ids). Both go to an exchange folder (benchmarks/peers/exchange.py): the model
as a `transformers` GPT-2 directory, the examples as Parquet. Each peer loads them in its
own way and runs its own documented patching API (the script named per peer), one process
per peer with the same torch threads; our engine (``patch_all_heads_fast``) runs here. Times
are the sweep only (models loaded): wall and CPU seconds, the peer's over ours, and max |Δe|
of the per-head mean effects against ours (an exact peer agrees to ≤ 1e-5).

A peer whose environment is not there is listed as skipped, with the command that makes it
(or pip's failing requirement, from envs.py).
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
from patching_engine import engine_flops, paper_model, task_examples, tl_flops  # noqa: E402
from peer_edges import matmul_rate  # noqa: E402
from peers import envs, exchange  # noqa: E402

#: Agreement an exact peer must reach (max |Δe| against ours, float32 both sides).
EXACT = 1e-5


def run_ours(model, pairs, repeats: int = 3) -> tuple[np.ndarray, float, float]:
    """Our mean e_{l,h} and the best of ``repeats`` sweeps' (wall, CPU) seconds."""
    from headgeom.heads.analysis.patching import patch_all_heads_fast

    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        clean_ld, patched = patch_all_heads_fast(
            model, *pairs, batch_size=len(pairs[0]), max_rows=4096
        )
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return (clean_ld[:, None, None] - patched).mean(axis=0), *best


def flop_bounds(model, pairs) -> tuple[float, float]:
    """Matmul FLOPs of our engine on ``pairs`` and of one full forward per head with every
    position's logits (what TransformerLens's and nnsight's per-head loops run; pyvene runs
    the source forward again each time), per equal-length group as both engines batch."""
    from headgeom.heads.analysis.batching import first_difference

    clean, ref = pairs[0], pairs[1]
    ours = full = 0
    for T in sorted({len(c) for c in clean}):
        group = [i for i, c in enumerate(clean) if len(c) == T]
        p = min(min(first_difference(clean[i], ref[i]) for i in group), T - 1)
        ours += engine_flops(model.cfg, len(group), T, p)
        full += tl_flops(model.cfg, len(group), T)
    return ours, full


def run_peer(peer: envs.Peer, folder: Path, threads: int) -> dict:
    out = folder / f"{peer.name}.npz"
    cmd = [str(peer.python), str(HERE / "peers" / peer.script), "--exchange", str(folder),
           "--out", str(out), "--threads", str(threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer.name} failed:\n{proc.stderr[-2000:]}")
    return exchange.read_effects(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-examples", type=int, nargs="+", default=[4, 16])
    heads = [name for name, peer in envs.PEERS.items() if peer.task == "heads"]
    parser.add_argument("--peers", nargs="+", default=heads, choices=heads)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every engine")
    parser.add_argument("--keep", type=Path, help="keep the exchange folder here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = paper_model(args.threads)
    cfg = model.cfg
    ready = [envs.PEERS[n] for n in args.peers if envs.PEERS[n].ready()]
    for name in args.peers:
        if not envs.PEERS[name].ready():
            print(f"skipped {name}: no environment (python benchmarks/peers/envs.py {name})")
    print(f"model: learned, L={cfg.n_layer} H={cfg.n_head} D={cfg.d_model} V={cfg.n_vocab}; "
          f"{args.threads} torch thread(s) per engine; SVA evaluation examples; times: the "
          "sweep, wall/CPU s")  # fmt: skip
    print(f"{'n':>3} {'engine':22} {'version':26} {'wall s':>9} {'CPU s':>9} {'× ours':>14} "
          f"{'max|Δe|':>9}  API")  # fmt: skip
    root = args.keep or Path(tempfile.mkdtemp(prefix="peer-patching-"))
    exchange.write_exchange(model, task_examples("sva", 1, "evaluation"), root)  # the model
    failed = []
    rate = matmul_rate(next(model.parameters()).dtype)
    for n in args.n_examples:
        pairs = task_examples("sva", n, "evaluation")
        exchange.write_examples(root / "examples.parquet", pairs)
        e, wall, cpu = run_ours(model, pairs)
        print(f"{n:3d} {'headgeom (ours)':22} {'':26} {wall:9.2f} {cpu:9.2f} {'1.0/1.0':>14} "
              f"{'—':>9}  patch_all_heads_fast (max |e| {np.abs(e).max():.2e})")  # fmt: skip
        ours_flops, loop_flops = flop_bounds(model, pairs)
        floor = ours_flops / rate  # our engine's time were every FLOP at the matmul rate
        print(f"    FLOP model: ours {ours_flops / 1e9:.0f} GFLOP ({ours_flops / wall / 1e9:.0f} "
              f"GFLOP/s, {ours_flops / wall / rate:.2f} of this CPU's matmul rate "
              f"{rate / 1e9:.0f} GFLOP/s); a full forward per head {loop_flops / 1e9:.0f} "
              f"GFLOP, ×{loop_flops / ours_flops:.1f} ours. At the matmul rate ours would take "
              f"{floor:.2f} s: a peer taking t s is at most t / {floor:.2f} × ours for any exact "
              "engine doing our FLOPs")  # fmt: skip
        for peer in ready:
            r = run_peer(peer, root, args.threads)
            delta = float(np.abs(r["effects"] - e).max())
            if delta > EXACT:
                failed.append((n, peer.name, delta))
            ratio = f"{r['wall'] / wall:.1f}/{r['cpu'] / cpu:.1f}"
            print(f"{n:3d} {peer.name:22} {r['version']:26} {r['wall']:9.2f} {r['cpu']:9.2f} "
                  f"{ratio:>14} {delta:9.2e}  {peer.what} (bound at the matmul rate: "
                  f"{r['wall'] / floor:.0f}×; runs at {loop_flops / r['wall'] / 1e9:.0f} "
                  "GFLOP/s of a per-head loop's FLOPs)")  # fmt: skip
    for n, name, delta in failed:
        print(f"NOT EXACT: {name} at n={n}: max |Δe| {delta:.2e} > {EXACT:g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
