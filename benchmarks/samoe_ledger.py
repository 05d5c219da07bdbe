"""The SA-MoE audit engines against their plain and naive counterparts, in one run:

* **Ledger overhead**: a plain forward (no hooks) against the audit (one hooked forward that
  records every SAMOE §9 site, then the ledger of every audited target and its history
  metrics from the captured data: zero extra passes).
* **Suppression engine**: ``headgeom.samoe.suppression.suppression_outcomes`` (R suppressions
  as rows of batched forwards) against a naive loop that runs one forward of one sequence
  per (target, source), with the same E7 hook; the outcomes must agree.

    python benchmarks/samoe_ledger.py [--shape toy|wide] [--targets 96] [--repeats 3]

Shapes: ``toy`` is config/samoe.yaml's model (N = 8, d = 64, E = 16, r = 16, T = 128);
``wide`` a 12-layer d = 256 model (r = 64). Random models with nonzero writes (the unit tests'
helper), 24 sequences, 4 targets per sequence at the last two layers. One thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from headgeom.samoe.capture import capture  # noqa: E402
from headgeom.samoe.config import DenseConfig, MoEConfig  # noqa: E402
from headgeom.samoe.ledger import Targets, history_metrics, ledger  # noqa: E402
from headgeom.samoe.model import SAMoE  # noqa: E402
from headgeom.samoe.suppression import Rows, suppressed_forward, suppression_outcomes  # noqa: E402
from tests.helpers.samoe import random_init  # noqa: E402

SHAPES = {
    "toy": (DenseConfig(n_layer=8, d_model=64, n_head=4, d_head=16, d_mlp=128, n_ctx=128),
            MoEConfig(n_experts=16, state_dim=16)),
    "wide": (DenseConfig(n_layer=12, d_model=256, n_head=4, d_head=64, d_mlp=512, n_ctx=128),
             MoEConfig(n_experts=16, state_dim=64)),
}  # fmt: skip
N_VOCAB, N_SEQ = 918, 24


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def naive_outcomes(model, ids, cap, targets: Targets) -> torch.Tensor:
    """Δm of every (target, source), one forward of one sequence each."""
    out = []
    for i in range(len(targets)):
        b, t, L = int(targets.batch[i]), int(targets.position[i]), int(targets.layer[i])
        e2, e3 = cap.top_ids[L, b, t, 1], cap.top_ids[L, b, t, 2]
        clean = cap.logits[L, b, t, e2] - cap.logits[L, b, t, e3]
        for src in range(L):
            z, _ = suppressed_forward(model, ids, Rows([b], [t], [src]))
            out.append(float(z[L, 0, t, e2] - z[L, 0, t, e3] - clean))
    return torch.tensor(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="toy")
    parser.add_argument("--targets", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dense, moe = SHAPES[args.shape]
    model = SAMoE(dense.model_config(N_VOCAB), moe, "persistent")
    random_init(model, torch.Generator().manual_seed(0), write_std=0.3).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, N_VOCAB, (N_SEQ, dense.n_ctx), generator=g)
    N, per_seq = dense.n_layer, max(args.targets // N_SEQ, 1)
    batch = torch.arange(N_SEQ).repeat_interleave(per_seq)[: args.targets]
    position = torch.randint(dense.n_ctx // 8, dense.n_ctx - 1, (len(batch),), generator=g)
    layer = torch.tensor([N - 2, N - 1] * (len(batch) // 2 + 1))[: len(batch)]
    targets = Targets(batch, position, layer)
    print(
        f"shape {args.shape}: N={N}, d={dense.d_model}, E={moe.n_experts}, r={moe.state_dim}, "
        f"{N_SEQ} sequences × {dense.n_ctx} tokens, {len(targets)} targets, 1 thread"
    )

    with torch.no_grad():
        plain = median_time(lambda: model(ids), args.repeats)
    cap_t = median_time(lambda: capture(model, ids), args.repeats)
    cap = capture(model, ids)

    def decompose():
        led = ledger(model, cap, targets)
        history_metrics(led.contributions, targets.layer)

    led_t = median_time(decompose, args.repeats)
    print("\nledger overhead                 seconds   × plain forward")
    print(f"  plain forward                  {plain:7.3f}   1.00")
    print(f"  capture (hooked forward)       {cap_t:7.3f}   {cap_t / plain:4.2f}")
    print(f"  ledger + history ({len(targets)} targets) {led_t:7.4f}   {led_t / plain:4.3f}")
    print(f"  audit total                    {cap_t + led_t:7.3f}   {(cap_t + led_t) / plain:4.2f}")

    engine_start = time.perf_counter()
    outcomes = suppression_outcomes(model, ids, cap, targets)
    engine = time.perf_counter() - engine_start
    naive_start = time.perf_counter()
    naive = naive_outcomes(model, ids, cap, targets)
    slow = time.perf_counter() - naive_start
    R = len(outcomes.margin_change)
    diff = float((outcomes.margin_change.double() - naive.double()).abs().max())
    print(f"\nsuppression of every source of every target ({R} suppressions)")
    print(f"  engine (batched rows)          {engine:7.2f} s   {R / engine:8.1f} suppressions/s")
    print(f"  naive loop (one forward each)  {slow:7.2f} s   {R / slow:8.1f} suppressions/s")
    print(f"  engine speed-up {slow / engine:.1f}×; max |Δm engine − Δm naive| {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
