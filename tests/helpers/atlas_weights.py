"""Tiny checkpoint pairs of one lineage for the atlas's weight-side tests: a tied Llama, a
Gemma 4 and a Gemma 3n (per-layer embeddings) from their ``transformers`` config classes, and
B = A with every stored tensor moved by seeded noise (as a fine-tune moves every tensor)."""

from __future__ import annotations

import copy

import torch

#: Vocabulary of the tiny transformers models.
VOCAB = 97
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              initializer_range=0.2)  # fmt: skip
_PLE = dict(vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"])  # fmt: skip


def tiny_llama(seed: int = 0):
    """A random LlamaForCausalLM, 2 layers, D = 32, tied embeddings."""
    import transformers  # a [dev] extra: the tests that need it skip without it

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(tie_word_embeddings=True, **_SIZES)
    ).eval()


def tiny_gemma4(seed: int = 0):
    """A random Gemma4ForCausalLM, 2 layers, PLE slices of 8 (a 97 × 16 table)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Gemma4TextConfig(per_layer_config={}, **_PLE, **_SIZES)
    return transformers.Gemma4ForCausalLM(cfg).eval()


def tiny_gemma3n(seed: int = 0):
    """A random Gemma3nForCausalLM, 2 layers, PLE slices of 8, AltUp with 2 streams, LAuReL
    rank 4, no key/value sharing."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Gemma3nTextConfig(
        num_kv_shared_layers=0, altup_num_inputs=2, laurel_rank=4, **_PLE, **_SIZES
    )
    return transformers.Gemma3nForCausalLM(cfg).eval()


@torch.no_grad()
def moved(
    model: torch.nn.Module, seed: int, scale: float = 0.3, buffers: bool = True
) -> torch.nn.Module:
    """A copy of ``model`` whose every floating parameter (and persistent buffer, with
    ``buffers``: Gemma 4's layer scalars; not our frozen bases) is moved by ``scale`` × its RMS
    (at least 1/10) × N(0, 1), a tied table once."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    params = {id(p) for p in out.parameters()}
    seen = set()
    for t in out.state_dict(keep_vars=True).values():
        if not t.is_floating_point() or t.untyped_storage().data_ptr() in seen:
            continue
        if not buffers and id(t) not in params:
            continue
        seen.add(t.untyped_storage().data_ptr())
        rms = max(float(t.detach().pow(2).mean().sqrt()), 0.1)
        t.data.add_(scale * rms * torch.randn(t.shape, generator=gen, dtype=t.dtype))
    return out.eval()
