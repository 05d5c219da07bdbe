"""Tiny random ``transformers`` models (the import tests' source models): GPT-2, a
grouped-query Llama with its own tokenizer, and a config of every registered family."""

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


#: Vocabulary of :func:`tiny_family_config`'s models.
TINY_VOCAB = 97
# initializer_range 0.2: effects well above float32 round-off on 32-wide models
_SIZES = dict(num_hidden_layers=2, intermediate_size=64, vocab_size=TINY_VOCAB,
              initializer_range=0.2)  # fmt: skip
_GQA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, **_SIZES)
#: Keys a sliding-window layer sees: fewer than the tests' 9-token prompts, so windows matter.
WINDOW = 4
_QWEN_WINDOW = dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
_GEMMA = dict(head_dim=8, sliding_window=WINDOW, final_logit_softcapping=2.0,
              layer_types=["sliding_attention", "full_attention"], **_GQA)  # fmt: skip


def tiny_family_config(family: str):
    """A ``transformers`` config of a 2-layer, 4-query-head model of a registered family
    (``headgeom.model.families``): 2 key/value heads where the family has them, sliding
    windows of :data:`WINDOW` keys (Gemma 2/3, Mistral, Qwen's layers past
    ``max_window_layers``) and Gemma's logits softcapped at 2."""
    import transformers  # a [dev] extra: the tests that need it skip without it

    return {
        "llama": lambda: transformers.LlamaConfig(**_GQA),
        "qwen2": lambda: transformers.Qwen2Config(**_QWEN_WINDOW, **_GQA),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **_QWEN_WINDOW, **_GQA),
        "mistral": lambda: transformers.MistralConfig(sliding_window=WINDOW, **_GQA),
        "gemma2": lambda: transformers.Gemma2Config(**_GEMMA),
        "gemma3": lambda: transformers.Gemma3TextConfig(**_GEMMA),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(
            hidden_size=32, num_attention_heads=4, **_SIZES
        ),
        "gpt2": lambda: transformers.GPT2Config(
            n_embd=32,
            n_head=4,
            n_layer=2,
            vocab_size=TINY_VOCAB,
            n_positions=64,
            initializer_range=0.2,
            bos_token_id=0,
            eos_token_id=0,
        ),
    }[family]()
