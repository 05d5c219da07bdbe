"""The config of a GPT model (docs §4.1): sizes, initialisation, and its geometry with every
parameter of that geometry filled in.

It lives apart from ``headgeom.model.gpt`` so that the geometries, which the config asks for
their parameters, and the model, which the geometries are given to, import in one direction:
``geometries`` ← ``config`` ← ``gpt``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from headgeom.model import facts
from headgeom.model.geometries import resolve_geometry_params

#: The architecture key of ``headgeom.model.registry`` for GPT models.
ARCHITECTURE = facts.GPT


@dataclass(frozen=True)
class ModelConfig:
    # Not a field: stored GPT configs predate the multiscreen controls and carry no
    # ``architecture`` key (adding one would change every config hash and checkpoint).
    architecture: ClassVar[str] = ARCHITECTURE

    n_vocab: int
    n_ctx: int
    n_layer: int
    n_head: int
    d_model: int
    d_head: int
    d_mlp: int
    geometry: str = "learned"
    ln_eps: float = 1e-5
    init_std: float = 0.02
    # [UNSPECIFIED → CHOICE] docs §4.2: position embeddings ~ N(0, 0.01²).
    pos_init_std: float = 0.01
    # Parameters and labelled choices of the geometry (write scale, basis family, block-reader
    # init, ...; see ``headgeom.model.geometries``). Missing entries are filled with the geometry's
    # defaults on construction, so a stored or hashed config states every one of them.
    geometry_params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "geometry_params", resolve_geometry_params(self))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown model config keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)
