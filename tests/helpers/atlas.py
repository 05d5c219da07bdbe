"""Tiny random models for the edit atlas's tests, built offline from ``transformers`` 5.24's
config classes: Gemma 4 and Gemma 3n with per-layer embeddings (2 of their 4 layers reuse
the keys and values of the first two: the shared layers' attention types, sliding and full,
occur among the non-shared ones, as Gemma 3n's KV sharing requires) and a Llama (SmolLM2's
family). Their norm gains, Gemma 4's layer scalars and Gemma 3n's AltUp output scale are
drawn away from their initial ones and zeros, so no edit is trivially exact."""

from __future__ import annotations

import torch

V = 97
LAYERS = 4
WINDOW = 4
_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
_SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              initializer_range=0.2)  # fmt: skip
#: Gemma's per-layer-embedding slice width P and its table's vocabulary.
PLE = dict(vocab_size_per_layer_input=V, hidden_size_per_layer_input=8)


def _jitter(hf, seed: int):
    """Every vector parameter and Gemma 4's layer scalars (a saved buffer) moved off their
    initial values; the other buffers (rotary frequencies, scales) are the model's own."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1 and p.numel() > 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in hf.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return hf.eval()


def tiny_gemma4(seed: int = 0, attn: str = "sdpa", tie: bool = True):
    """A random Gemma4ForCausalLM: 4 layers (sliding, full, sliding, full), layers 2 and 3
    reusing the keys/values of layers 0 and 1, PLE slices of P = 8, logits softcapped."""
    import transformers  # a [dev] extra: the tests that need it skip without it

    torch.manual_seed(seed)
    cfg = transformers.Gemma4TextConfig(
        **_SIZES, **PLE, global_head_dim=16, sliding_window=WINDOW, layer_types=list(_TYPES),
        num_kv_shared_layers=2, final_logit_softcapping=30.0, tie_word_embeddings=tie,
        attn_implementation=attn,
    )  # fmt: skip
    return _jitter(transformers.Gemma4ForCausalLM(cfg), seed)


def tiny_gemma3n(seed: int = 0, attn: str = "sdpa"):
    """A random Gemma3nForCausalLM of the same shape (4 AltUp streams, LAuReL rank 4, no
    activation sparsity)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Gemma3nTextConfig(
        **_SIZES, **PLE, sliding_window=WINDOW, layer_types=list(_TYPES),
        num_kv_shared_layers=2, laurel_rank=4, activation_sparsity_pattern=[0.0] * LAYERS,
        attn_implementation=attn,
    )  # fmt: skip
    return _jitter(transformers.Gemma3nForCausalLM(cfg), seed)


def tiny_llama(seed: int = 0, attn: str = "sdpa", tie: bool = False):
    """A random grouped-query LlamaForCausalLM (4 layers), as SmolLM2 is."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**_SIZES, tie_word_embeddings=tie, attn_implementation=attn)
    return _jitter(transformers.LlamaForCausalLM(cfg), seed)


def tiny_qwen3(seed: int = 0, attn: str = "sdpa"):
    """A random Qwen3ForCausalLM (a core family with a key norm in every layer)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(**_SIZES, attn_implementation=attn)
    return _jitter(transformers.Qwen3ForCausalLM(cfg), seed)


BUILDERS = {"gemma4": tiny_gemma4, "gemma3n": tiny_gemma3n, "llama": tiny_llama}


def ids(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    """Random token ids (batch, length): longer than the sliding window."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


@torch.no_grad()
def capture(model, ids_: torch.Tensor) -> dict:
    """One unedited forward of an ``headgeom.atlas.blocks.AtlasModel`` with plain hooks
    written here: ("in", l) and ("out", l) the input and output of decoder layer l, and
    each block -> its write module's output."""
    seen: dict = {}

    def keep(key):
        def hook(module, args, *rest):
            if len(rest) == 2:  # a forward hook with kwargs: (kwargs, output)
                seen[key] = rest[1]
            elif rest:
                seen[key] = rest[0]
            else:
                seen[key] = args[0]

        return hook

    handles = []
    for layer, module in enumerate(model.layers):
        handles.append(module.register_forward_pre_hook(keep(("in", layer))))
        handles.append(module.register_forward_hook(keep(("out", layer))))
    for block in model.blocks():
        handles.append(model.write_module(block).register_forward_hook(keep(block)))
    try:
        model.hf(input_ids=ids_, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen
