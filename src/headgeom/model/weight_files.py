"""The weight files of a ``transformers`` model directory, and the refusal of pickle: loading a
pickle can execute arbitrary code, so ``pytorch_model.bin`` is read only when the user opts in
(``import.allow_pickle``). Shared by the GPT-2 import (``headgeom.model.importing``) and the
model sources of any causal LM (``headgeom.model.sources``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from headgeom.model.import_errors import ModelImportError


def weight_files(directory: str | os.PathLike, allow_pickle: bool = False) -> list[Path]:
    """The weight files of a model directory: safetensors (one file or the index's shards),
    else — only with ``allow_pickle`` — ``pytorch_model.bin``."""
    root = Path(directory)
    if (root / "model.safetensors").exists():
        return [root / "model.safetensors"]
    index = root / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        absent = [s for s in shards if not (root / s).exists()]
        if absent:
            raise ModelImportError(f"{index}: names shards that are missing: {absent}")
        return [index, *(root / s for s in shards)]
    if (root / "pytorch_model.bin").exists():
        if not allow_pickle:
            raise ModelImportError(
                f"{root}: only pickle weights (pytorch_model.bin); refused because loading a "
                "pickle can execute arbitrary code. Convert them to model.safetensors, or opt "
                "in with import.allow_pickle: true if you trust the file"
            )
        return [root / "pytorch_model.bin"]
    raise ModelImportError(f"{root}: no model.safetensors (nor model.safetensors.index.json)")
