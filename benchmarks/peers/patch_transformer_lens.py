"""TransformerLens 3.x head patching on an exchange (benchmarks/peers/exchange.py), run with
the peer's own python (benchmarks/peers/envs.py):

    .peers/transformer_lens-3.9/bin/python benchmarks/peers/patch_transformer_lens.py \\
        --exchange DIR --out DIR/transformer_lens-3.9.npz

The model is loaded as TransformerLens loads any GPT-2: the ``transformers`` model, then its
own ``convert_gpt2_weights`` into a ``HookedTransformer`` of the directory's shape (no
folding, no centring: those change logits). A Llama (SmolLM2) is not among TL 3.9's official
model names, so ``from_pretrained`` refuses it by name; its own Llama path runs instead,
offline: ``convert_hf_model_config`` reads the directory's config.json (grouped-query
``n_key_value_heads``, rotary base, RMSNorm, gated MLP), then ``convert_llama_weights``. The
context is cut to 512 positions: TL keeps an n_ctx × n_ctx mask per layer, 2 GB at the
config's 8,192. The sweep is TransformerLens's documented one:
``run_with_cache`` on the ref batch, then ``patching.get_act_patch_attn_head_out_all_pos``
(every position of each head's ``hook_z``) with the group's mean logit difference.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402

#: TL's context for a Llama: its mask is n_ctx × n_ctx per layer; prompts here are short.
LLAMA_CTX = 512


def load_llama(model_dir: Path, dtype: torch.dtype = torch.float32):
    """The directory's Llama as a ``HookedTransformer`` by TL 3's own config and weight
    conversions (no folding, no centring), offline."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import convert_hf_model_config
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    hf = exchange.load_transformers(model_dir)
    # TL picks a model's branch from substrings of the name it is given ("llama", "gemma"
    # skip reading the config) before it reads a directory's config.json: "." names none
    with contextlib.chdir(model_dir):
        d = convert_hf_model_config(".")  # the directory's config.json, read offline
    d.pop("tokenizer_name", None)  # ids in, ids out: no tokenizer files in the exchange
    d.update(n_ctx=LLAMA_CTX, dtype=dtype, device="cpu", default_prepend_bos=False)
    with warnings.catch_warnings():  # 3.9 announces HookedTransformer's removal in 4.0
        warnings.simplefilter("ignore")
        tl = HookedTransformer(HookedTransformerConfig.from_dict(d))
    # not strict: TL's masks and rotary tables are buffers the conversion does not name
    missing = tl.load_state_dict(convert_llama_weights(hf, tl.cfg), strict=False).missing_keys
    params = sorted(set(missing) & dict(tl.named_parameters()).keys())
    if params:
        raise ValueError(f"{model_dir}: TL's Llama conversion left parameters unset: {params}")
    return tl.to(dtype).eval()


def load_hooked(model_dir: Path, dtype: torch.dtype = torch.float32, **flags):
    """The directory's GPT-2 as a ``HookedTransformer`` of its shape in ``dtype`` (TL 2 and 3;
    ``flags``: extra config switches, e.g. the hooks auto-circuit needs)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head,
        n_heads=c.n_head, d_mlp=c.n_inner or 4 * c.n_embd, d_vocab=c.vocab_size,
        act_fn=c.activation_function, normalization_type="LN", eps=c.layer_norm_epsilon,
        positional_embedding_type="standard", default_prepend_bos=False,
        original_architecture="GPT2LMHeadModel", device="cpu", dtype=dtype, **flags,
    )  # fmt: skip
    with warnings.catch_warnings():  # 3.9 announces HookedTransformer's removal in 4.0
        warnings.simplefilter("ignore")
        tl = HookedTransformer(cfg)
    tl.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return tl.to(dtype).eval()


def load(model_dir: Path):
    from transformers import AutoConfig

    llama = AutoConfig.from_pretrained(model_dir).model_type == "llama"
    return (load_llama if llama else load_hooked)(model_dir), version("transformer_lens")


def sweep(tl, pairs) -> np.ndarray:
    """Mean e_{l,h} over examples (L, H), per equal-length group, groups weighted by size
    (works on a HookedTransformer and on TL 4's TransformerBridge alike)."""
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    total = np.zeros((tl.cfg.n_layers, tl.cfg.n_heads))
    for n, c, r, good, bad in exchange.group_batches(pairs):

        def metric(logits, good=good, bad=bad):
            return exchange.mean_ld(logits[:, -1], good, bad)

        _, ref_cache = tl.run_with_cache(r)
        clean_ld = float(metric(tl(c)))
        patched = get_act_patch_attn_head_out_all_pos(tl, c, ref_cache, metric)
        total += n * (clean_ld - patched.double().numpy())
    return total / len(pairs[0])


if __name__ == "__main__":
    sys.exit(exchange.peer_main(load, sweep, "transformer_lens"))
