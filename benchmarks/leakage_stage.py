"""The leakage stage (one pass: δ, C8, C9, L, ρ, direct/total responses, attention TV;
docs §11.2–11.6) against the fast patching engine it reuses, on the same inputs.

    python benchmarks/leakage_stage.py                     # paper shape, 8 examples (a few minutes)
    python benchmarks/leakage_stage.py --n-examples 240 --scaling-examples 64
                                                  # the paper's 240 (~25 min on 2 cores)

Model: the paper's shape (12 layers × 12 heads, D = 768, d_mlp = 3072), `learned`
geometry, random GPT-2-style weights (cost does not depend on the weights), a 1,024-token
vocabulary (the unembedding is not what either stage spends its time on). Examples: random
prompts of T = 16 tokens whose reference differs from position 4 on (an SVA-like first
difference). Prints absolute seconds of both stages, their ratio, both stages' cost per paper
model–task (the patching stage covers 812 examples in four splits, the leakage stage the 240
of the evaluation split), the previous leakage stage (naive peer), and how the leakage stage
scales with examples (n/2 → n) and heads (H/2 → H at fixed D). On 2 cores, 240 examples:
patching 229.9 s, leakage 448.1 s (×1.95 per example); per paper model–task leakage 448 s
against patching 778 s (×0.58); at 32 examples the naive peer takes 209.0 s against 58.2 s
(×3.59); examples 16 → 32 ×1.94, heads 6 → 12 ×1.31.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.data.task_files import PatchInputs
from headgeom.heads.analysis.batching import length_batches
from headgeom.heads.analysis.leakage import leakage_table, leakage_to_readers, read_bases
from headgeom.heads.analysis.patching import delta_patch_layer, patch_all_heads_fast
from headgeom.heads.analysis.stats import effects_from_drops
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT

T, FIRST_DIFF, N_VOCAB = 16, 4, 1024


def model_of(n_layer: int, n_head: int, d_model: int = 768) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_vocab=N_VOCAB, n_ctx=64, n_layer=n_layer, n_head=n_head,
                      d_model=d_model, d_head=d_model // n_head, d_mlp=4 * d_model,
                      geometry="learned")  # fmt: skip
    return GPT(cfg).eval()


def inputs_of(n: int) -> PatchInputs:
    rng = np.random.default_rng(0)
    clean = [rng.integers(0, N_VOCAB, T) for _ in range(n)]
    ref = [
        np.concatenate([c[:FIRST_DIFF], rng.integers(0, N_VOCAB, T - FIRST_DIFF)]) for c in clean
    ]
    return PatchInputs(clean, ref, rng.integers(0, N_VOCAB, n), rng.integers(0, N_VOCAB, n))


def previous_stage(model: GPT, inputs: PatchInputs, batch: int) -> float:
    """The naive peer: the leakage stage as of a3c7bd3, before the one-pass §5.1 stage (docs
    §11.2–11.6): L and C8/C9 only, by full forwards per head (``patching.delta_patch_layer``)
    and per-head reader products (its per-pair PK loop left out). Seconds."""
    t0 = time.perf_counter()
    L, H = model.cfg.n_layer, model.cfg.n_head
    R = read_bases(model)
    batches = length_batches([len(x) for x in inputs.clean_ids], batch)
    for layer in range(L):
        rows = []
        for index in batches:
            clean = torch.as_tensor(np.stack([inputs.clean_ids[i] for i in index]))
            ref = torch.as_tensor(np.stack([inputs.ref_ids[i] for i in index]))
            delta, _, _ = delta_patch_layer(
                model, clean, ref, torch.as_tensor(inputs.correct[index]),
                torch.as_tensor(inputs.incorrect[index]), layer,
            )  # fmt: skip
            rows.append(delta.flatten(0, 1).numpy())
        if layer < L - 1:
            deltas = np.concatenate(rows)
            bases = [R[rl][X][rh] for rl in range(layer + 1, L) for X in "QKV" for rh in range(H)]
            for head in range(H):
                leakage_to_readers(deltas[:, head], bases)
    return time.perf_counter() - t0


def run(model: GPT, inputs: PatchInputs, batch: int) -> tuple[float, float]:
    """(patching seconds, leakage seconds) on the same inputs."""
    t0 = time.perf_counter()
    clean_ld, patched = patch_all_heads_fast(
        model,
        inputs.clean_ids,
        inputs.ref_ids,
        inputs.correct,
        inputs.incorrect,
        batch,
        max_rows=4096,
    )
    t_patch = time.perf_counter() - t0
    e = effects_from_drops(clean_ld[:, None, None] - patched)
    t0 = time.perf_counter()
    leakage_table(model, inputs, e, batch, torch.device("cpu"), "benchmark")
    return t_patch, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-examples", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--scaling-examples", type=int, default=None,
        help="n for the scaling runs (n/2 → n examples, H/2 → H heads at n/2); default "
        "--n-examples; the naive peer runs on the same n",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n = args.n_examples
    print(f"paper shape 12×12, D = 768, T = {T}, {args.threads} threads, batch {args.batch_size}")
    model = model_of(12, 12)
    t_patch, t_leak = run(model, inputs_of(n), args.batch_size)
    print(f"{n} examples: patching (fast engine) {t_patch:.1f} s, leakage stage {t_leak:.1f} s,"
          f" leakage / patching = {t_leak / t_patch:.2f}")  # fmt: skip
    # a paper model–task: the patching stage covers the four splits (812 examples), the
    # §5.1 stage the evaluation split (240); both are linear in examples (scaling below)
    per_leak, per_patch = t_leak / n, t_patch / n
    print(
        f"  per paper model–task: leakage stage 240 × {per_leak:.2f} s = {240 * per_leak:.0f} s, "
        f"patching stage 812 × {per_patch:.2f} s = {812 * per_patch:.0f} s "
        f"(leakage / patching = {240 * per_leak / (812 * per_patch):.2f})"
    )
    m = args.scaling_examples or n
    t_old = previous_stage(model, inputs_of(m), args.batch_size)
    tp1, tl1 = (t_patch, t_leak) if m == n else run(model, inputs_of(m), args.batch_size)
    print(
        f"  naive peer at {m} examples, the previous leakage stage (L, C8, C9 only; full "
        f"forwards per head): {t_old:.1f} s; this stage (also responses and TV) {tl1:.1f} s, "
        f"×{t_old / tl1:.2f}"
    )
    if m < 64:
        print("  (below one 64-example batch the leakage stage is dominated by its fixed cost:")
        print("   bases, PK and row assembly, ~8 s; --n-examples 64 measures a full batch)")
    half = max(1, m // 2)
    tp2, tl2 = run(model, inputs_of(half), args.batch_size)
    print(f"examples {half} → {m}: leakage {tl2:.1f} → {tl1:.1f} s (×{tl1 / tl2:.2f}), "
          f"patching {tp2:.1f} → {tp1:.1f} s (×{tp1 / tp2:.2f})")  # fmt: skip
    tp6, tl6 = run(model_of(12, 6), inputs_of(half), args.batch_size)
    print(f"heads 6 → 12 (D = 768, {half} examples): leakage {tl6:.1f} → {tl2:.1f} s "
          f"(×{tl2 / tl6:.2f}), patching {tp6:.1f} → {tp2:.1f} s (×{tp2 / tp6:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
