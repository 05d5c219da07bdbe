"""The blocks of a decoder-only ``transformers`` causal LM, as the edit atlas addresses them.

A **block** is one branch of a decoder layer that writes into the residual stream: its
attention (``attn``), its MLP (``mlp``) and, in Gemma 4 and Gemma 3n, its per-layer-embedding
branch (``ple``): 2 or 3 × layers blocks. A block's **write** is the output of the module the
layer adds to the stream (:attr:`Anatomy.attn_write` …): the output projection where nothing
follows it (Llama, Qwen, GPT-2, GPT-NeoX), the post-norm where one does (Gemma). Where the
write is a norm's output, that norm's gain is the block's **volume knob**.

The per-layer embedding (PLE; ``transformers`` 5.24's ``Gemma4ForCausalLM`` and
``Gemma3nForCausalLM``): a table ``model.embed_tokens_per_layer`` (vocabulary × layers·P)
looks up a P-wide slice per layer; the model adds a projection of the token embedding
(``per_layer_model_projection``, normed by ``per_layer_projection_norm``) and scales the sum by
1/√2; layer ℓ gates its slice into the stream, ``post_norm(projection(act(gate(x)) · slice))``
(``per_layer_input_gate``, ``per_layer_projection``, ``post_per_layer_input_norm``).
Gemma 4's and Gemma 3n's RMSNorm multiplies by its weight directly (``Gemma4RMSNorm``,
``Gemma3nRMSNorm``: ``normed * weight``, weight initialised to ones), so a post-norm weight of
0 removes the write exactly; Gemma 2/3's multiplies by 1 + weight (:attr:`Anatomy.gain_offset`).

Gemma 3n carries several residual streams (AltUp); its attention and MLP read and write the
active one (``altup_active_idx``), which the profile takes as "the stream"
(:meth:`AtlasModel.stream`); its LAuReL branch is not a block of the atlas.

The families of :mod:`headgeom.model.families` give their records here (their write modules
are the sites ``hook_attn_out``/``hook_mlp_out``); Gemma 4 and Gemma 3n have records of their
own (:data:`PLE_ANATOMIES`): the head sites of ``HFCausalLM`` do not cover their layers'
per-layer input, so they are atlas models only. Any other ``model_type`` is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from headgeom.model.families import FAMILIES, Family, UnsupportedFamilyError

#: Block kinds, in the order of a layer's forward.
KINDS = ("attn", "mlp", "ple")


@dataclass(frozen=True)
class PerLayerEmbedding:
    """Where a model keeps its per-layer-embedding branch: ``table`` from the root, the rest
    relative to a decoder layer; ``width_key`` the config key of the slice width P."""

    table: str = "model.embed_tokens_per_layer"
    gate: str = "per_layer_input_gate"
    projection: str = "per_layer_projection"
    post_norm: str = "post_per_layer_input_norm"
    width_key: str = "hidden_size_per_layer_input"


@dataclass(frozen=True, kw_only=True)
class Anatomy:
    """One family's blocks: module paths (``layers`` from the root, the rest relative to a
    layer), whether the writes are post-norm outputs (then their gains are volume knobs; the
    gain is ``gain_offset + weight``), where a key norm would sit (used where a layer has
    one), the PLE branch, the config key of the active residual stream (AltUp) and the
    name of a per-layer output scalar (Gemma 4's ``layer_scalar``)."""

    name: str
    model_types: tuple[str, ...]
    layers: str
    attn_write: str
    mlp_write: str
    post_norms: bool
    gain_offset: float = 0.0
    key_norm: str | None = None
    ple: PerLayerEmbedding | None = None
    active_stream_key: str | None = None
    layer_scalar: str | None = None


def _from_family(f: Family) -> Anatomy:
    """A core family's record: its write sites, its norms' gain convention; every family
    whose attention module may hold a ``k_norm`` (Qwen3, Gemma 3) is looked up there."""
    return Anatomy(
        name=f.name,
        model_types=f.model_types,
        layers=f.layers,
        attn_write=f.attn_out,
        mlp_write=f.mlp_out,
        post_norms=not f.writes_residual_directly,
        gain_offset=f.norm_gain_offset,
        key_norm=f"{f.attn}.k_norm",
    )


def _gemma_ple(name: str, model_type: str, **kwargs) -> Anatomy:
    return Anatomy(
        name=name,
        model_types=(model_type,),
        layers="model.layers",
        attn_write="post_attention_layernorm",
        mlp_write="post_feedforward_layernorm",
        post_norms=True,
        key_norm="self_attn.k_norm",
        ple=PerLayerEmbedding(),
        **kwargs,
    )


#: The families with a per-layer-embedding branch (not head-site families).
PLE_ANATOMIES: Mapping[str, Anatomy] = MappingProxyType(
    {
        a.name: a
        for a in (
            _gemma_ple("gemma4", "gemma4_text", layer_scalar="layer_scalar"),
            _gemma_ple("gemma3n", "gemma3n_text", active_stream_key="altup_active_idx"),
        )
    }
)
ANATOMIES: Mapping[str, Anatomy] = MappingProxyType(
    {**{name: _from_family(f) for name, f in FAMILIES.items()}, **PLE_ANATOMIES}
)
_BY_MODEL_TYPE = {t: a for a in ANATOMIES.values() for t in a.model_types}


def anatomy_of(model_type: str) -> Anatomy:
    """The record of a ``transformers`` ``model_type``; others are refused by name."""
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise UnsupportedFamilyError(
            f"model_type {model_type!r}: the edit atlas knows the blocks of "
            f"{', '.join(sorted(_BY_MODEL_TYPE))} (a text-only *ForCausalLM; a multimodal "
            "checkpoint's text model must be loaded as its ForCausalLM); another family needs "
            "a record in headgeom.model.families or headgeom.atlas.blocks.PLE_ANATOMIES"
        ) from None


@dataclass(frozen=True, order=True)
class Block:
    """Block ``kind`` (:data:`KINDS`) of decoder layer ``layer``."""

    layer: int
    kind: str

    @property
    def label(self) -> str:
        return f"L{self.layer}.{self.kind}"


class AtlasModel:
    """A ``transformers`` causal LM (or a :class:`headgeom.model.hf.HFCausalLM`, whose
    ``transformers`` model it takes) seen as blocks. The model must be in eval mode."""

    def __init__(self, model: nn.Module):
        hf = getattr(model, "hf", model)  # HFCausalLM keeps the transformers model as .hf
        if hf.training:
            raise ValueError("the edit atlas runs a model in eval mode (dropout off): call .eval()")
        self.hf = hf
        self.config = hf.config
        self.anatomy = anatomy_of(str(getattr(hf.config, "model_type", "")))
        self.layers: tuple[nn.Module, ...] = tuple(self._get(hf, self.anatomy.layers))
        self.n_layer = len(self.layers)
        ple = self.anatomy.ple
        if ple is not None and not getattr(hf.config, ple.width_key, 0):
            ple = None  # a Gemma 4 configured without per-layer inputs
        self.ple = ple
        self.kinds = KINDS if ple is not None else KINDS[:2]
        for block in self.blocks():
            self.write_module(block)  # a missing module is refused now, not in a hook

    @staticmethod
    def _get(root: nn.Module, path: str) -> nn.Module:
        try:
            return root.get_submodule(path)
        except AttributeError:
            raise UnsupportedFamilyError(
                f"{type(root).__name__} has no module {path!r}, which its atlas record "
                "(headgeom.atlas.blocks) names"
            ) from None

    # ------------------------------------------------------------------ blocks
    def blocks(self) -> list[Block]:
        """Every block, layer by layer, in forward order within a layer."""
        return [Block(layer, kind) for layer in range(self.n_layer) for kind in self.kinds]

    def _check(self, block: Block) -> None:
        if block.kind not in self.kinds or not 0 <= block.layer < self.n_layer:
            raise ValueError(
                f"no block {block.label} in this {self.anatomy.name} model "
                f"({self.n_layer} layers, blocks {', '.join(self.kinds)})"
            )

    def write_module(self, block: Block) -> nn.Module:
        """The module whose output is the block's write into the residual stream."""
        self._check(block)
        a = self.anatomy
        path = {"attn": a.attn_write, "mlp": a.mlp_write}.get(block.kind)
        if block.kind == "ple":
            path = self.ple.post_norm
        return self._get(self.layers[block.layer], path)

    def knob(self, block: Block) -> torch.Tensor | None:
        """The gain (D,) of the block's post-norm (``gain_offset + weight``), the "volume
        knob"; None where the write is not a norm's output."""
        if not (self.anatomy.post_norms or block.kind == "ple"):
            return None
        weight = getattr(self.write_module(block), "weight", None)
        if weight is None:
            return None
        return self.anatomy.gain_offset + weight.detach()

    def key_norm(self, layer: int) -> nn.Module | None:
        """Layer ``layer``'s key norm (QK-norm), or None: the family has none, or the layer
        reuses an earlier layer's keys (Gemma 4 / 3n KV sharing)."""
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"no layer {layer}: the model has {self.n_layer}")
        path = self.anatomy.key_norm
        if path is None:
            return None
        try:
            return self.layers[layer].get_submodule(path)
        except AttributeError:
            return None

    def layer_scalar(self, layer: int) -> torch.Tensor | None:
        """The scalar the layer multiplies its output by (Gemma 4), or None."""
        name = self.anatomy.layer_scalar
        return None if name is None else getattr(self.layers[layer], name)

    # ------------------------------------------------------------------ tables
    def embedding(self) -> nn.Module:
        """The token embedding (its forward is the lookup, with Gemma's scale)."""
        return self.hf.get_input_embeddings()

    def ple_table(self) -> nn.Module:
        """The per-layer-embedding table (vocabulary × layers·P); refused where there is none."""
        if self.ple is None:
            raise ValueError(f"a {self.anatomy.name} model has no per-layer embedding table")
        return self._get(self.hf, self.ple.table)

    @property
    def ple_width(self) -> int:
        """P, the width of one layer's slice of the per-layer-embedding table."""
        if self.ple is None:
            raise ValueError(f"a {self.anatomy.name} model has no per-layer embedding table")
        return int(getattr(self.config, self.ple.width_key))

    # ------------------------------------------------------------------ streams and logits
    def stream(self, hidden: torch.Tensor) -> torch.Tensor:
        """The residual stream (B, T, D) of a decoder layer's input: the input itself, or
        the active stream of Gemma 3n's (streams, B, T, D)."""
        key = self.anatomy.active_stream_key
        return hidden if key is None else hidden[int(getattr(self.config, key))]

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    @torch.no_grad()
    def logits(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """The model's own forward (no gradients): logits (B, T, V), or (B, V) at the final
        position, asked for by index (not ``logits_to_keep=1``), so every layer runs on every
        position (Gemma 4 would cut its KV-shared layers to the final position)."""
        keep = torch.tensor([ids.shape[1] - 1], device=ids.device) if last_only else 0
        out = self.hf(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
        return out[:, -1] if last_only else out
