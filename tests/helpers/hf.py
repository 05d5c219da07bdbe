"""Tiny random ``transformers`` models (the import tests' source models): GPT-2, and a
grouped-query Llama with its own tokenizer."""

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


def save_tiny_llama(path, seed: int = 0):
    """A random grouped-query LlamaForCausalLM (2 layers, 4 query heads sharing 2 key/value
    heads, D = 32, tied embeddings) saved with safetensors, beside its own tokenizer
    (``tests.helpers.tokenizers.metaspace_tokenizer``, tokenizer.json): the vocabulary is
    that tokenizer's. Returns the model."""
    import transformers

    from tests.helpers.tokenizers import metaspace_tokenizer

    tok = metaspace_tokenizer()
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64, tie_word_embeddings=True, initializer_range=0.3,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(path, safe_serialization=True)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return hf
