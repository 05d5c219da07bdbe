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

import sys
from importlib.metadata import version
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402
from patch_transformer_lens import sweep  # noqa: E402  (the same helper works on a bridge)


def load(model_dir: Path):
    from transformer_lens.model_bridge import TransformerBridge

    # The directory has no tokenizer files: transformers then builds an empty GPT2Tokenizer,
    # which is never used (we pass token ids; the bridge prepends no BOS to tensors).
    bridge = TransformerBridge.boot_transformers(str(model_dir), device="cpu",
                                                 dtype=torch.float32)  # fmt: skip
    return bridge.eval(), version("transformer_lens")


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "transformer_lens"))
