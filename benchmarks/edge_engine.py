"""Our exact edge-patching engine (docs §15.1) against the per-edge hook loops that hook
libraries run, on one paper-shape model and the first SVA validation examples.

    python benchmarks/edge_engine.py --threads 2                 # 4 SVA examples
    python benchmarks/edge_engine.py --engine-edges all          # time ours on all 28,512

The model has the paper's shape (12 × 12 heads, D = 768, d_mlp = 3072, V = 50,257) with the
`learned` geometry and random GPT-2-initialised weights (the cost does not depend on the
weights); examples are real SVA validation examples (GPT-2 ids). Three engines, one run:

* ours (:func:`headgeom.heads.analysis.edges.edge_kl`): resumed at the reader, suffix only, rows =
  edge × example, the reader once per writer;
* full-forward loop: one hooked full forward per edge (TransformerLens style,
  :func:`edge_kl_naive`);
* resuming loop: one hooked forward per edge from the reader's layer (what auto-circuit's
  ACDC does, ``resume=True``).

Timing every edge with the loops takes hours on this CPU, so the loops run on a FIXED random
sample of edges, stratified by reader layer (``--sample-per-layer`` per reader layer, seed
0), and their total is EXTRAPOLATED: mean seconds per edge of each reader layer × the
number of edges into that layer. Ours runs on every edge into reader head 0 of each
layer (1/H of all edges, the same work per edge as any other reader head) and is
extrapolated ×H unless ``--engine-edges all``. max |ΔKL| compares ours with both loops on
the sampled edges. The projection for the paper's 15 models (14 of 12 heads, one of 16
heads: 50,688 edges) × 16 examples scales ours by edges × examples.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patching_engine import (  # noqa: E402
    N_VOCAB,
    attention_flops,
    block_token_flops,
    paper_model,
    task_examples,
)

from headgeom.heads.analysis import edges as E  # noqa: E402
from headgeom.heads.analysis.batching import first_difference  # noqa: E402


def edge_flops(cfg, reader_layer: int, T: int, p: int, engine: str) -> int:
    """Matmul FLOPs of one edge × one example whose reader is in ``reader_layer``, on a
    prompt of length T first differing at p: ``ours`` (suffix S = T − p from the reader's
    layer, the last layer at the final position, the reader once per writer shared by 3H
    edges), ``resume`` (every position from the reader's layer) or ``full`` (a whole forward).
    Each ends with the full-vocabulary logits of the final position."""
    read, write, mlp = block_token_flops(cfg)
    L, H, S = cfg.n_layer, cfg.n_head, T - p
    logits = 2 * cfg.d_model * cfg.n_vocab
    if engine in ("full", "resume"):
        first = 0 if engine == "full" else reader_layer
        per_layer = T * (read + write + mlp) + sum(attention_flops(cfg, t + 1) for t in range(T))
        return (L - first) * per_layer + read * T // (3 * H) + logits
    last = reader_layer == L - 1
    flops = S * read // (3 * H)  # the reader on x + δ_i, shared by the writer's 3H edges
    rows = 1 if last else S  # the reader layer: head j attends, then W_O and the MLP
    flops += 4 * cfg.d_head * T * rows + rows * (write + mlp)
    for m in range(reader_layer + 1, L):
        if m == L - 1:
            flops += S * read + attention_flops(cfg, T) + write + mlp
        else:
            suffix_attn = sum(attention_flops(cfg, p + i + 1) for i in range(S))
            flops += S * (read + write + mlp) + suffix_attn
    return flops + logits


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=4)
    parser.add_argument("--sample-per-layer", type=int, default=2)
    parser.add_argument("--engine-edges", choices=["head0", "all"], default="head0")
    parser.add_argument("--max-rows", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model = paper_model(args.threads)
    L, H = model.cfg.n_layer, model.cfg.n_head
    clean, ref, _, _ = task_examples("sva", args.n_examples, "validation")
    N = len(clean)
    print(
        f"model 12×12, D=768, V={N_VOCAB}; {N} SVA validation examples, lengths "
        f"{sorted({len(c) for c in clean})}; torch threads {torch.get_num_threads()}"
    )
    edges = E.all_edges(L, H)
    total = len(edges)
    assert total == E.edge_count(L, H) == 28_512

    ours_set = edges if args.engine_edges == "all" else edges.subset(edges.reader_head == 0)
    t = time.perf_counter()
    E.edge_kl(model, clean, ref, ours_set, batch_size=N, max_rows=args.max_rows)
    ours_s = (time.perf_counter() - t) * total / len(ours_set)
    how = "measured" if len(ours_set) == total else f"measured on {len(ours_set)}, ×{H}"

    rng = np.random.default_rng(0)
    sample = np.concatenate(
        [
            rng.choice(np.flatnonzero(edges.reader_layer == rl), args.sample_per_layer, False)
            for rl in range(1, L)
        ]
    )
    sub = edges.subset(sample)
    ours_kl = E.edge_kl(model, clean, ref, sub, batch_size=N, max_rows=args.max_rows)
    loops = {}
    for name, resume in (("full-forward loop", False), ("resuming loop", True)):
        stamps = [time.perf_counter()]  # the caches, then one stamp per edge
        kl = E.edge_kl_naive(
            model,
            clean,
            ref,
            sub,
            resume,
            N,
            progress=lambda k, t=stamps: t.append(time.perf_counter()),
        )
        per_edge = np.diff(stamps)  # edge k's forward; the first also holds the caches:
        per_edge[0] = np.nan  # left out (its layer's other sampled edges stand for it)
        # extrapolate: mean time per edge of each reader layer × edges into that layer
        est = sum(
            np.nanmean(per_edge[sub.reader_layer == rl]) * (edges.reader_layer == rl).sum()
            for rl in range(1, L)
        )
        loops[name] = (est, float(np.abs(kl - ours_kl).max()), np.nansum(per_edge))
    print(
        f"\n{'engine':<20}{'edges/s':>10}{'total s (28,512 edges)':>26}{'ratio':>8}"
        f"{'max |ΔKL|':>12}"
    )
    print(f"{'ours':<20}{total / ours_s:>10.1f}{ours_s:>26.1f}{1:>8.1f}{'—':>12}  ({how})")
    for name, (est, diff, spent) in loops.items():
        print(
            f"{name:<20}{total / est:>10.2f}{est:>26.0f}{est / ours_s:>8.1f}{diff:>12.2e}"
            f"  (extrapolated from {len(sub)} sampled edges, {spent:.1f} s)"
        )
    T = len(clean[0])
    p = min(first_difference(clean[0], ref[0]), T - 1)  # as the engine resumes
    flops = {
        name: sum(
            edge_flops(model.cfg, rl, T, p, name) * (edges.reader_layer == rl).sum()
            for rl in range(1, L)
        )
        for name in ("ours", "full", "resume")
    }
    print(
        f"matmul FLOPs per example for all edges (T = {T}, first difference at {p}): ours "
        f"{flops['ours'] / 1e12:.2f} TFLOP ({flops['ours'] * N / ours_s / 1e9:.0f} GFLOP/s), "
        f"full-forward loop ×{flops['full'] / flops['ours']:.1f} of ours, resuming loop "
        f"×{flops['resume'] / flops['ours']:.1f}: the structural part of the ratios above; "
        f"the rest is the loops' small matmuls (one edge × {N} examples per forward)"
    )
    kl_range = (ours_kl.min(), ours_kl.max())
    print(f"KL on the sampled edges: {kl_range[0]:.3g} … {kl_range[1]:.3g}")
    per_row = ours_s / (total * N)
    paper = (14 * 28_512 + 50_688 * 16 / 12) * 16  # 16-head model: ≈ (16/12)× the work per row
    print(
        f"projected, paper's 15 models × 16 examples on this CPU: ours "
        f"{paper * per_row / 3600:.1f} h; full-forward loop "
        f"{paper * per_row * loops['full-forward loop'][0] / ours_s / 3600:.0f} h"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
