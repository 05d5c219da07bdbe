"""Time the plain and the fast head-patching engines on the same model and prompts
(METHODS §10.1) and print the speed-up and the max |Δeffect| between them.

python benchmarks/patching_engine.py                 # paper shape (12×12, D = 768, V = 50,257)
python benchmarks/patching_engine.py --size demo     # the demo architecture (config.yaml)
python benchmarks/patching_engine.py --size both     # both, paper shape first

Weights are random (the engines' cost does not depend on them); prompts are SVA-like:
clean and reference differ in one token (position 1, the subject noun), equal length.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom import zoo
from headgeom.patching import patch_all_heads, patch_all_heads_fast

SIZES = {
    "paper": dict(
        arch=dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=1024),
        n_vocab=50257,
        n_examples=32,
    ),
    "demo": dict(
        arch=dict(n_layer=4, n_head=4, d_model=64, d_head=16, d_mlp=256, n_ctx=64),
        n_vocab=5000,
        n_examples=240,
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("paper", "demo", "both"), default="both")
    parser.add_argument("--geometry", default="learned")
    parser.add_argument("--length", type=int, default=6, help="prompt length (tokens)")
    parser.add_argument("--n-examples", type=int, default=None, help="default: per size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-rows", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def sva_like(n: int, length: int, n_vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    clean = [rng.integers(0, n_vocab, length) for _ in range(n)]
    ref = []
    for x in clean:
        y = x.copy()
        y[1] = (x[1] + 1 + rng.integers(0, n_vocab - 1)) % n_vocab  # the subject noun
        ref.append(y)
    correct = rng.integers(0, n_vocab, n)
    incorrect = (correct + 1 + rng.integers(0, n_vocab - 1, n)) % n_vocab
    return clean, ref, correct, incorrect


def run(size: str, args: argparse.Namespace) -> None:
    spec = SIZES[size]
    torch.manual_seed(args.seed)
    model = zoo.build_model(
        zoo.derive_model_config(args.geometry, spec["arch"], {}), spec["n_vocab"]
    ).eval()
    n = args.n_examples or spec["n_examples"]
    pairs = sva_like(n, args.length, spec["n_vocab"], args.seed)
    cfg = model.cfg
    print(
        f"[{size}] {args.geometry}: L={cfg.n_layer} H={cfg.n_head} D={cfg.d_model} "
        f"V={cfg.n_vocab}; {n} prompts of length {args.length}, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads"
    )
    patch_all_heads_fast(model, *[p[:1] for p in pairs], batch_size=1)  # warm-up
    t0 = time.perf_counter()
    plain = patch_all_heads(model, *pairs, batch_size=args.batch_size)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = patch_all_heads_fast(model, *pairs, batch_size=args.batch_size, max_rows=args.max_rows)
    t_fast = time.perf_counter() - t0
    effect_plain = plain[0][:, None, None] - plain[1]
    effect_fast = fast[0][:, None, None] - fast[1]
    delta = float(np.abs(effect_fast - effect_plain).max())
    print(f"  plain engine : {t_plain:8.3f} s")
    print(f"  fast engine  : {t_fast:8.3f} s")
    print(f"  speed-up     : {t_plain / t_fast:8.2f}x")
    print(f"  max |Δeffect|: {delta:.3e}   (max |effect| {np.abs(effect_plain).max():.3e})")
    print(f"  max |Δclean_ld|: {float(np.abs(fast[0] - plain[0]).max()):.3e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for size in ("paper", "demo") if args.size == "both" else (args.size,):
        run(size, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
