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
from headgeom.model.checkpoint import HEADER_KEY as GPT_HEADER_KEY
from headgeom.model.checkpoint import VOCAB_KEY, load_verified
from headgeom.model.config import ModelConfig
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.hub import HubSAMoE, HubSource, dense_state, empty_model
from headgeom.samoe.model import MoEModel

HEADER_KEY = "headgeom.samoe"


def _source_record(model: MoEModel) -> dict:
    """What rebuilds ``model``'s dense shapes: the workspace GPT's config or the Hub source."""
    if isinstance(model, HubSAMoE):
        return {"hub": model.source.to_dict()}
    return {"model_config": model.cfg.to_dict()}


def _save(path: str | os.PathLike, state: dict, vocab: np.ndarray, record: dict) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    tensors[VOCAB_KEY] = torch.as_tensor(np.asarray(vocab, dtype=np.int64))
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={HEADER_KEY: canonical_json(record).decode()})


def save_moe(
    path: str | os.PathLike, model: MoEModel, vocab: np.ndarray, metadata: dict | None = None
) -> None:
    """Write ``model``'s state dict, the vocabulary map and the header (atomically)."""
    record = {**_source_record(model), "moe": model.moe_cfg.to_dict(),
              "variant": model.variant, **(metadata or {})}  # fmt: skip
    _save(path, model.state_dict(), vocab, record)


def save_hub_dense(
    path: str | os.PathLike, lm: torch.nn.Module, source: HubSource, metadata: dict | None = None
) -> None:
    """A Hub dense source as the upcycler reads it: its state dict (tied head left out), the
    identity vocabulary map (Hub token ids are the model's own) and ``{"hub": source}``."""
    vocab = np.arange(lm.config.vocab_size, dtype=np.int64)
    _save(path, dense_state(lm), vocab, {"hub": source.to_dict(), **(metadata or {})})


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
    header, _ = _metadata(path)
    for key in (HEADER_KEY, GPT_HEADER_KEY):
        if key in header:
            return json.loads(header[key])
    raise ValueError(f"{path}: checkpoint has no header record")


def load_moe(path: str | os.PathLike) -> tuple[MoEModel, np.ndarray, dict]:
    """(model in eval mode, vocabulary map, header record) of an SA-MoE checkpoint."""
    path = Path(path)
    header, tensors = _metadata(path, tensors=True)
    if HEADER_KEY not in header or VOCAB_KEY not in tensors:
        raise ValueError(f"{path}: not an SA-MoE checkpoint (no {HEADER_KEY!r} header or "
                         f"{VOCAB_KEY})")  # fmt: skip
    record = json.loads(header[HEADER_KEY])
    vocab = tensors.pop(VOCAB_KEY).numpy()
    moe = MoEConfig.from_dict(record["moe"])
    if "hub" in record:
        source = HubSource.from_dict(record["hub"])
    else:
        source = ModelConfig.from_dict(record["model_config"])
    model = empty_model(source, moe, record["variant"])
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval(), vocab, record


def load_verified_moe(
    checkpoint: str | os.PathLike, manifest: str | os.PathLike
) -> tuple[MoEModel, np.ndarray, dict]:
    """Verify the checkpoint bytes against its run manifest, then load; (model, vocab,
    manifest record)."""
    record = load_manifest(manifest)
    if "checkpoint_file_sha256" not in record:
        raise KeyError(f"{manifest}: manifest has no field 'checkpoint_file_sha256'")
    verify_file(checkpoint, record["checkpoint_file_sha256"], manifest)
    model, vocab, _ = load_moe(checkpoint)
    return model, vocab, record


def load_verified_dense(
    checkpoint: str | os.PathLike, manifest: str | os.PathLike
) -> tuple[dict[str, torch.Tensor], ModelConfig | HubSource, np.ndarray]:
    """(state dict, its source — the workspace GPT's config or the Hub source —, vocabulary
    map) of a dense checkpoint, its bytes verified against its manifest first."""
    record = load_manifest(manifest)
    header, _ = _metadata(checkpoint)
    if HEADER_KEY not in header:  # a workspace GPT (samoe_dense)
        dense, vocab, _ = load_verified(checkpoint, manifest)
        return dense.state_dict(), dense.cfg, vocab
    verify_file(checkpoint, record["checkpoint_file_sha256"], manifest)
    _, tensors = _metadata(checkpoint, tensors=True)
    vocab = tensors.pop(VOCAB_KEY).numpy()
    return tensors, HubSource.from_dict(json.loads(header[HEADER_KEY])["hub"]), vocab
