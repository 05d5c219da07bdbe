"""nnsight 0.8 head patching on an exchange (benchmarks/peers/exchange.py), run with the
peer's own python (benchmarks/peers/envs.py):

    .peers/nnsight-0.8/bin/python benchmarks/peers/patch_nnsight.py \\
        --exchange DIR --out DIR/nnsight-0.8.npz

The ``transformers`` GPT-2 is wrapped as nnsight documents for any torch module,
``NNsight(model)``. Per equal-length group: one ``model.trace`` of the ref batch saves every
layer's ``attn.c_proj.input`` (the heads' outputs concatenated, before the projection: what
TransformerLens calls ``hook_z``); one trace of the clean batch gives the clean logits; then
one trace of the clean batch per head (l, h) assigns that head's columns of layer l's
``c_proj.input``, at every position, from the ref run and saves the last-position logits.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import nnsight
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def load(model_dir: Path):
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    return nnsight.NNsight(hf), version("nnsight")


def sweep(model, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size."""
    cfg = model.config
    n_layer, n_head, d_head = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    layers = model.transformer.h
    total = np.zeros((n_layer, n_head))
    for n, c, r, good, bad in exchange.group_batches(pairs):
        # use_cache=False: a single forward pass needs no key/value cache.
        with model.trace(r, use_cache=False):
            # A trace hands back only the names bound to saved objects: save the list.
            z_ref = nnsight.save([layer.attn.c_proj.input for layer in layers])
        with model.trace(c, use_cache=False):
            last = model.output.logits[:, -1].save()
        clean_ld = float(exchange.mean_ld(last, good, bad))
        patched = np.zeros((n_layer, n_head))
        for layer, z in enumerate(z_ref):
            for h in range(n_head):
                cols = slice(h * d_head, (h + 1) * d_head)
                with model.trace(c, use_cache=False):
                    layers[layer].attn.c_proj.input[:, :, cols] = z[:, :, cols]
                    last = model.output.logits[:, -1].save()
                patched[layer, h] = float(exchange.mean_ld(last, good, bad))
        total += n * (clean_ld - patched)
    return total / len(pairs[0])


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "nnsight"))
