"""Per-head activation patching with pyvene, for benchmarks/peer_patching.py.

Runs in the peer's own environment (.peers/pyvene-0.1, benchmarks/peers/envs.py) on an
exchange directory (benchmarks/peers/exchange.py) and writes ``--out`` with the mean effect
e_{l,h} of patching head (l, h)'s output, every position, from the ref run into the clean run.

pyvene's GPT-2 component ``head_attention_value_output`` is the input of ``attn.c_proj``
split per head (pyvene/models/gpt2/modelings_intervenable_gpt2.py): each head's output before
the output projection, i.e. TransformerLens's ``hook_z``, not the value vectors
(``head_value_output``, the output of ``c_attn``).

    .peers/pyvene-0.1/bin/python benchmarks/peers/patch_pyvene.py --exchange DIR --out F.npz
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyvene as pv
import torch
from transformers import GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def load(model_dir: Path):
    return GPT2LMHeadModel.from_pretrained(model_dir, dtype=torch.float32).eval(), version("pyvene")


def sweep(model, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size."""
    n_layer, n_head = model.config.n_layer, model.config.n_head
    # One wrapper per layer, each a single VanillaIntervention (source replaces base) on the
    # per-head attention output; the unit "h.pos" lets one call pick one head, all positions.
    wrapped = [
        pv.IntervenableModel(pv.IntervenableConfig(
            {"layer": layer, "component": "head_attention_value_output", "unit": "h.pos"},
            intervention_types=pv.VanillaIntervention), model=model)
        for layer in range(n_layer)
    ]  # fmt: skip
    effects = np.zeros((n_layer, n_head))
    for n, c, r, good, bad in exchange.group_batches(pairs):
        base, source = {"input_ids": c}, {"input_ids": r}
        # the LD in float64, as our engine reports it
        clean_ld = exchange.mean_ld(model(**base).logits[:, -1].double(), good, bad).item()
        batch, seq = c.shape
        for layer in range(n_layer):
            for head in range(n_head):
                # One intervention: ([heads], [positions]) per example, the same for the source
                # (where the activation is read) and the base (where it is written).
                side = [[[[head]] * batch, [list(range(seq))] * batch]]
                _, out = wrapped[layer](
                    base, [source], unit_locations={"sources->base": (side, side)}
                )
                patched = exchange.mean_ld(out.logits[:, -1].double(), good, bad).item()
                effects[layer, head] += n * (clean_ld - patched)
    return effects / len(pairs[0])


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "pyvene"))
