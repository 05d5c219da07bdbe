"""The paper-scale SA-MoE (SAMOE §4): a pinned Hugging Face causal LM (SmolLM2: the Llama
family; Gemma 3 text) whose every decoder layer's ``mlp`` is replaced by the SA-MoE block.

The Hub model keeps computing everything else (embeddings, rotary attention, its norms, the
tied head); each decoder layer is wrapped by a ``HubBlock`` (an ``MoEStep``, as the workspace
GPT's ``Block``), and the layer's ``mlp`` attribute becomes a parameter-free call back into
that block. The routing state s_l, which only routers read, travels beside the hidden
states in one forward-scoped record (``_Run``): the Hub's layer loop passes hidden states
only, and must not be rewritten per family. Per layer::

    x_l     = the layer's own pre-MLP norm of m_l (``post_attention_layernorm`` for Llama,
              ``pre_feedforward_layernorm`` for Gemma 3)
    y_l     = the SA-MoE mixture of x_l under s_l (``MoEStep.mix``)
    h_{l+1} = the layer's own residual of y_l (Gemma 3 norms y_l first: its sandwich norm)
    s_{l+1} = ``MoEStep.step_state(s_l, y_l, h_{l+1})``

State-dict names: ``blocks.{l}.layer.*`` (the decoder layer, its ``mlp`` removed),
``blocks.{l}.moe.*`` and ``blocks.{l}.write.*`` (as the toy model's, so parameter kinds,
upcycling and init manifests are shared) and ``lm.*`` (the rest of the Hub model); the tied
LM head is not stored and is re-tied on load. The Hub's layer list is the same
``ModuleList`` as ``blocks``, held by ``lm.model`` as a plain attribute so that each
parameter has one name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from torch import nn

from headgeom.model.gpt import HookPoint
from headgeom.optional import require
from headgeom.samoe.config import MoEConfig, check_variant
from headgeom.samoe.model import LayerAux, MoEModel, MoEStep, SAMoE

#: Hub model types this wrap knows (``config.model_type``), by the family they stand for.
MODEL_TYPES = {"llama": "Llama (SmolLM2)", "gemma3_text": "Gemma 3 text"}
#: The LM head entry a tied model does not store.
TIED_HEAD = "lm.lm_head.weight"


@dataclass(frozen=True)
class HubSource:
    """A pinned Hub dense source: repository, revision and the model's full config record
    (``PretrainedConfig.to_dict()``), enough to rebuild the architecture offline."""

    repo_id: str
    revision: str
    config: dict

    def hf_config(self):
        CONFIG_MAPPING = require("transformers", f"Hub model {self.repo_id}").CONFIG_MAPPING

        model_type = self.config.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"{self.repo_id}@{self.revision}: model_type {model_type!r} has no "
                             f"SA-MoE wrap; known: {sorted(MODEL_TYPES)}")  # fmt: skip
        return CONFIG_MAPPING[model_type].from_dict(self.config)

    def to_dict(self) -> dict:
        return {"repo_id": self.repo_id, "revision": self.revision, "config": self.config}

    @classmethod
    def from_dict(cls, record: dict) -> HubSource:
        return cls(record["repo_id"], record["revision"], dict(record["config"]))

    @classmethod
    def of(cls, repo_id: str, revision: str, config) -> HubSource:
        """From a ``PretrainedConfig``: its ``to_dict()`` as JSON keeps it (string keys), so a
        source read back from a checkpoint header equals the one written."""
        record = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
        record.pop("transformers_version", None)  # the same model whatever wrote it
        return cls(repo_id, revision, json.loads(json.dumps(record)))


@dataclass
class _Run:
    """What one forward threads beside the hidden states: s_l, the last y_l, the aux losses."""

    s: torch.Tensor | None = None
    y: torch.Tensor | None = None
    auxes: list[LayerAux] = field(default_factory=list)


class _MixCall:
    """Stands in for a decoder layer's ``mlp``: y_l = the block's mixture of x_l under s_l.
    Not a module (the block owns the experts; a module here would name them twice)."""

    def __init__(self, block: HubBlock):
        self.block = block

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        run = self.block.run
        y, aux = self.block.mix(x, run.s)
        run.y = y
        run.auxes.append(aux)
        return y


class HubBlock(MoEStep):
    """One Hub decoder layer with its MLP replaced by the SA-MoE block (module text)."""

    def __init__(self, layer: nn.Module, moe: MoEConfig, variant: str, run: _Run,
                 moe_device: str | torch.device | None = None):  # fmt: skip
        super().__init__()
        dense_mlp = layer._modules.pop("mlp")
        self.layer = layer
        d_model = dense_mlp.config.hidden_size
        with torch.device(moe_device or "cpu"):
            self.add_moe(d_model, moe, variant, lambda: type(dense_mlp)(dense_mlp.config))
        object.__setattr__(layer, "mlp", _MixCall(self))
        layer.self_attn.register_forward_hook(self._attn_out)
        self.run = run

    @property
    def router_norm(self) -> nn.Module:
        if hasattr(self.layer, "pre_feedforward_layernorm"):  # Gemma 3's sandwich
            return self.layer.pre_feedforward_layernorm
        return self.layer.post_attention_layernorm

    @property
    def post_norms(self) -> tuple[nn.Module | None, nn.Module | None]:
        if hasattr(self.layer, "pre_feedforward_layernorm"):
            return self.layer.post_attention_layernorm, self.layer.post_feedforward_layernorm
        return None, None

    def _attn_out(self, module, args, out):
        # a_l: the attention block's output, before any post-attention norm
        return (self.hook_attn_out(out[0]), *out[1:])

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        run = self.run
        s = run.s
        out = self.layer(hidden_states, *args, **kwargs)
        h_next = out[0] if isinstance(out, tuple) else out
        run.s = self.step_state(s, run.y, h_next)
        return out


class HubSAMoE(MoEModel):
    """One SA-MoE variant of a Hub causal LM. ``moe_device="meta"`` builds the MoE blocks as
    shapes only (to be filled by ``load_state_dict(..., assign=True)``: upcycling, loading);
    the Hub model itself is built for real, so its non-persistent buffers (rotary
    frequencies, Gemma's embedding scale) hold their values."""

    def __init__(self, source: HubSource, moe: MoEConfig, variant: str,
                 moe_device: str | torch.device | None = None):  # fmt: skip
        AutoModelForCausalLM = require("transformers", "an SA-MoE Hub model").AutoModelForCausalLM

        super().__init__()
        self.source, self.moe_cfg, self.variant = source, moe, check_variant(variant)
        config = source.hf_config()
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.run = _Run()
        layers = lm.model._modules.pop("layers")
        self.blocks = nn.ModuleList(
            HubBlock(layer, moe, variant, self.run, moe_device) for layer in layers
        )
        object.__setattr__(lm.model, "layers", self.blocks)
        self.lm = lm
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.hook_resid_final = HookPoint()
        lm.model.norm.register_forward_pre_hook(
            lambda module, args: (self.hook_resid_final(args[0]), *args[1:])
        )
        self.register_state_dict_post_hook(_drop_tied_head)

    @property
    def wte(self) -> nn.Embedding:
        return self.lm.get_input_embeddings()

    @property
    def n_ctx(self) -> int:
        return int(self.lm.config.max_position_embeddings)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids)  # Gemma's embedding module applies its own √d scale

    def forward(self, ids: torch.Tensor, return_aux: bool = False):
        """Logits (B, T, V) of ids (B, T); with ``return_aux`` also the layer-mean aux losses."""
        self.check_length(ids)
        run = self.run
        run.s, run.y, run.auxes = self.initial_state(ids), None, []
        try:
            logits = self.lm(input_ids=ids, use_cache=False).logits
            auxes = run.auxes
        finally:  # no forward's tensors outlive it
            run.s, run.y, run.auxes = None, None, []
        return (logits, self.mean_aux(auxes)) if return_aux else logits

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        state = {k: v for k, v in state_dict.items() if not (self.tied and k == TIED_HEAD)}
        result = super().load_state_dict(state, strict=False, assign=assign)
        missing = [k for k in result.missing_keys if not (self.tied and k == TIED_HEAD)]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"HubSAMoE.load_state_dict: missing {missing}, unexpected "
                               f"{result.unexpected_keys}")  # fmt: skip
        if self.tied:  # assign=True replaced the embedding: the head follows it
            self.lm.lm_head.weight = self.lm.model.embed_tokens.weight
        return result

    def dense_mlp(self, layer: int) -> str:
        return f"model.layers.{layer}.mlp."

    def dense_name(self, name: str) -> str:
        parts = name.split(".")
        if parts[0] == "blocks" and parts[2] == "layer":  # blocks.l.layer.X -> model.layers.l.X
            return ".".join(["model", "layers", parts[1], *parts[3:]])
        if parts[0] == "lm":
            return ".".join(parts[1:])
        return super().dense_name(name)


def _drop_tied_head(module: HubSAMoE, state_dict, prefix, local_metadata) -> None:
    if module.tied:
        state_dict.pop(prefix + TIED_HEAD, None)


def dense_state(lm: nn.Module) -> dict[str, torch.Tensor]:
    """A Hub causal LM's state dict as the upcycler reads it (the tied head left out)."""
    state = dict(lm.state_dict())
    if getattr(lm.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


class DenseLM(nn.Module):
    """A dense Hub source rebuilt from its checkpoint (the upcycler's state dict, tied head
    re-tied): logits (B, T, V) of ids (B, T), as the SA-MoE's forward gives them."""

    def __init__(self, source: HubSource, state: dict[str, torch.Tensor]):
        AutoModelForCausalLM = require("transformers", "a dense Hub model").AutoModelForCausalLM

        super().__init__()
        config = source.hf_config()
        self.lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        result = self.lm.load_state_dict(state, strict=False)
        missing = [k for k in result.missing_keys if not (tied and k == "lm_head.weight")]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"dense {source.repo_id}: missing {missing}, unexpected "
                               f"{result.unexpected_keys}")  # fmt: skip
        if tied:
            self.lm.tie_weights()
        self.lm.eval()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


def empty_model(source, moe: MoEConfig, variant: str) -> MoEModel:
    """An SA-MoE of ``variant`` with the shapes of ``source`` (a workspace ``ModelConfig`` or a
    ``HubSource``) and no trained values, drawing nothing from the caller's RNG: a Hub
    model's routers, experts and writes as shapes only (meta); a toy built on the CPU with
    its initial draws forked away (milliseconds, where the meta device's ``normal_`` would
    import torch._dynamo, a second and more in every job)."""
    if isinstance(source, HubSource):
        return HubSAMoE(source, moe, variant, moe_device="meta")
    with torch.random.fork_rng(devices=[]):
        return SAMoE(source, moe, variant)
