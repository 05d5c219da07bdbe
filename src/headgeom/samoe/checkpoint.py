"""SA-MoE checkpoints: safetensors weights (never pickle) with the vocabulary map and one
canonical-JSON header holding the model config, the MoE config and the variant, so a file
rebuilds its own model; and the verified load every SA-MoE analysis goes through (the bytes
against the run manifest's SHA-256 first, as ``headgeom.model.checkpoint.load_verified``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from headgeom.hashing import canonical_json, load_manifest, verify_file
from headgeom.io import atomic_path
from headgeom.model.checkpoint import VOCAB_KEY
from headgeom.model.config import ModelConfig
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.model import SAMoE

HEADER_KEY = "headgeom.samoe"


def save_moe(
    path: str | os.PathLike, model: SAMoE, vocab: np.ndarray, metadata: dict | None = None
) -> None:
    """Write ``model``'s state dict, the vocabulary map and the header (atomically)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors[VOCAB_KEY] = torch.as_tensor(np.asarray(vocab, dtype=np.int64))
    record = {"model_config": model.cfg.to_dict(), "moe": model.moe_cfg.to_dict(),
              "variant": model.variant, **(metadata or {})}  # fmt: skip
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={HEADER_KEY: canonical_json(record).decode()})


def _metadata(path: str | os.PathLike, tensors: bool = False) -> tuple[dict, dict | None]:
    """(safetensors metadata, the tensors when asked) of a checkpoint; ValueError naming the
    file when it is not a readable safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        return header, (load_file(str(path)) if tensors else None)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path}: not a readable safetensors checkpoint ({err})") from None


def checkpoint_header(path: str | os.PathLike) -> dict:
    """The header record of a workspace GPT or SA-MoE checkpoint, without loading tensors."""
    from headgeom.model.checkpoint import HEADER_KEY as GPT_HEADER_KEY

    header, _ = _metadata(path)
    for key in (HEADER_KEY, GPT_HEADER_KEY):
        if key in header:
            return json.loads(header[key])
    raise ValueError(f"{path}: checkpoint has no header record")


def load_moe(path: str | os.PathLike) -> tuple[SAMoE, np.ndarray, dict]:
    """(model in eval mode, vocabulary map, header record) of an SA-MoE checkpoint."""
    path = Path(path)
    header, tensors = _metadata(path, tensors=True)
    if HEADER_KEY not in header or VOCAB_KEY not in tensors:
        raise ValueError(f"{path}: not an SA-MoE checkpoint (no {HEADER_KEY!r} header or "
                         f"{VOCAB_KEY})")  # fmt: skip
    record = json.loads(header[HEADER_KEY])
    vocab = tensors.pop(VOCAB_KEY).numpy()
    cfg = ModelConfig.from_dict(record["model_config"])
    with torch.device("meta"):
        model = SAMoE(cfg, MoEConfig.from_dict(record["moe"]), record["variant"])
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval(), vocab, record


def load_verified_moe(
    checkpoint: str | os.PathLike, manifest: str | os.PathLike
) -> tuple[SAMoE, np.ndarray, dict]:
    """Verify the checkpoint bytes against its run manifest, then load; (model, vocab,
    manifest record)."""
    record = load_manifest(manifest)
    if "checkpoint_file_sha256" not in record:
        raise KeyError(f"{manifest}: manifest has no field 'checkpoint_file_sha256'")
    verify_file(checkpoint, record["checkpoint_file_sha256"], manifest)
    model, vocab, _ = load_moe(checkpoint)
    return model, vocab, record
