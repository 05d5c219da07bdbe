"""TransformerLens 4.x head patching on an exchange (benchmarks/peers/exchange.py), run with
the peer's own python (benchmarks/peers/envs.py):

    .peers/transformer_lens-4.3/bin/python benchmarks/peers/patch_transformer_lens4.py \\
        --exchange DIR --out DIR/transformer_lens-4.3.npz

TransformerLens 4 removed ``HookedTransformer``; its way in is ``TransformerBridge``, which
wraps the ``transformers`` model itself. ``boot_transformers`` takes a local directory as
well as a hub name (any GPT-2 shape: the adapter reads config.json) and forces eager
attention so every hook fires. We keep its default raw-HF weights: no
``enable_compatibility_mode()``, whose LayerNorm folding and centring change the logits
(hook_z is head-split, [batch, pos, head, d_head], without it). The sweep is TransformerLens's
documented one: ``run_with_cache`` on the ref batch, then
``patching.get_act_patch_attn_head_out_all_pos`` (every position of each head's ``hook_z``)
with the group's mean logit difference.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def load(model_dir: Path):
    from transformer_lens.model_bridge import TransformerBridge

    # The directory has no tokenizer files: transformers then builds an empty GPT2Tokenizer,
    # which is never used (we pass token ids; the bridge prepends no BOS to tensors).
    bridge = TransformerBridge.boot_transformers(str(model_dir), device="cpu",
                                                 dtype=torch.float32)  # fmt: skip
    return bridge.eval(), version("transformer_lens")


def sweep(tl, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size."""
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    clean, ref, correct, incorrect = pairs
    total = np.zeros((tl.cfg.n_layers, tl.cfg.n_heads))
    for idx in exchange.groups(clean):
        c = torch.as_tensor(np.stack([clean[i] for i in idx]))
        r = torch.as_tensor(np.stack([ref[i] for i in idx]))
        good, bad = torch.as_tensor(correct[idx]), torch.as_tensor(incorrect[idx])
        rows = torch.arange(len(idx))

        def mean_ld(logits, rows=rows, good=good, bad=bad):
            last = logits[:, -1]
            return (last[rows, good] - last[rows, bad]).mean()

        _, ref_cache = tl.run_with_cache(r)
        clean_ld = float(mean_ld(tl(c)))
        patched = get_act_patch_attn_head_out_all_pos(tl, c, ref_cache, mean_ld)
        total += len(idx) * (clean_ld - patched.double().numpy())
    return total / len(clean)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchange", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tl, peer_version = load(args.exchange / "model")
    pairs = exchange.read_examples(args.exchange / "examples.parquet")
    with torch.no_grad():
        wall, cpu = time.perf_counter(), time.process_time()
        effects = sweep(tl, pairs)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    exchange.write_effects(args.out, effects, wall, cpu, f"transformer_lens {peer_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
