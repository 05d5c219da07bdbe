"""Tiny random ``transformers`` models of every registered family, and their modules found
from each family's source (written here, not read from ``headgeom.model.families``), for the
tests that check our per-head weights and leakage against the modules themselves."""

from __future__ import annotations

import torch

V = 97
_SIZES = dict(num_hidden_layers=3, intermediate_size=64, vocab_size=V, initializer_range=0.2)
_GQA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, **_SIZES)


def family_config(family: str):
    """A 3-layer config of ``family``: 4 query heads of width 8 sharing 2 key/value heads
    where the family has grouped-query attention (Qwen3 with its q/k norms, Gemma with its
    post-norms), D = 32."""
    import transformers  # a [dev] extra: the tests that need it skip without it

    return {
        "llama": lambda: transformers.LlamaConfig(**_GQA),
        "qwen2": lambda: transformers.Qwen2Config(**_GQA),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **_GQA),
        "mistral": lambda: transformers.MistralConfig(**_GQA),
        "gemma2": lambda: transformers.Gemma2Config(head_dim=8, **_GQA),
        "gemma3": lambda: transformers.Gemma3TextConfig(head_dim=8, **_GQA),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(
            hidden_size=32, num_attention_heads=4, **_SIZES
        ),
        "gpt2": lambda: transformers.GPT2Config(
            n_embd=32,
            n_head=4,
            n_layer=3,
            vocab_size=V,
            n_positions=64,
            initializer_range=0.2,
            bos_token_id=0,
            eos_token_id=0,
        ),  # fmt: skip
    }[family]()


def tiny_family_model(family: str, seed: int = 0):
    """A random model of ``family`` in eval mode whose norm gains (and LayerNorm biases) are
    random too, so a gain convention (Gemma's 1 + w) is visible in the maps."""
    import transformers  # the [dev] extra, as above

    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(family_config(family)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    return hf


def layers(hf):
    root = {"gpt_neox": "gpt_neox.layers", "gpt2": "transformer.h"}
    return hf.get_submodule(root.get(hf.config.model_type, "model.layers"))


def o_proj(hf, layer):
    block = layers(hf)[layer]
    return {"gpt_neox": lambda: block.attention.dense, "gpt2": lambda: block.attn.c_proj}.get(
        hf.config.model_type, lambda: block.self_attn.o_proj
    )()


def attn_norm(hf, layer):
    """The norm a layer applies before its q/k/v projections."""
    block = layers(hf)[layer]
    return block.ln_1 if hf.config.model_type == "gpt2" else block.input_layernorm


def projection_modules(hf, layer, X):
    """The module whose output holds X ("Q", "K" or "V") of every head: the fused projection
    of GPT-2 / GPT-NeoX, else the separate one."""
    block = layers(hf)[layer]
    if hf.config.model_type == "gpt2":
        return block.attn.c_attn
    if hf.config.model_type == "gpt_neox":
        return block.attention.query_key_value
    return getattr(block.self_attn, f"{X.lower()}_proj")


def fused_slices(family, X, n, d, D):
    """Row slices of head j's X (j < n) in :func:`projection_modules`' output: GPT-2's
    [q | k | v] blocks of width D, GPT-NeoX's per-head [q k v], else head-major."""
    part = "QKV".index(X)
    if family == "gpt2":
        return [slice(part * D + j * d, part * D + (j + 1) * d) for j in range(n)]
    if family == "gpt_neox":
        return [slice(j * 3 * d + part * d, j * 3 * d + (part + 1) * d) for j in range(n)]
    return [slice(j * d, (j + 1) * d) for j in range(n)]


def save_tiny_family(path, family: str, seed: int = 0):
    """A random model of ``family`` (:func:`family_config`, its vocabulary that of the
    metaspace tokenizer of ``tests.helpers.tokenizers``) saved with safetensors beside that
    tokenizer: a directory an ``hf-causal-lm`` import reads. Returns the model."""
    import transformers  # the [dev] extra, as above

    from tests.helpers.tokenizers import metaspace_tokenizer  # needs tokenizers, as transformers

    tok = metaspace_tokenizer()
    config = family_config(family)
    config.vocab_size = tok.get_vocab_size()
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(path, safe_serialization=True)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return hf
