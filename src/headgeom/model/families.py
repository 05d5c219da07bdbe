"""Where the named sites live in each ``transformers`` causal-LM family: one record per family.

A record names modules by their dotted path (a layer's modules relative to the layer) and the
config keys of its sizes; :class:`headgeom.model.hf.HFCausalLM` puts the workspace's sites
there with forward (pre-)hooks, so no engine ever branches on a model type. Adding a family
is one record in :data:`FAMILIES`.

* ``layers`` — the ModuleList of decoder layers (from the ``*ForCausalLM`` root); the input
  of layer l is the residual ``blocks.{l}.hook_resid_pre``;
* ``o_proj`` — the output projection: its input is z, every query head's output before it,
  head-major (``h · d_head + i``), as all these families concatenate heads;
* ``q_proj``/``k_proj``/``v_proj`` — separate projections (outputs (B, T, H·d) and
  (B, T, H_kv·d)), or ``qkv`` with ``qkv_layout``: "blocks" ([q | k | v], GPT-2's
  ``c_attn``) or "per_head" (per head [q_h k_h v_h], GPT-NeoX's ``query_key_value``);
* ``attn_out``/``mlp_out`` — the modules whose outputs the block adds to the residual
  (Gemma's post-norms, else the projections themselves); ``mlp`` — the MLP module;
* ``resid_mid`` — a module whose input is the residual after attention (None where the
  family has none: GPT-NeoX's parallel residual adds attention and MLP to the same input);
* ``attn`` — the attention module (it holds the projections; its forward returns the output
  projection's output first): the fast engine replaces its forward to resume a layer after
  its attention (:mod:`headgeom.model.hf_blocks`);
* ``layer_cache`` — the decoder layer's keyword for the key/value cache (``cache``; GPT-NeoX's
  ``layer_past``), through which the fast engine hands a layer the clean prefix's keys/values;
* ``lm_head``; ``logit_softcap_key`` — the config key of a final logit
  softcapping ``c · tanh(logits / c)`` after ``lm_head`` (Gemma 2/3), None where there is none;
* ``final_norm``;
* ``attn_norm`` — the norm a layer applies to the residual before its q/k/v projections
  (relative to the layer); ``norm_centered`` — it subtracts the mean (LayerNorm: GPT-2,
  GPT-NeoX) or not (RMSNorm); ``norm_gain_offset`` — the gain it multiplies by is
  ``offset + weight`` (Gemma's RMSNorm: 1 + w; 0 elsewhere); ``conv1d`` — the projections
  store their weights (in, out) (GPT-2's ``Conv1D``) instead of ``nn.Linear``'s (out, in).
  :mod:`headgeom.model.hf_weights` reads each head's W_O, W_Q, W_K, W_V and this norm's gain
  from them (the read and write spaces of docs §9 and §11.8);
* ``plain_attention`` — the config values under which a head's attention is
  softmax_s(q·k_s/√d_head) of its projection outputs (no rotary positions, no q/k norms, no
  other scaling), so the attention TV of docs §11.6 can be recomputed from the sites; None:
  never (rotary families);
* ``kv_heads_key`` — the config key of the key/value head count (None: one per query head);
  ``head_dim_key`` — the config key of d_head (None, or a null value: hidden_size / heads).
  Query head h reads key/value head h // (n_head / n_kv_head), as ``transformers``'
  ``repeat_kv`` repeats each key/value head over consecutive query heads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

QKVLayout = Literal["separate", "blocks", "per_head"]


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    layers: str
    attn: str
    o_proj: str
    mlp: str
    attn_out: str
    mlp_out: str
    resid_mid: str | None
    final_norm: str
    lm_head: str
    q_proj: str | None = None
    k_proj: str | None = None
    v_proj: str | None = None
    qkv: str | None = None
    qkv_layout: QKVLayout = "separate"
    kv_heads_key: str | None = "num_key_value_heads"
    head_dim_key: str | None = "head_dim"
    layer_cache: str = "cache"
    logit_softcap_key: str | None = None
    attn_norm: str = "input_layernorm"
    norm_centered: bool = False
    norm_gain_offset: float = 0.0
    conv1d: bool = False
    plain_attention: Mapping[str, object] | None = None

    @property
    def writes_residual_directly(self) -> bool:
        """The output projection's output is what the block adds to the residual (no norm
        after it), so patching a head's z adds exactly W_O^h (z_ref − z) to the residual
        (docs §11.2); Gemma's post-attention norm breaks this."""
        return self.attn_out == self.o_proj


def _llama_like(name: str, model_types: tuple[str, ...]) -> Family:
    """Llama's layout, shared by Qwen2/3 (q/k/v biases, Qwen3's q/k norms act after the
    projections) and Mistral (sliding window inside attention)."""
    return Family(
        name=name,
        model_types=model_types,
        layers="model.layers",
        attn="self_attn",
        q_proj="self_attn.q_proj",
        k_proj="self_attn.k_proj",
        v_proj="self_attn.v_proj",
        o_proj="self_attn.o_proj",
        mlp="mlp",
        attn_out="self_attn.o_proj",
        mlp_out="mlp",
        resid_mid="post_attention_layernorm",
        final_norm="model.norm",
        lm_head="lm_head",
    )


def _gemma(name: str, model_types: tuple[str, ...]) -> Family:
    """Gemma 2/3: Llama's layout with norms after attention and MLP, so what a block adds to
    the residual is the post-norms' output; their RMSNorms scale by 1 + w; the logits are
    softcapped."""
    return dataclasses.replace(
        _llama_like(name, model_types),
        attn_out="post_attention_layernorm",
        mlp_out="post_feedforward_layernorm",
        resid_mid="pre_feedforward_layernorm",
        logit_softcap_key="final_logit_softcapping",
        norm_gain_offset=1.0,
    )


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        f.name: f
        for f in (
            _llama_like("llama", ("llama",)),  # SmolLM2 is a Llama
            _llama_like("qwen2", ("qwen2",)),
            _llama_like("qwen3", ("qwen3",)),
            _llama_like("mistral", ("mistral",)),
            _gemma("gemma2", ("gemma2",)),
            _gemma("gemma3", ("gemma3_text",)),  # the text model (Gemma3ForCausalLM)
            Family(
                name="gpt_neox",  # Pythia
                model_types=("gpt_neox",),
                layers="gpt_neox.layers",
                attn="attention",
                layer_cache="layer_past",
                qkv="attention.query_key_value",
                qkv_layout="per_head",
                o_proj="attention.dense",
                mlp="mlp",
                attn_out="attention.dense",
                mlp_out="mlp",
                resid_mid=None,
                final_norm="gpt_neox.final_layer_norm",
                lm_head="lm_head",  # embed_out before transformers 5
                kv_heads_key=None,
                head_dim_key=None,
                norm_centered=True,
            ),
            Family(
                name="gpt2",
                model_types=("gpt2",),
                layers="transformer.h",
                attn="attn",
                qkv="attn.c_attn",
                qkv_layout="blocks",
                o_proj="attn.c_proj",
                mlp="mlp",
                attn_out="attn.c_proj",
                mlp_out="mlp",
                resid_mid="ln_2",
                final_norm="transformer.ln_f",
                lm_head="lm_head",
                kv_heads_key=None,
                head_dim_key=None,
                attn_norm="ln_1",
                norm_centered=True,
                conv1d=True,
                plain_attention=MappingProxyType(
                    {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}
                ),
            ),
        )
    }
)
_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}

#: What a family record declares, for the refusal of a model type without one.
DECLARES = (
    "decoder layers, attention module, attention output projection (its input is each query "
    "head's z), q/k/v projections or the fused qkv and its layout, key/value head count and "
    "d_head config keys, attention and MLP outputs, residual after attention, the layers' "
    "cache keyword, final norm, lm_head, logit softcapping config key, the norm before "
    "attention (centred or not, its gain convention), the weight layout"
)


class UnsupportedFamilyError(ValueError):
    """A model whose ``model_type`` has no family record, or whose modules differ from it."""


def family_of(model_type: str) -> Family:
    """The family record of a ``transformers`` ``model_type``."""
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise UnsupportedFamilyError(
            f"model_type {model_type!r} has no family record in headgeom.model.families "
            f"(registered: {', '.join(sorted(_BY_MODEL_TYPE))}); missing: a record declaring "
            f"its {DECLARES}"
        ) from None
