"""What the atlas's model-side stages read: the model from its source (hash-gated, as an
:class:`~headgeom.atlas.blocks.AtlasModel`), and the inputs stage's windows and probe items
as tensors and :class:`~headgeom.atlas.probes.Skill` objects."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from headgeom.atlas import results as atlas_results
from headgeom.atlas.blocks import AtlasModel, anatomy_of
from headgeom.atlas.model_source import load_module
from headgeom.atlas.probes import Skill
from headgeom.io import read_parquet_metadata, read_table


def load_model(spec: Mapping[str, Any], device: torch.device) -> tuple[AtlasModel, dict]:
    """(the model of a source in eval mode, float32, on ``device``; its source record).
    Any family the atlas knows is read (Gemma 4 and Gemma 3n too); others are refused before
    a weight is read. One of our checkpoints is verified and converted to GPT-2
    (:mod:`headgeom.atlas.model_source`)."""
    hf, record = load_module(spec, device, convert=True, known=anatomy_of)
    return AtlasModel(hf), record


def read_windows(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """(means windows, scored windows: corpus -> (n, T) int64 tensors, in file order; the
    file's metadata)."""
    frame = read_table(path).to_pandas()
    missing = set(atlas_results.WINDOWS.names) - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: not an atlas_windows file (no columns {sorted(missing)})")
    out: dict[str, dict[str, torch.Tensor]] = {"means": {}, "scored": {}}
    for (role, corpus), part in frame.groupby(["role", "corpus"], sort=False):
        ids = np.stack([np.asarray(x, dtype=np.int64) for x in part.sort_values("window")["ids"]])
        out[role][corpus] = torch.as_tensor(ids)
    return out["means"], out["scored"], read_parquet_metadata(path)


def read_skills(path: str | os.PathLike) -> list[Skill]:
    """The skills of an atlas_probes file, in file order."""
    frame = read_table(path).to_pandas()
    skills = []
    for name, part in frame.groupby("skill", sort=False):
        part = part.sort_values("item")
        skills.append(Skill(
            str(name),
            tuple(np.asarray(p, dtype=np.int64) for p in part["prompt"]),
            np.stack([np.asarray(c, dtype=np.int64) for c in part["candidates"]]),
            part["answer"].to_numpy(np.int64),
        ))  # fmt: skip
    return skills
