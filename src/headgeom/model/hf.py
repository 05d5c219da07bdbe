"""Any registered ``transformers`` causal LM with the workspace's named sites.

:class:`HFCausalLM` runs the ``transformers`` model's own forward, unchanged, and puts the
sites the engines address (as on ``headgeom.model.gpt.GPT``) on its modules with forward
(pre-)hooks, at the places its family record (:mod:`headgeom.model.families`) names:

* ``blocks.{l}.hook_resid_pre``  (batch, position, d_model)   input of decoder layer l
* ``blocks.{l}.attn.hook_q``     (batch, position, head, d_head)      query projection output
* ``blocks.{l}.attn.hook_k/v``   (batch, position, kv_head, d_head)   key/value projection
  outputs, one slice per key/value head; query heads ``cfg.kv_groups[j]`` read kv head j
  (projection outputs: Qwen3's and Gemma 3's q/k norms and the rotary act after them)
* ``blocks.{l}.attn.hook_z``     (batch, position, head, d_head)      input of o_proj
* ``blocks.{l}.hook_attn_out``   (batch, position, d_model)   attention's update of the residual
* ``blocks.{l}.hook_resid_mid``  (batch, position, d_model)   residual after attention (not in
  families with a parallel residual)
* ``blocks.{l}.hook_mlp_out``    (batch, position, d_model)   MLP's update of the residual
* ``hook_resid_final``           (batch, position, d_model)   input of the final norm

``model.hooks({site: fn})`` sets ``fn(activation) -> activation | None`` on those sites for the
duration of a block, as on our GPT, so the plain patching engine runs on it unchanged.
``model.blocks`` are the decoder layers with the block methods the fast engines use (layer
resumption, the clean-prefix forward; :mod:`headgeom.model.hf_blocks`) and
:meth:`HFCausalLM.answer_logits` reads two answer logits from the residual leaving the last
layer. ``transformers`` is imported only when a model is built (the ``hf`` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from headgeom.model import facts
from headgeom.model.families import Family, UnsupportedFamilyError, family_of
from headgeom.model.hf_blocks import HFBlock, LayerContext, layer_arguments
from headgeom.optional import require

#: The architecture key of ``headgeom.model.registry`` for wrapped ``transformers`` models.
ARCHITECTURE = facts.HF_CAUSAL_LM

SITE_AXES: dict[str, tuple[str, ...]] = {
    "hook_resid_pre": ("batch", "position", "d_model"),
    "attn.hook_q": ("batch", "position", "head", "d_head"),
    "attn.hook_k": ("batch", "position", "kv_head", "d_head"),
    "attn.hook_v": ("batch", "position", "kv_head", "d_head"),
    "attn.hook_z": ("batch", "position", "head", "d_head"),
    "hook_attn_out": ("batch", "position", "d_model"),
    "hook_resid_mid": ("batch", "position", "d_model"),
    "hook_mlp_out": ("batch", "position", "d_model"),
    "hook_resid_final": ("batch", "position", "d_model"),
}
_BLOCK_SITE = re.compile(r"blocks\.(\d+)\.(.+)")
Hook = Callable[[torch.Tensor], torch.Tensor | None]


@dataclass(frozen=True)
class HFModelConfig:
    """Sizes of a wrapped model (what engines read as ``model.cfg``) and its ``transformers``
    config as a dict (``hf_config``), from which :class:`HFCausalLM` rebuilds it."""

    architecture: ClassVar[str] = ARCHITECTURE
    geometry: ClassVar[None] = None  # a pretrained model has no study geometry

    family: str
    n_layer: int
    n_head: int
    n_kv_head: int
    d_head: int
    d_model: int
    n_vocab: int
    hf_config: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def kv_groups(self) -> tuple[tuple[int, ...], ...]:
        """The query heads that read each key/value head (``transformers``' repeat_kv)."""
        g = self.n_head // self.n_kv_head
        return tuple(tuple(range(j * g, (j + 1) * g)) for j in range(self.n_kv_head))

    @classmethod
    def from_hf(cls, config: Any) -> HFModelConfig:
        """Sizes of a ``transformers`` config object, via its family's declared keys."""
        family = family_of(config.model_type)
        n_head = int(config.num_attention_heads)
        n_kv = int(getattr(config, family.kv_heads_key)) if family.kv_heads_key else n_head
        d_head = getattr(config, family.head_dim_key, None) if family.head_dim_key else None
        d_head = int(d_head) if d_head else int(config.hidden_size) // n_head
        if n_head % n_kv:
            raise UnsupportedFamilyError(
                f"{config.model_type}: {n_head} query heads do not split into {n_kv} "
                "key/value head groups"
            )
        return cls(
            family=family.name,
            n_layer=int(config.num_hidden_layers),
            n_head=n_head,
            n_kv_head=n_kv,
            d_head=d_head,
            d_model=int(config.hidden_size),
            n_vocab=int(config.vocab_size),
            hf_config=config.to_dict(),
        )

    def to_dict(self) -> dict:
        """With its ``architecture`` key: ``registry.config_from_dict`` picks the class by it."""
        return {"architecture": ARCHITECTURE, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping) -> HFModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"architecture"}
        if unknown:
            raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k != "architecture"})


def _build_hf(hf_config: Mapping[str, Any]) -> nn.Module:
    """A randomly initialised ``transformers`` model of a config dict (seed first)."""
    transformers = require("transformers", "a transformers model")
    d = dict(hf_config)
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    return transformers.AutoModelForCausalLM.from_config(config)


def _heads(fn: Hook, n: int, d: int, site: str) -> Hook:
    """``fn`` on (B, T, n, d) views of a (B, T, n·d) activation, head-major."""

    def hook(x: torch.Tensor) -> torch.Tensor | None:
        if x.shape[-1] != n * d:
            raise ValueError(f"{site}: width {x.shape[-1]} is not {n} heads × d_head {d}")
        out = fn(x.unflatten(-1, (n, d)))
        return None if out is None else out.flatten(-2)

    return hook


def _fused(fn: Hook, part: int, layout: str, n: int, d: int, site: str) -> Hook:
    """``fn`` on part ``part`` (0 q, 1 k, 2 v) of a fused qkv output (B, T, 3·n·d) as
    (B, T, n, d): "blocks" is [q | k | v], "per_head" is per head [q_h | k_h | v_h]."""

    def piece(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 3 * n * d:
            raise ValueError(f"{site}: fused width {x.shape[-1]} is not 3 × {n} heads × {d}")
        if layout == "blocks":
            return x[..., part * n * d : (part + 1) * n * d].unflatten(-1, (n, d))
        return x.unflatten(-1, (n, 3 * d))[..., part * d : (part + 1) * d]

    def hook(x: torch.Tensor) -> torch.Tensor | None:
        out = fn(piece(x))
        if out is None:
            return None
        x = x.clone()
        piece(x).copy_(out)  # piece is a view of the clone
        return x

    return hook


def _on_input(module: nn.Module, fn: Hook):
    """Forward pre-hook applying ``fn`` to the module's first input (positional or the
    ``hidden_states`` keyword, as decoder layers take it)."""

    def hook(_, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        out = fn(x)
        if out is None:
            return None
        if args:
            return (out, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": out}

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def _on_output(module: nn.Module, fn: Hook):
    return module.register_forward_hook(lambda _, args, out: fn(out))


class HFCausalLM(nn.Module):
    """A ``transformers`` causal LM of a registered family, with named sites.

    ``HFCausalLM(cfg)`` builds a randomly initialised model of ``cfg.hf_config`` (seed the RNGs
    first); :meth:`wrap` takes a loaded one (``headgeom.model.sources``)."""

    def __init__(self, cfg: HFModelConfig, hf_model: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.family: Family = family_of(cfg.hf_config.get("model_type", ""))
        self.hf = _build_hf(cfg.hf_config) if hf_model is None else hf_model
        # a tuple, not the ModuleList itself: an alias registered as a submodule would put
        # every layer's weights in the state dict (and the checkpoint) a second time
        self.layer_modules = tuple(self._module(self.family.layers))
        if len(self.layer_modules) != cfg.n_layer:
            raise UnsupportedFamilyError(
                f"{self.family.layers} holds {len(self.layer_modules)} layers, the config "
                f"{cfg.n_layer}"
            )
        for path in self._declared():
            self._module(path)  # a missing module is refused now, not at its first hook
        # views of the layers (a tuple, not a ModuleList: the parameters stay registered once)
        self.blocks = tuple(HFBlock(self, layer) for layer in range(cfg.n_layer))
        self._silent: set[str] = set()  # sites whose hooks do nothing now
        self._all_silent = False
        self._active: dict[str, Hook] = {}  # the hooks set by hooks(), by site
        self._contexts: dict[tuple, list[LayerContext]] = {}

    @classmethod
    def wrap(cls, hf_model: nn.Module) -> HFCausalLM:
        return cls(HFModelConfig.from_hf(hf_model.config), hf_model)

    def _declared(self) -> list[str]:
        f = self.family
        per_layer = [f.attn, f.o_proj, f.mlp, f.attn_out, f.mlp_out, f.resid_mid, f.q_proj,
                     f.k_proj, f.v_proj, f.qkv]  # fmt: skip
        layer = f"{f.layers}.0"
        return [f.final_norm, f.lm_head, *(f"{layer}.{p}" for p in per_layer if p)]

    def _module(self, path: str) -> nn.Module:
        try:
            return self.hf.get_submodule(path)
        except AttributeError:
            raise UnsupportedFamilyError(
                f"{type(self.hf).__name__}: family {self.family.name!r} declares module "
                f"{path!r}, which the model lacks"
            ) from None

    def n_params(self) -> int:
        """Parameters, each once (tied embeddings count once), as ``GPT.n_params``."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ forward
    def forward(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V) of ids (B, T) by the ``transformers`` forward (no padding, no
        cache); (B, V) at the final position when ``last_only``."""
        out = self.hf(input_ids=ids, use_cache=False, logits_to_keep=1 if last_only else 0)
        return out.logits[:, -1] if last_only else out.logits

    def answer_logits(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Logits (R, K) of the token ids ``ids`` (R, K) at the final position, from the
        residual ``x`` (R, T, D) leaving the last layer: the forward after its layers (final
        norm, ``lm_head`` rows, the family's logit softcapping) for a few ids only. The
        ``hook_resid_final`` site sees the final position only."""
        f = self.family
        h = self._module(f.final_norm)(x[:, -1:])[:, 0]  # (R, D)
        head = self._module(f.lm_head)
        logits = torch.einsum("rd,rkd->rk", h, head.weight[ids])
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[ids]
        cap = self.hf.config.to_dict().get(f.logit_softcap_key) if f.logit_softcap_key else None
        if cap:  # as the *ForCausalLM forward does: c · tanh(logits / c)
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def layer_contexts(self, T: int) -> list[LayerContext]:
        """Per decoder layer, what the model's own forward on a length-T sequence passes it
        besides the residual, recorded once per (T, device, dtype) from a forward on a batch
        of one (the content is irrelevant: no padding, so masks and rotary tables depend on
        positions only), with every site silent."""
        weight = next(self.hf.parameters())
        key = (int(T), str(weight.device), weight.dtype)
        if key not in self._contexts:
            seen: list[dict[str, Any] | None] = [None] * self.cfg.n_layer

            def record(index):
                def hook(module, args, kwargs):
                    seen[index] = layer_arguments(module, args, kwargs)

                return hook

            handles = [layer.register_forward_pre_hook(record(i), with_kwargs=True)
                       for i, layer in enumerate(self.layer_modules)]  # fmt: skip
            pad = self.hf.config.pad_token_id
            token = 0 if pad != 0 else 1  # content is irrelevant; avoid the padding warning
            ids = torch.full((1, int(T)), token, dtype=torch.long, device=weight.device)
            try:
                with self.silenced():
                    self.hf(input_ids=ids, use_cache=False, logits_to_keep=1)
            finally:
                for handle in handles:
                    handle.remove()
            attn = str(self.hf.config._attn_implementation)
            if len(self._contexts) >= 64:  # lengths of one study are few; bound the memory
                self._contexts.pop(next(iter(self._contexts)))
            self._contexts[key] = [LayerContext(kw, attn) for kw in seen]
        return self._contexts[key]

    # ------------------------------------------------------------------ sites
    def site_names(self) -> list[str]:
        """Every site this model offers."""
        per_block = [s for s in SITE_AXES if s != "hook_resid_final"
                     and (s != "hook_resid_mid" or self.family.resid_mid)]  # fmt: skip
        names = [f"blocks.{layer}.{s}" for layer in range(self.cfg.n_layer) for s in per_block]
        return [*names, "hook_resid_final"]

    @functools.cached_property
    def _site_set(self) -> frozenset[str]:
        return frozenset(self.site_names())

    @contextlib.contextmanager
    def silenced(self, names: list[str] | None = None) -> Iterator[None]:
        """The hooks set on the sites ``names`` (None: every site) do nothing for the
        duration (the blocks' internal runs; :mod:`headgeom.model.hf_blocks`)."""
        before_all, before = self._all_silent, set(self._silent)
        if names is None:
            self._all_silent = True
        else:
            self._silent |= set(names)
        try:
            yield
        finally:
            self._all_silent, self._silent = before_all, before

    @contextlib.contextmanager
    def internal_hooks(self, fns: Mapping[str, Hook]) -> Iterator[None]:
        """:meth:`hooks` that fire even while the sites are :meth:`silenced`, after the sites'
        own hooks (the blocks' internal runs)."""
        handles = []
        try:
            for name, fn in fns.items():
                handles.append(self._attach(name, fn))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def apply_site(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The hook set on site ``name`` by :meth:`hooks` applied to ``x`` (``x`` itself
        when none is set or it is silenced): for a block that applies a site itself."""
        fn = self._active.get(name)
        out = None if fn is None else self._live(name, fn)(x)
        return x if out is None else out

    def hooked(self, prefix: str) -> bool:
        """Whether a hook set by :meth:`hooks` is on a site whose name starts with
        ``prefix`` (a block's ``blocks.{l}.``)."""
        return any(name.startswith(prefix) for name in self._active)

    def _live(self, name: str, fn: Hook) -> Hook:
        def hook(x: torch.Tensor) -> torch.Tensor | None:
            return None if self._all_silent or name in self._silent else fn(x)

        return hook

    def _attach(self, name: str, fn: Hook):
        f, cfg = self.family, self.cfg
        if name == "hook_resid_final":
            return _on_input(self._module(f.final_norm), fn)
        match = _BLOCK_SITE.fullmatch(name)
        if match is None or name not in self._site_set:
            raise KeyError(f"unknown site {name!r} of a {f.name} model; known: {self.site_names()}")
        layer, site = int(match[1]), match[2]
        block = self.layer_modules[layer]
        if site == "hook_resid_pre":
            return _on_input(block, fn)
        if site == "hook_resid_mid":
            return _on_input(block.get_submodule(f.resid_mid), fn)
        if site in ("hook_attn_out", "hook_mlp_out"):
            path = f.attn_out if site == "hook_attn_out" else f.mlp_out
            return _on_output(block.get_submodule(path), fn)
        if site == "attn.hook_z":
            return _on_input(
                block.get_submodule(f.o_proj), _heads(fn, cfg.n_head, cfg.d_head, name)
            )
        part = "qkv".index(site[-1])  # attn.hook_q / hook_k / hook_v
        n = cfg.n_head if part == 0 else cfg.n_kv_head
        if f.qkv is not None:
            hook = _fused(fn, part, f.qkv_layout, n, cfg.d_head, name)
            return _on_output(block.get_submodule(f.qkv), hook)
        proj = (f.q_proj, f.k_proj, f.v_proj)[part]
        return _on_output(block.get_submodule(proj), _heads(fn, n, cfg.d_head, name))

    @contextlib.contextmanager
    def hooks(self, fns: Mapping[str, Hook]) -> Iterator[None]:
        """Attach ``fns`` to named sites; they are removed on exit, even after an error."""
        unknown = set(fns) - self._site_set
        if unknown:
            raise KeyError(f"unknown sites {sorted(unknown)}")
        handles = []
        try:
            for name, fn in fns.items():
                handles.append(self._attach(name, self._live(name, fn)))
                self._active[name] = fn
            yield
        finally:
            for handle in handles:
                handle.remove()
            for name in fns:
                self._active.pop(name, None)

    def run_with_cache(
        self, ids: torch.Tensor, names: list[str], last_only: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cache: dict[str, torch.Tensor] = {}

        def saver(name: str) -> Hook:
            def save(x: torch.Tensor) -> None:
                cache[name] = x.detach().clone()  # a view of a module's tensor otherwise

            return save

        with self.hooks({n: saver(n) for n in names}):
            logits = self(ids, last_only=last_only)
        return logits, cache
