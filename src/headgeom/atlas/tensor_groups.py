"""The tensor groups of a model's weights, named from its state dict, one table per family.

The atlas's weight-side views (compression, blends, grafts, drift) act on groups of tensors:
the token embedding, the PLE table (Gemma 4 / Gemma 3n ``embed_tokens_per_layer``), the PLE
branch, attention, MLP, norms, and what else a family has. Each tensor's :class:`Role` is its
group, its layer (None outside the decoder layers) and its kind:

* ``table`` — rows looked up by token (or position) id: embeddings, an untied ``lm_head``;
* ``linear`` — a projection's weight matrix (our block readers' per-head maps are batches of
  matrices: the last two axes);
* ``bias``, ``norm`` (a norm's weight or bias), ``scale`` (a learned multiplier that is no
  norm: Gemma 4's ``layer_scalar``), ``frozen`` (our geometries' fixed bases).

Roles come from :data:`RULES`, one registration per family (our GPTs: ``gpt``; a
``transformers`` model: its ``model_type``): every name must match a rule, so a tensor no
rule names (a new family, a mixture-of-experts variant) is refused, never guessed.

:class:`Weights` is a model's tensors under their state-dict names, each stored tensor once
(a tied ``lm_head`` is its embedding: the alias is dropped and comes back on load), with
their roles; the views build new ``Weights`` and :meth:`Weights.load_into` puts them into a
model of the same architecture.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from headgeom.model.gpt import GPT
from headgeom.model.hf import HFCausalLM
from headgeom.optional import require

#: The groups, in the order tables list them.
GROUPS = (
    "embedding", "positions", "ple_table", "ple", "attention", "mlp", "altup", "laurel",
    "norms", "scales", "unembedding",
)  # fmt: skip
KINDS = ("table", "linear", "bias", "norm", "scale", "frozen")
#: Groups whose tables are indexed by token id (rows→mean, pruning, special-token rows).
VOCABULARY_GROUPS = ("embedding", "ple_table", "unembedding")


@dataclass(frozen=True)
class Role:
    group: str
    layer: int | None
    kind: str


@dataclass(frozen=True)
class Rule:
    """Names matching ``pattern`` (a full match; its ``layer`` group, if any, is the layer)
    have ``group`` and ``kind``."""

    pattern: re.Pattern
    group: str
    kind: str


def _rules(*rows: tuple[str, str, str]) -> tuple[Rule, ...]:
    for pattern, group, kind in rows:
        if group not in GROUPS or kind not in KINDS:
            raise ValueError(f"rule {pattern!r}: unknown group {group!r} or kind {kind!r}")
    return tuple(Rule(re.compile(p), g, k) for p, g, k in rows)


_L = r"(?P<layer>\d+)"
_LLAMA_LAYER = rf"model\.layers\.{_L}\."
_LLAMA = (
    (r"model\.embed_tokens\.weight", "embedding", "table"),
    (_LLAMA_LAYER + r"self_attn\.[qkvo]_proj\.weight", "attention", "linear"),
    (_LLAMA_LAYER + r"self_attn\.[qkvo]_proj\.bias", "attention", "bias"),  # Qwen2's q/k/v
    (_LLAMA_LAYER + r"self_attn\.[qk]_norm\.weight", "norms", "norm"),  # Qwen3, Gemma 3/4
    (_LLAMA_LAYER + r"mlp\.(gate|up|down)_proj\.weight", "mlp", "linear"),
    (_LLAMA_LAYER + r"(input|post_attention|pre_feedforward|post_feedforward)_layernorm\.weight",
     "norms", "norm"),
    (r"model\.norm\.weight", "norms", "norm"),
    (r"lm_head\.weight", "unembedding", "table"),  # dropped where tied to the embedding
)  # fmt: skip
# The PLE (Gemma 4 and Gemma 3n): the table, the model-level projection of the embedding into
# the per-layer inputs and its norm, and per layer the gate, projection and post-norm (the
# "volume knob").
_PLE = (
    (r"model\.embed_tokens_per_layer\.weight", "ple_table", "table"),
    (r"model\.per_layer_model_projection\.weight", "ple", "linear"),
    (r"model\.per_layer_projection_norm\.weight", "norms", "norm"),
    (_LLAMA_LAYER + r"per_layer_(input_gate|projection)\.weight", "ple", "linear"),
    (_LLAMA_LAYER + r"post_per_layer_input_norm\.weight", "norms", "norm"),
)
_GPT_LAYER = rf"blocks\.{_L}\."
_GPT2_LAYER = rf"transformer\.h\.{_L}\."
_NEOX_LAYER = rf"gpt_neox\.layers\.{_L}\."

RULES: Mapping[str, tuple[Rule, ...]] = MappingProxyType(
    {
        # our GPTs, every geometry (headgeom.model.geometries: LN_1 inside the reader, block
        # readers A_Q/A_K/A_V/U1/U2 and their shared norm, frozen bases as buffers)
        "gpt": _rules(
            (r"wte\.weight", "embedding", "table"),
            (r"wpe\.weight", "positions", "table"),
            (_GPT_LAYER + r"attn\.reader\.ln_1\.(weight|bias)", "norms", "norm"),
            (_GPT_LAYER + r"attn\.reader\.ln_(weight|bias)", "norms", "norm"),  # block readers'
            (_GPT_LAYER + r"attn\.(reader\.c_attn|writer\.c_proj)\.weight", "attention", "linear"),
            (_GPT_LAYER + r"attn\.reader\.(A_Q|A_K|A_V|U1|U2)", "attention", "linear"),
            (_GPT_LAYER + r"attn\.reader\.(c_attn\.bias|b_QKV)", "attention", "bias"),
            (_GPT_LAYER + r"attn\.writer\.(c_proj\.bias|b_O)", "attention", "bias"),
            (_GPT_LAYER + r"attn\.(reader|writer)\.basis", "attention", "frozen"),
            (_GPT_LAYER + r"ln_2\.(weight|bias)", "norms", "norm"),
            (_GPT_LAYER + r"mlp\.c_(fc|proj)\.weight", "mlp", "linear"),
            (_GPT_LAYER + r"mlp\.c_(fc|proj)\.bias", "mlp", "bias"),
            (r"ln_f\.(weight|bias)", "norms", "norm"),
        ),
        **{
            t: _rules(*_LLAMA)
            for t in ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text")
        },
        "gemma4_text": _rules(*_LLAMA, *_PLE, (_LLAMA_LAYER + r"layer_scalar", "scales", "scale")),
        "gemma3n_text": _rules(
            *_LLAMA,
            *_PLE,
            # AltUp (several predicted streams, corrected per layer) and LAuReL (a low-rank
            # residual beside attention)
            (_LLAMA_LAYER + r"altup\.(correction|prediction)_coefs\.weight", "altup", "linear"),
            (_LLAMA_LAYER + r"altup\.modality_router\.weight", "altup", "linear"),
            (_LLAMA_LAYER + r"altup\.correct_output_scale", "altup", "scale"),
            (_LLAMA_LAYER + r"altup\.router_norm\.weight", "norms", "norm"),
            (r"model\.altup_(unembed_)?projections\.\d+\.weight", "altup", "linear"),
            (_LLAMA_LAYER + r"laurel\.linear_(left|right)\.weight", "laurel", "linear"),
            (_LLAMA_LAYER + r"laurel\.post_laurel_norm\.weight", "norms", "norm"),
        ),
        "gpt2": _rules(
            (r"transformer\.wte\.weight", "embedding", "table"),
            (r"transformer\.wpe\.weight", "positions", "table"),
            (_GPT2_LAYER + r"ln_[12]\.(weight|bias)", "norms", "norm"),
            (_GPT2_LAYER + r"attn\.c_(attn|proj)\.weight", "attention", "linear"),
            (_GPT2_LAYER + r"attn\.c_(attn|proj)\.bias", "attention", "bias"),
            (_GPT2_LAYER + r"mlp\.c_(fc|proj)\.weight", "mlp", "linear"),
            (_GPT2_LAYER + r"mlp\.c_(fc|proj)\.bias", "mlp", "bias"),
            (r"transformer\.ln_f\.(weight|bias)", "norms", "norm"),
            (r"lm_head\.weight", "unembedding", "table"),
        ),
        "gpt_neox": _rules(
            (r"gpt_neox\.embed_in\.weight", "embedding", "table"),
            (_NEOX_LAYER + r"(input|post_attention)_layernorm\.(weight|bias)", "norms", "norm"),
            (_NEOX_LAYER + r"attention\.(query_key_value|dense)\.weight", "attention", "linear"),
            (_NEOX_LAYER + r"attention\.(query_key_value|dense)\.bias", "attention", "bias"),
            (_NEOX_LAYER + r"mlp\.dense_(h_to_4h|4h_to_h)\.weight", "mlp", "linear"),
            (_NEOX_LAYER + r"mlp\.dense_(h_to_4h|4h_to_h)\.bias", "mlp", "bias"),
            (r"gpt_neox\.final_layer_norm\.(weight|bias)", "norms", "norm"),
            (r"(lm_head|embed_out)\.weight", "unembedding", "table"),
        ),
    }
)


class UnknownTensorError(ValueError):
    """A family without a table, or a tensor name its table does not name."""


def rules_of(family: str) -> tuple[Rule, ...]:
    try:
        return RULES[family]
    except KeyError:
        raise UnknownTensorError(
            f"family {family!r} has no tensor-group table in headgeom.atlas.tensor_groups "
            f"(registered: {', '.join(sorted(RULES))}); add one registration to RULES"
        ) from None


def role_of(family: str, name: str) -> Role:
    """The role of the tensor ``name`` of a ``family`` model; refused when no rule names it."""
    for rule in rules_of(family):
        match = rule.pattern.fullmatch(name)
        if match:
            layer = match.groupdict().get("layer")
            return Role(rule.group, None if layer is None else int(layer), rule.kind)
    raise UnknownTensorError(
        f"tensor {name!r} of a {family} model matches no rule of its tensor-group table "
        "(headgeom.atlas.tensor_groups.RULES); refusing to guess its group"
    )


def family_and_module(model: nn.Module) -> tuple[str, nn.Module]:
    """(family, the module whose state dict holds the weights) of our GPT, an
    :class:`~headgeom.model.hf.HFCausalLM`, or a bare ``transformers`` causal LM (Gemma 4 and
    Gemma 3n have tensor groups before the workspace's sites cover them)."""
    if isinstance(model, GPT):
        return "gpt", model
    if isinstance(model, HFCausalLM):
        return str(model.hf.config.model_type), model.hf
    transformers = require("transformers", "the tensor groups of a transformers model")
    if isinstance(model, transformers.PreTrainedModel):
        return str(model.config.model_type), model
    raise UnknownTensorError(
        f"{type(model).__name__}: tensor groups are defined for our GPTs and transformers "
        "causal LMs only"
    )


def stored_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of ``module`` (parameters and persistent buffers, detached), each stored
    tensor once: a later name of the same tensor (a tied ``lm_head``) is an alias, dropped."""
    out, seen = {}, set()
    for name, t in module.state_dict(keep_vars=True).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            out[name] = t.detach()
    return out


@dataclass(frozen=True)
class Weights:
    """A model's tensors (state-dict names, aliases dropped) with their roles.

    ``tensors`` are never changed in place: every view returns new ``Weights``."""

    family: str
    tensors: Mapping[str, torch.Tensor]
    roles: Mapping[str, Role]

    @classmethod
    def of(cls, model: nn.Module) -> Weights:
        """A snapshot of the model's tensors (copies: loading other weights into the model
        later leaves these as they were)."""
        family, module = family_and_module(model)
        return cls.build(family, {n: t.clone() for n, t in stored_tensors(module).items()})

    @classmethod
    def build(cls, family: str, tensors: Mapping[str, torch.Tensor]) -> Weights:
        """``Weights`` of named tensors; every name must have a role."""
        roles = {name: role_of(family, name) for name in tensors}
        return cls(family, MappingProxyType(dict(tensors)), MappingProxyType(roles))

    def replace(self, changed: Mapping[str, torch.Tensor]) -> Weights:
        """These weights with the tensors ``changed`` replaced (same names, shapes, dtypes)."""
        for name, t in changed.items():
            old = self.tensors.get(name)
            if old is None:
                raise KeyError(f"tensor {name!r} is not among the {self.family} model's")
            if old.shape != t.shape or old.dtype != t.dtype:
                raise ValueError(
                    f"tensor {name!r}: replacement {tuple(t.shape)} {t.dtype} differs from "
                    f"{tuple(old.shape)} {old.dtype}"
                )
        return Weights(self.family, MappingProxyType({**self.tensors, **changed}), self.roles)

    def names(self, where: Callable[[Role], bool] = lambda role: True) -> list[str]:
        """Names of the tensors whose role satisfies ``where``, in state-dict order."""
        return [n for n, role in self.roles.items() if where(role)]

    def group(self, group: str) -> list[str]:
        if group not in GROUPS:
            raise KeyError(f"unknown tensor group {group!r}; known: {', '.join(GROUPS)}")
        return self.names(lambda role: role.group == group)

    def groups(self) -> list[str]:
        """The groups present, in :data:`GROUPS` order."""
        present = {role.group for role in self.roles.values()}
        return [g for g in GROUPS if g in present]

    def layers(self) -> list[int]:
        return sorted({r.layer for r in self.roles.values() if r.layer is not None})

    @torch.no_grad()
    def load_into(self, model: nn.Module) -> nn.Module:
        """Copy these tensors into ``model`` (same family and tensors; tied aliases follow
        their tensor); returns the model."""
        family, module = family_and_module(model)
        target = stored_tensors(module)
        if family != self.family:
            raise ValueError(f"weights of a {self.family} model loaded into a {family} model")
        _check_same(self.tensors, target, "these weights", "the model")
        for name, t in target.items():
            t.copy_(self.tensors[name])
        return model


def _check_same(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], what_a: str, what_b: str
) -> None:
    """Refuse two tensor sets that differ in a name, shape or dtype, naming the tensor."""
    for name in a:
        if name not in b:
            raise ValueError(f"tensor {name!r} is in {what_a} but not in {what_b}")
    for name in b:
        if name not in a:
            raise ValueError(f"tensor {name!r} is in {what_b} but not in {what_a}")
    for name, x in a.items():
        y = b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            raise ValueError(
                f"tensor {name!r}: {what_a} has {tuple(x.shape)} {x.dtype}, {what_b} "
                f"{tuple(y.shape)} {y.dtype}"
            )


def check_same_architecture(a: Weights, b: Weights, what: Iterable[str] = ("A", "B")) -> None:
    """Refuse two checkpoints of different architectures: another family, or a tensor that
    one lacks or whose shape or dtype differs (named in the message)."""
    what_a, what_b = what
    if a.family != b.family:
        raise ValueError(f"{what_a} is a {a.family} model, {what_b} a {b.family} model")
    _check_same(a.tensors, b.tensors, what_a, what_b)
