"""A tiny random GPT-2 of ``transformers`` (the import tests' source model)."""

from __future__ import annotations

import torch

from tests.weights import large_random_weights

#: GPT-2's vocabulary: an imported model keeps it.
V = 50257


def tiny_gpt2(seed: int = 0):
    """A random GPT2LMHeadModel (2 layers, 2 heads, D = 16) with large weights."""
    import transformers  # a [dev] extra: the tests that need it skip without it

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=16, vocab_size=V, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(cfg)
    large_random_weights(hf)
    return hf.eval()


def save_tiny(path, seed: int = 0, **kwargs):
    hf = tiny_gpt2(seed)
    hf.save_pretrained(path, safe_serialization=True, **kwargs)
    return hf
