"""nnsight 0.8 head patching on an exchange (benchmarks/peers/exchange.py), run with the
peer's own python (benchmarks/peers/envs.py):

    .peers/nnsight-0.8/bin/python benchmarks/peers/patch_nnsight.py \\
        --exchange DIR --out DIR/nnsight-0.8.npz

The ``transformers`` model (a GPT-2 or a Llama such as SmolLM2) is wrapped as nnsight
documents for any torch module, ``NNsight(model)``. Per equal-length group: one
``model.trace`` of the ref batch saves every layer's output-projection input (GPT-2's
``attn.c_proj``, Llama's ``self_attn.o_proj``: the query heads' outputs concatenated, before
the projection, what TransformerLens calls ``hook_z``); one trace of the clean batch gives
the clean logits; then one trace of the clean batch per query head (l, h) assigns that
head's d_head columns of layer l's projection input, at every position, from the ref run
and saves the last-position logits. On a grouped-query model this patches one query head's
output; the key/value head it shares is untouched.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import nnsight
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def load(model_dir: Path):
    return nnsight.NNsight(exchange.load_transformers(model_dir)), version("nnsight")


def sweep(model, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size."""
    n_layer, n_head, d_head = exchange.head_shape(model.config)
    projections = exchange.out_projections(model, model.config)
    total = np.zeros((n_layer, n_head))
    for n, c, r, good, bad in exchange.group_batches(pairs):
        # use_cache=False: a single forward pass needs no key/value cache.
        with model.trace(r, use_cache=False):
            # A trace hands back only the names bound to saved objects: save the list.
            z_ref = nnsight.save([proj.input for proj in projections])
        with model.trace(c, use_cache=False):
            last = model.output.logits[:, -1].save()
        clean_ld = float(exchange.mean_ld(last, good, bad))
        patched = np.zeros((n_layer, n_head))
        for layer, z in enumerate(z_ref):
            for h in range(n_head):
                cols = slice(h * d_head, (h + 1) * d_head)
                with model.trace(c, use_cache=False):
                    projections[layer].input[:, :, cols] = z[:, :, cols]
                    last = model.output.logits[:, -1].save()
                patched[layer, h] = float(exchange.mean_ld(last, good, bad))
        total += n * (clean_ld - patched)
    return total / len(pairs[0])


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "nnsight"))
