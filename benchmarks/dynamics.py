"""Task gradients τ (docs §13.4) and V-gradient traces (§14.4) against naive peers.

    python benchmarks/dynamics.py                  # the demo's shape, 240 SVA prompts
    python benchmarks/dynamics.py --paper-shape --n-examples 48

τ: ``analysis.dynamics.task_gradients`` (one backward per prompt length, every layer's
attention output at once) against one backward per prompt. V-gradient traces:
``value_gradient_traces`` (one backward, G_h read off the reader's parameter gradients)
against the definition: a central difference of the loss along W_V^h ← W_V^h ± εO_jᵀ per
(layer, h, j) (2·L·H² forwards). Model: write-common-axis, float64, GPT-2 initialisation;
random prompts of SVA-like lengths. Prints wall seconds of both, the speed-up and the
largest difference of the results.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.heads.analysis.dynamics import lm_loss, task_gradients, value_gradient_traces
from headgeom.heads.analysis.evaluation import length_groups
from headgeom.model import registry, zoo

DEMO = dict(n_layer=4, n_head=4, d_model=64, d_head=16, d_mlp=256, n_ctx=64)
PAPER = dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512)


def model_of(arch: dict, n_vocab: int) -> torch.nn.Module:
    cfg = zoo.derive_model_config("write-common-axis", arch)
    return registry.build_model(cfg, n_vocab=n_vocab).double().eval()


def naive_tau(model, ids, correct, incorrect):
    out = [[] for _ in model.blocks]
    for i, seq in enumerate(ids):
        grads = task_gradients(model, [seq], [correct[i]], [incorrect[i]])
        for layer, g in enumerate(grads):
            out[layer].append(g / len(ids))
    return [np.concatenate(rows) for rows in out]


def naive_traces(model, x, y, eps=1e-2):
    fd = []
    for block in model.blocks:
        W_O = block.attn.writer.write_maps().detach()
        H = W_O.shape[0]
        tr = np.zeros((H, H))
        for h in range(H):
            for j in range(H):
                with torch.no_grad():
                    V = block.attn.reader.read_maps("V")
                    V[h] += eps * W_O[j].T
                    up = float(lm_loss(model, x, y))
                    V[h] -= 2 * eps * W_O[j].T
                    down = float(lm_loss(model, x, y))
                    V[h] += eps * W_O[j].T
                tr[h, j] = (up - down) / (2 * eps)
        fd.append(tr)
    return fd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paper-shape", action="store_true")
    p.add_argument("--n-examples", type=int, default=240)
    p.add_argument("--sequences", type=int, default=8, help="LM windows of the V-gradient loss")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    arch = PAPER if args.paper_shape else DEMO
    n_vocab = 50257 if args.paper_shape else 632
    model = model_of(arch, n_vocab)
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 13, args.n_examples)  # SVA prompts: a few lengths
    ids = [rng.integers(0, n_vocab, n) for n in lengths]
    correct, incorrect = rng.integers(0, n_vocab, (2, args.n_examples))
    print(f"shape {arch}, {args.n_examples} prompts in {len(length_groups(ids))} lengths")

    t = time.perf_counter()
    fast = task_gradients(model, ids, correct, incorrect)
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    slow = naive_tau(model, ids, correct, incorrect)
    t_slow = time.perf_counter() - t
    # the naive rows are per prompt in input order too
    diff = max(float(np.abs(a - b).max()) for a, b in zip(fast, slow, strict=True))
    print(f"τ: batched {t_fast:.2f} s, per-prompt {t_slow:.2f} s, speed-up "
          f"{t_slow / t_fast:.1f}×, max |Δ| {diff:.2e}")  # fmt: skip

    x = torch.as_tensor(rng.integers(0, n_vocab, (args.sequences, arch["n_ctx"])))
    y = torch.as_tensor(rng.integers(0, n_vocab, (args.sequences, arch["n_ctx"])))
    t = time.perf_counter()
    rows = value_gradient_traces(model, x, y)
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    fd = naive_traces(model, x, y)
    t_slow = time.perf_counter() - t
    own = np.array([fd[r.layer][r.head, r.head] for r in rows.itertuples()])
    rel = float(np.max(np.abs(own - rows["own_trace"].to_numpy()) / np.abs(own).max()))
    agree = np.mean([
        (abs(fd[r.layer][r.head, r.head]) > np.abs(np.delete(fd[r.layer][r.head], r.head)).max())
        == r.own_largest for r in rows.itertuples()
    ])  # fmt: skip
    print(f"V-gradient traces: one backward {t_fast:.2f} s, {2 * len(fd) * fd[0].size} "
          f"central differences {t_slow:.2f} s, speed-up {t_slow / t_fast:.1f}×, max rel |Δ| of "
          f"tr(G_h O_h) {rel:.2e}, own_largest agrees on {100 * agree:.0f}% of heads")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
