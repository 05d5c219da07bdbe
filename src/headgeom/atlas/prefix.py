"""Edited forwards that reuse the clean run's layers before the edit.

An edit at layer l changes nothing before layer l, so the edited forward need only run
layers l..L−1: :func:`clean_run` records, on one unedited forward, each decoder layer's
output, and :func:`resumed` makes layers 0..l−1 return those outputs without computing them.
Everything else is the model's **own** forward (embeddings, Gemma's per-layer inputs,
AltUp's streams, masks, rotary tables, final norm, logit softcapping): no family's code is
rewritten here, so any family the atlas knows runs the same way.

A layer may leave state for later layers in a mapping it is passed (Gemma 4's and Gemma 3n's
``shared_kv_states``: the keys and values the KV-sharing layers reuse). The clean run records,
per layer, what each mapping argument held after the call, and a resumed layer puts that
back, so a later layer that reuses the keys and values of a skipped one reads the clean ones.

A layer's cost is its own: the embeddings and the unembedding run on every forward, so an
edit at layer l costs (L − l)/L of the layers plus the rest (``benchmarks/atlas_prefix.py``
measures the ratio).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

import torch

from headgeom.atlas.blocks import AtlasModel


@dataclass
class CleanRun:
    """The unedited forward of ``ids``: its logits (B, T, V), or (B, V) when ``last_only``,
    each layer's output, and per layer the mapping arguments' contents after its call
    (argument position or name -> a copy of the mapping)."""

    ids: torch.Tensor
    last_only: bool
    logits: torch.Tensor
    outputs: list
    mappings: list[dict]


def _mappings(args: tuple, kwargs: dict) -> dict:
    found = {i: v for i, v in enumerate(args) if isinstance(v, MutableMapping)}
    found.update({k: v for k, v in kwargs.items() if isinstance(v, MutableMapping)})
    return found


@torch.no_grad()
def clean_run(model: AtlasModel, ids: torch.Tensor, last_only: bool = False) -> CleanRun:
    """The unedited forward of ``ids`` (B, T), every layer's output recorded."""
    outputs: list = [None] * model.n_layer
    mappings: list[dict] = [{} for _ in range(model.n_layer)]

    def record(index: int):
        def hook(module, args, kwargs, out):
            outputs[index] = _copy(out)  # a later layer may work on its input in place
            mappings[index] = {key: dict(m) for key, m in _mappings(args, kwargs).items()}

        return hook

    handles = [layer.register_forward_hook(record(i), with_kwargs=True)
               for i, layer in enumerate(model.layers)]  # fmt: skip
    try:
        logits = model.logits(ids, last_only=last_only)
    finally:
        for handle in handles:
            handle.remove()
    if any(o is None for o in outputs):
        raise RuntimeError("a decoder layer did not run in the model's forward")
    return CleanRun(ids, last_only, logits, outputs, mappings)


def _copy(out):
    """A layer's recorded output for a resumed call: a fresh tensor (the next layer may
    work on its input in place), tuples item by item."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_copy(o) for o in out)
    return out


@contextlib.contextmanager
def resumed(model: AtlasModel, clean: CleanRun, start: int) -> Iterator[None]:
    """For the duration, layers 0..start−1 return ``clean``'s outputs (and put back what
    they left in their mapping arguments) instead of running: a forward on ``clean.ids``
    computes layers start.. only. The forward must be on the same ids (checked by shape)."""
    if not 0 <= start <= model.n_layer:
        raise ValueError(f"start layer {start} is outside 0..{model.n_layer}")
    replaced = []

    def stand_in(index: int):
        def forward(*args, **kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            recorded = clean.outputs[index]
            first = recorded[0] if isinstance(recorded, tuple) else recorded
            if hidden.shape != first.shape:
                raise ValueError(
                    f"layer {index} resumed on input {tuple(hidden.shape)}, but the clean run "
                    f"recorded {tuple(first.shape)}: the forward is not on the clean run's ids"
                )
            live = _mappings(args, kwargs)
            for key, contents in clean.mappings[index].items():
                live[key].update(contents)
            return _copy(recorded)

        return forward

    try:
        for index in range(start):
            layer = model.layers[index]
            replaced.append((layer, layer.__dict__.get("forward")))
            layer.forward = stand_in(index)
        yield
    finally:
        for layer, own in replaced:
            if own is None:
                del layer.forward  # the class's forward again
            else:
                layer.forward = own  # an instance's own (accelerate's hooks)


@torch.no_grad()
def resumed_logits(model: AtlasModel, clean: CleanRun, start: int) -> torch.Tensor:
    """Logits of ``clean.ids`` with layers 0..start−1 taken from ``clean`` (the hooks in
    place around the call apply to layers start.. and to what follows the layers)."""
    with resumed(model, clean, start):
        return model.logits(clean.ids, last_only=clean.last_only)
