"""Checkpoints: safetensors weights (never pickle) that carry their model config and vocabulary,
and the verified load every analysis goes through (DESIGN: "Checkpoints")."""

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
from headgeom.model import registry
from headgeom.model.gpt import GPT

VOCAB_KEY = "vocab.gpt2_ids"  # model id i <-> GPT-2 id vocab[i] (compacted demo vocabulary)
HEADER_KEY = "headgeom"  # canonical JSON: {"model_config": {...}, ...metadata}


def checkpoint_contents(
    model: GPT, vocab: np.ndarray, metadata: dict | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, header) of the checkpoint of ``model``: what :func:`save_checkpoint` writes;
    the file's bytes are a function of these alone."""
    tensors, storages = {}, set()
    for name, value in model.state_dict().items():
        t = value.detach().cpu().contiguous()
        # tied weights (a transformers model's lm_head and embedding) share one storage,
        # which safetensors refuses: the second name gets its own copy (same bytes). Our
        # GPTs share none, so their files are unchanged.
        if t.untyped_storage().data_ptr() in storages:
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    tensors[VOCAB_KEY] = torch.as_tensor(np.asarray(vocab, dtype=np.int64))
    # One header key: safetensors writes several keys in no fixed order, which would make
    # identical checkpoints differ in bytes.
    record = {"model_config": model.cfg.to_dict(), **(metadata or {})}
    return tensors, {HEADER_KEY: canonical_json(record).decode("utf-8")}


def save_checkpoint(
    path: str | os.PathLike, model: GPT, vocab: np.ndarray, metadata: dict | None = None
) -> None:
    """Write weights, frozen buffers and the vocabulary map; the model config rides in the
    safetensors header so a checkpoint rebuilds its own model."""
    tensors, header = checkpoint_contents(model, vocab, metadata)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def differing_contents(a: tuple[dict, dict], b: tuple[dict, dict]) -> int:
    """How many entries of two :func:`checkpoint_contents` differ in bytes: tensors (name,
    dtype, shape or raw bytes) and the header (counted as one); 0 means identical files."""
    (ta, ha), (tb, hb) = a, b
    bad = int(ha != hb) + len(set(ta) ^ set(tb))
    for name in set(ta) & set(tb):
        x, y = ta[name], tb[name]
        same = x.dtype == y.dtype and x.shape == y.shape
        bad += not (same and torch.equal(_raw(x), _raw(y)))
    return bad


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a flat uint8 tensor (a view: -0.0 and NaN payloads count)."""
    return t.reshape(-1).contiguous().view(torch.uint8)


def load_checkpoint(path: str | os.PathLike) -> tuple[GPT, np.ndarray]:
    """Rebuild the model (eval mode, fp32) and return it with its vocabulary map.

    Analyses must call :func:`load_verified` instead, which checks the manifest first.
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path}: not a readable safetensors checkpoint ({err})") from None
    if HEADER_KEY not in header or VOCAB_KEY not in tensors:
        raise ValueError(f"{path}: checkpoint lacks its {HEADER_KEY!r} header or {VOCAB_KEY}")
    vocab = tensors.pop(VOCAB_KEY).numpy()
    model = registry.build_model(json.loads(header[HEADER_KEY])["model_config"])
    model.load_state_dict(tensors, strict=True)
    return model.eval(), vocab


def load_verified(
    checkpoint: str | os.PathLike, manifest: str | os.PathLike
) -> tuple[GPT, np.ndarray, dict]:
    """Verify the checkpoint bytes against its manifest, then load. Returns the manifest too.

    An imported causal LM (architecture ``hf-causal-lm``) is rebuilt the same way, from the
    checkpoint alone: its header's model config carries the ``transformers`` config, the
    registry builds that model and the checkpoint's tensors (the import's float32 weights)
    fill it. Re-loading from the verified source instead would make every analysis depend on
    the user's files (and on dequantising a GGUF again); the manifest's source record keeps
    their hashes, and the checkpoint's hash gates what the analyses read."""
    record = load_manifest(manifest)
    if "checkpoint_file_sha256" not in record:
        raise KeyError(f"{manifest}: manifest has no field 'checkpoint_file_sha256'")
    verify_file(checkpoint, record["checkpoint_file_sha256"], manifest)
    model, vocab = load_checkpoint(checkpoint)
    return model, vocab, record
