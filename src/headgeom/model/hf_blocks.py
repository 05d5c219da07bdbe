"""The decoder layers of a wrapped ``transformers`` model as the fast engines' blocks.

The fast engines (``headgeom.heads.analysis.patching.patch_batch_fast`` and the others that the
registry's ``fast_patching``/``prefix_reuse`` admit) rerun blocks l..L−1 from a cached
residual, resume a block after its attention, and recompute only positions t ≥ p against the
clean prefix's keys and values. On our GPT these are the methods of ``gpt.Block``;
:class:`HFBlock` gives a ``transformers`` decoder layer the same ones, and each of them runs
the layer's **own** forward:

* everything a layer gets besides the residual (the rotary cos/sin of its attention type, the
  attention mask of its type — Gemma's, Mistral's and Qwen's sliding-window layers get
  theirs —, position ids, …) is recorded from the model's own forward on a sequence of the
  same length (:class:`LayerContext`, one per length; a full unpadded causal sequence
  without cache, as the engines run), so no family's position or mask code is rewritten
  here; for a suffix, the mask's query rows and the position-indexed arguments are sliced;
* the clean prefix's keys and values reach the layer's attention through its cache argument
  (``Family.layer_cache``): an object whose ``update`` returns the prefix followed by the
  suffix's own, which is all these families' attention does with a cache. The engines cache
  the prefix at the sites ``attn.hook_k``/``attn.hook_v`` (projection outputs);
  :meth:`HFBlock.prefix_keys_values` takes them to what the attention keeps (after Qwen3's
  and Gemma 3's k-norm and the rotary at the prefix's own positions 0..P−1) by the layer's
  own attention code;
* resuming after the attention replaces the attention module's forward for one call by the
  output projection of the given z (or by the given attention output): the residual adds,
  post-norms (Gemma), parallel residual (GPT-NeoX) and MLP are the layer's own.

The model must be in eval mode (dropout off), as for every analysis.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headgeom.model.families import UnsupportedFamilyError

#: Layer arguments indexed by position on their last axis (sliced for a suffix); the rotary
#: cos/sin (``position_embeddings``) are indexed on their second-to-last.
_POSITION_ARGS = ("position_ids", "cache_position")


def _hidden(out: Any) -> torch.Tensor:
    """A decoder layer's output residual (older layers return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


@dataclass(frozen=True)
class LayerContext:
    """The keyword arguments (besides the residual) the model's own forward passes one decoder
    layer on a length-T sequence (batch 1: masks and rotary tables broadcast over rows)."""

    kwargs: dict[str, Any]
    attn_implementation: str

    def full(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def suffix(self, P: int) -> dict[str, Any]:
        """The same for the positions P..T−1 only, attending to keys 0..T−1."""
        out = {}
        for name, value in self.kwargs.items():
            if name == "position_embeddings" and value is not None:
                out[name] = tuple(t[..., P:, :] for t in value)
            elif name in _POSITION_ARGS and value is not None:
                out[name] = value[..., P:]
            elif name == "attention_mask":
                out[name] = self._suffix_mask(value, P)
            elif isinstance(value, torch.Tensor):
                raise UnsupportedFamilyError(
                    f"decoder layer argument {name!r} {tuple(value.shape)}: no rule for its "
                    "suffix (headgeom.model.hf_blocks)"
                )
            else:
                out[name] = value
        return out

    def _suffix_mask(self, mask: Any, P: int) -> torch.Tensor | None:
        if isinstance(mask, torch.Tensor):
            return mask[..., P:, :]  # (b, 1, S, T): the suffix's query rows
        if mask is not None:
            raise UnsupportedFamilyError(
                f"a {type(mask).__name__} attention mask ({self.attn_implementation}) cannot "
                "be cut to a suffix; use attn_implementation sdpa or eager"
            )
        if self.attn_implementation != "sdpa":
            raise UnsupportedFamilyError(
                f"attention {self.attn_implementation!r} without a mask: the suffix's "
                "causal mask is built for sdpa only"
            )
        return None  # causal and unpadded: HFBlock builds the suffix's own


class _PrefixCache:
    """The cache argument of a suffix forward: ``update`` returns the B clean prefix
    sequences' keys/values (B, H_kv, P, d) followed by those of the R = G·B suffix rows, row
    g·B + b continuing prefix b (broadcast, as ``gpt.prefix_joined``). ``early`` (a
    :class:`_Recorder`), if given, holds each row's own kept keys/values of the suffix
    positions before this call's (R, H_kv, E, d): they follow the prefix."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, early=None):
        self.keys, self.values, self.early = keys, values, early

    def update(self, keys, values, layer_idx=None, kwargs=None, **_):
        early_keys, early_values = (None, None) if self.early is None else (
            self.early.keys, self.early.values)  # fmt: skip
        return (self._joined(self.keys, early_keys, keys),
                self._joined(self.values, early_values, values))  # fmt: skip

    @staticmethod
    def _joined(past: torch.Tensor | None, early: torch.Tensor | None, new: torch.Tensor):
        parts = [new] if early is None else [early, new]
        if past is not None:
            R, B = new.shape[0], past.shape[0]
            if R % B:
                raise ValueError(f"{R} suffix rows do not repeat the {B} prefix sequences")
            parts.insert(0, past.expand(R // B, *past.shape).flatten(0, 1))
        return torch.cat(parts, dim=2)


class _Recorded(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Stops a layer's forward once its attention has handed its keys/values to the cache."""


class _Recorder:
    """The cache argument that records what the attention keeps, then stops the forward."""

    keys: torch.Tensor
    values: torch.Tensor

    def update(self, keys, values, layer_idx=None, kwargs=None, **_):
        self.keys, self.values = keys, values
        raise _Recorded


class HFBlock:
    """Decoder layer ``index`` of an :class:`~headgeom.model.hf.HFCausalLM` with the block
    methods of ``gpt.Block`` (a view, not a module: the parameters stay the model's once).

    Sites fire as on ``gpt.Block``: ``block(x)`` and :meth:`forward_suffix` fire every site of
    the layer; :meth:`after_z`/:meth:`after_attn` fire those after the attention
    (``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``), not ``hook_resid_pre`` nor
    ``attn.hook_*``.
    """

    def __init__(self, model: nn.Module, index: int):  # an HFCausalLM (it imports this)
        self.model, self.index = model, index
        f = model.family
        self.layer: nn.Module = model.layer_modules[index]
        self.attn_module = self.layer.get_submodule(f.attn)
        self.o_proj = self.layer.get_submodule(f.o_proj)
        self.attn_out = self.layer.get_submodule(f.attn_out)
        self.mlp_out = self.layer.get_submodule(f.mlp_out)
        self.attn = HFAttention(self)
        self._last_prefix: tuple | None = None  # prefix_keys_values' last (key, answer)

    def _site(self, name: str) -> str:
        return f"blocks.{self.index}.{name}"

    def _context(self, T: int) -> LayerContext:
        return self.model.layer_contexts(T)[self.index]

    # ------------------------------------------------------------------ whole sequences
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on the residual ``x`` (R, T, D) of whole sequences (positions 0..T−1)."""
        return _hidden(self.layer(x, **self._context(x.shape[1]).full()))

    # ------------------------------------------------------------------ after attention
    @contextlib.contextmanager
    def _attention_returns(self, fn: Callable[[], torch.Tensor]) -> Iterator[None]:
        """The attention module's forward returns ``(fn(), None)`` for the duration, as its
        own returns (output, weights); the sites before the attention output stay silent."""
        silent = [self._site(s) for s in ("hook_resid_pre", "attn.hook_q", "attn.hook_k",
                                          "attn.hook_v", "attn.hook_z")]  # fmt: skip
        own = self.attn_module.__dict__.get("forward")  # an instance's own (accelerate's)
        self.attn_module.forward = lambda *args, **kwargs: (fn(), None)
        try:
            with self.model.silenced(silent):
                yield
        finally:
            if own is None:
                del self.attn_module.forward  # the class's forward again
            else:
                self.attn_module.forward = own

    def after_z(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The rest of the layer once its head outputs ``z`` (R, S, H, d) are known: the
        output projection of z, then what the layer adds to the residual ``x`` (R, S, D)."""
        with self._attention_returns(lambda: self.o_proj(z.flatten(-2).contiguous())):
            return _hidden(self.layer(x))

    def after_attn(
        self, x: torch.Tensor, attn_out: torch.Tensor, mlp_out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The rest of the layer once its attention output ``attn_out`` (R, S, D; the site
        ``hook_attn_out``, after Gemma's post-norm) is known; ``mlp_out`` given (a clamp) is
        the site ``hook_mlp_out`` instead of the MLP's."""
        width = self.model.cfg.n_head * self.model.cfg.d_head
        zeros = x.new_zeros(*x.shape[:-1], width)
        handles = [self.attn_out.register_forward_hook(lambda m, a, o: attn_out, prepend=True)]
        if mlp_out is not None:
            handles.append(
                self.mlp_out.register_forward_hook(lambda m, a, o: mlp_out, prepend=True)
            )
        try:
            with self._attention_returns(lambda: self.o_proj(zeros)):
                return _hidden(self.layer(x))
        finally:
            for handle in handles:
                handle.remove()

    # ------------------------------------------------------------------ suffixes
    def prefix_keys_values(
        self, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the attention keeps (B, H_kv, P, d) of the prefix whose key/value projection
        outputs (the sites ``attn.hook_k``/``attn.hook_v``) are ``past_k``/``past_v``
        (B, P, H_kv, d) at positions 0..P−1: the layer's attention runs on them (its other
        inputs are zeros) up to its cache update, with every site silent.

        The last answer is kept while the same tensors come again (same memory, shape, strides
        and version, of ``past_k``/``past_v`` and of the attention's parameters and buffers;
        the tensors are held, so their memory cannot be reused meanwhile): the engines hand
        one prefix to every forward of a batch."""
        held = (past_k, past_v, *self.attn_module.parameters(), *self.attn_module.buffers())
        key = [(t.data_ptr(), t.shape, t.stride(), t._version) for t in held]
        if self._last_prefix is not None and self._last_prefix[1] == key:
            return self._last_prefix[2]
        self._last_prefix = (held, key, self._prefix_keys_values(past_k, past_v))
        return self._last_prefix[2]

    def _prefix_keys_values(self, past_k, past_v):
        B, P = past_k.shape[:2]
        kwargs = self._context(P).full()
        recorder = _Recorder()
        kwargs[self.model.family.layer_cache] = recorder
        put = {
            self._site(f"attn.hook_{x}"): (lambda _, t=t: t)
            for x, t in (("k", past_k), ("v", past_v))
        }
        zeros = past_k.new_zeros(B, P, self.model.cfg.d_model)
        with self.model.silenced(), self.model.internal_hooks(put):
            try:
                self.layer(zeros, **kwargs)
            except _Recorded:
                return recorder.keys, recorder.values
        raise UnsupportedFamilyError(
            f"{type(self.attn_module).__name__} never handed its keys/values to the cache "
            f"argument {self.model.family.layer_cache!r}"
        )

    def _suffix_kwargs(self, x, past_k, past_v, early=None, record=None) -> dict[str, Any]:
        """The layer's arguments for the suffix ``x`` (R, S, D) after the prefix of
        ``past_k``/``past_v`` (B, P, H_kv, d) and, if given, the E suffix positions whose
        kept keys/values ``early`` (a :class:`_Recorder`) holds: sliced context, prefix
        cache, causal mask. ``record`` (a :class:`_Recorder`) is the cache argument instead
        of the prefix's: it takes the suffix's own kept keys/values and stops the layer."""
        P, S = past_k.shape[1], x.shape[1]
        before = P + (0 if early is None else early.keys.shape[2])
        kwargs = self._context(before + S).suffix(before) if before else self._context(S).full()
        if before and kwargs.get("attention_mask", 0) is None and S > 1:  # sdpa, unmasked
            pos = torch.arange(before + S, device=x.device)
            kwargs["attention_mask"] = (pos[None, :] <= pos[before:, None])[None, None]
        if record is not None:
            kwargs[self.model.family.layer_cache] = record
        elif before:
            keys, values = self.prefix_keys_values(past_k, past_v) if P else (None, None)
            kwargs[self.model.family.layer_cache] = _PrefixCache(keys, values, early)
        return kwargs

    def _watch_kv(self, seen: dict[str, torch.Tensor]) -> dict[str, Callable]:
        return {self._site(f"attn.hook_{c}"): (lambda t, c=c: seen.__setitem__(c, t))
                for c in "kv"}  # fmt: skip

    def forward_suffix(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer at the S suffix positions P..P+S−1 whose residual is ``x`` (R, S, D),
        attending to the clean prefix's keys/values ``past_k``/``past_v`` (B, P, H_kv, d; the
        sites ``attn.hook_k``/``attn.hook_v``) plus the suffix (the contract of
        ``gpt.Block.forward_suffix``; R = G·B, row g·B + b continues prefix b).
        Returns ``(x_out, k, v)``: x_out (R, S, D), or (R, 1, D) when ``last_only``; k, v the
        suffix's projection outputs (R, S, H_kv, d).

        ``last_only`` runs the layer's output projection and MLP at the final position only:
        the positions before it are taken to what the attention keeps (their keys and values,
        as :meth:`prefix_keys_values`), then the layer runs on the final position against the
        prefix and them. Not while a hook is set on one of the layer's sites: a hook sees
        the whole suffix at once, as in the layer's single forward."""
        seen: dict[str, torch.Tensor] = {}
        S = x.shape[1]
        if last_only and S > 1 and not self.model.hooked(self._site("")):
            recorder = _Recorder()
            early = self._suffix_kwargs(x[:, :-1], past_k, past_v, record=recorder)
            with self.model.internal_hooks(self._watch_kv(seen)):
                try:
                    self.layer(x[:, :-1], **early)
                except _Recorded:
                    pass
            k0, v0 = seen["k"], seen["v"]
            kwargs = self._suffix_kwargs(x[:, -1:], past_k, past_v, recorder)
            with self.model.internal_hooks(self._watch_kv(seen)):
                out = _hidden(self.layer(x[:, -1:], **kwargs))
            return out, torch.cat([k0, seen["k"]], 1), torch.cat([v0, seen["v"]], 1)
        kwargs = self._suffix_kwargs(x, past_k, past_v)
        with self.model.internal_hooks(self._watch_kv(seen)):
            out = _hidden(self.layer(x, **kwargs))
        return (out[:, -1:] if last_only else out), seen["k"], seen["v"]

    def hook_resid_pre(self, x: torch.Tensor) -> torch.Tensor:
        """The site ``hook_resid_pre``'s hook (if one is set) applied to ``x``, as
        ``gpt.Block.hook_resid_pre`` (:meth:`HFAttention.z_suffix` then does not apply it)."""
        return self.model.apply_site(self._site("hook_resid_pre"), x)


class HFAttention:
    """The attention of an :class:`HFBlock` as ``gpt.Attention`` offers it to the engines:
    ``writer`` (z -> the site ``hook_attn_out``) and ``z_suffix``."""

    def __init__(self, block: HFBlock):
        self.block = block

    def writer(self, z: torch.Tensor) -> torch.Tensor:
        """What the layer adds to the residual (the site ``hook_attn_out``, before its hook)
        for head outputs ``z`` (R, S, H, d): the output projection, then Gemma's post-norm
        (the ``attn_out`` module when it is not the projection itself)."""
        b = self.block
        with b.model.silenced([b._site("attn.hook_z"), b._site("hook_attn_out")]):
            out = b.o_proj(z.flatten(-2).contiguous())
            return out if b.attn_out is b.o_proj else b.attn_out(out)

    def z_suffix(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z (R, S, H, d) at the suffix positions whose residual (after ``hook_resid_pre``)
        is ``x`` (R, S, D), as ``gpt.Attention.z_suffix``: the layer's own input norm and
        attention against the prefix, stopped at the output projection's input (the sites
        ``attn.hook_q/k/v/z`` fire). Returns ``(z, k, v)``, z at the final position only
        (R, 1, H, d) when ``last_only``."""
        b = self.block
        seen: dict[str, torch.Tensor] = {}
        kwargs = b._suffix_kwargs(x, past_k, past_v)

        def stop(z):
            seen["z"] = z
            raise _Recorded

        watch = {**b._watch_kv(seen), b._site("attn.hook_z"): stop}
        with b.model.silenced([b._site("hook_resid_pre")]), b.model.internal_hooks(watch):
            try:
                b.layer(x, **kwargs)
            except _Recorded:
                pass
        z = seen["z"]
        return (z[:, -1:] if last_only else z), seen["k"], seen["v"]


def layer_arguments(layer: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A decoder layer call's arguments by name, without its first (the residual)."""
    bound = inspect.signature(layer.forward).bind(*args, **kwargs)
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = inspect.signature(layer.forward).parameters[name].kind
        named.update(value if kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    first = next(iter(inspect.signature(layer.forward).parameters))
    named.pop(first)
    return named
