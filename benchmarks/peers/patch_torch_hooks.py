"""The naive reference for head patching: plain ``torch`` forward hooks on a ``transformers``
model, one full forward per query head, on an exchange (benchmarks/peers/exchange.py):

    python benchmarks/peers/patch_torch_hooks.py --exchange DIR --out DIR/torch-hooks.npz

What a user writes with nothing but ``torch`` and ``transformers``: per equal-length group,
one forward of the ref batch with a forward pre-hook on every layer's output projection
(GPT-2's ``attn.c_proj``, Llama's ``self_attn.o_proj``) keeping its input (the query heads'
outputs concatenated, head-major), one clean forward, then per query head (l, h) one clean
forward with a pre-hook on layer l's projection that replaces that head's d_head columns, at
every position, by the ref run's, every position's logits computed (the model's default).
It needs no package beyond ours, so the harness runs it with our own python.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def load(model_dir: Path):
    return exchange.load_transformers(model_dir), f"(torch {version('torch')})"


def keep_input(store: list):
    def hook(module, args):
        store.append(args[0])

    return hook


def replace_columns(cols: slice, z):
    def hook(module, args):
        x = args[0].clone()
        x[:, :, cols] = z[:, :, cols]
        return (x, *args[1:])

    return hook


def sweep(model, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size."""
    n_layer, n_head, d_head = exchange.head_shape(model.config)
    projections = exchange.out_projections(model, model.config)
    total = np.zeros((n_layer, n_head))
    for n, c, r, good, bad in exchange.group_batches(pairs):
        z_ref = [[] for _ in projections]
        handles = [p.register_forward_pre_hook(keep_input(z))
                   for p, z in zip(projections, z_ref, strict=True)]  # fmt: skip
        model(r, use_cache=False)
        for handle in handles:
            handle.remove()
        clean_ld = float(exchange.mean_ld(model(c, use_cache=False).logits[:, -1], good, bad))
        patched = np.zeros((n_layer, n_head))
        for layer, (z,) in enumerate(z_ref):
            for h in range(n_head):
                cols = slice(h * d_head, (h + 1) * d_head)
                handle = projections[layer].register_forward_pre_hook(replace_columns(cols, z))
                logits = model(c, use_cache=False).logits
                handle.remove()
                patched[layer, h] = float(exchange.mean_ld(logits[:, -1], good, bad))
        total += n * (clean_ld - patched)
    return total / len(pairs[0])


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "torch hooks"))
