"""Check C6 on a trained checkpoint (docs §18, METHODS C6): frozen writes receive no gradient
and are unchanged after training. Every persistent buffer of a checkpoint (the frozen W_O
maps, block readers and bases, float64) must equal, byte for byte, the buffer of a model
rebuilt from the checkpoint's own model config: the basis regenerated from its record
(Kerdock ⊗ Haar family, coordinate blocks, routings), with nothing trained."""

from __future__ import annotations

import os

import torch
from torch import nn

from headgeom.model import registry


class FrozenBufferError(ValueError):
    """A checkpoint's frozen buffer differs from the one its record regenerates."""


def frozen_buffer_residuals(model: nn.Module) -> dict[str, float]:
    """Per persistent buffer of ``model``: max |stored − regenerated| (0.0 when identical),
    the regenerated model being built from ``model.cfg`` (``inf`` for a shape or dtype
    mismatch)."""
    fresh = registry.build_model(model.cfg.to_dict())
    regenerated = dict(fresh.named_buffers())
    out = {}
    for name, stored in model.named_buffers():
        if name not in model.state_dict():
            continue  # non-persistent (a cache), never saved
        other = regenerated.get(name)
        if other is None or other.shape != stored.shape or other.dtype != stored.dtype:
            out[name] = float("inf")
        elif torch.equal(stored.cpu(), other.cpu()):
            out[name] = 0.0
        else:
            out[name] = float((stored.cpu().double() - other.cpu().double()).abs().max())
    return out


def check_frozen_buffers(model: nn.Module, where: str | os.PathLike) -> dict[str, float]:
    """C6 (exact): raise :class:`FrozenBufferError` naming ``where`` and every buffer that
    differs from its regenerated value; return the residuals otherwise."""
    residuals = frozen_buffer_residuals(model)
    bad = {name: r for name, r in residuals.items() if r != 0.0}
    if bad:
        shown = ", ".join(f"{n} (max |Δ| {r:.3g})" for n, r in sorted(bad.items()))
        raise FrozenBufferError(
            f"{where}: check C6 failed: frozen buffers differ from the basis regenerated from "
            f"the checkpoint's record: {shown}"
        )
    return residuals
