"""The import job: a checkpoint the user brings (``models.<m>.import``) written as a whole
run, where training writes a trained one (``training.job``): the converted checkpoint, its
manifest with an ``import`` block, and a one-row run log with the validation loss measured
as training measures it. The conversions themselves are ``headgeom.model.importing``'s (GPT-2
formats) and ``headgeom.model.causal_import``'s (any registered causal LM, kept as itself)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from headgeom import results
from headgeom.hashing import content_hash, sha256_file, source_freeze
from headgeom.model import causal_import
from headgeom.model.checkpoint import save_checkpoint
from headgeom.model.import_errors import ModelImportError
from headgeom.model.importing import CAUSAL_LM_FORMATS, import_model
from headgeom.runtime import environment
from headgeom.training.loop import validation_loss


def import_run(
    run: dict[str, Any],
    checkpoint: str | os.PathLike,
    val_ids: np.ndarray | None,
    n_ctx: int,
    batch_size: int,
) -> tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]:
    """Import ``run["import"]`` (format, path, allow_pickle), write the checkpoint and return
    (manifest, run-log frame, run-log metadata).

    ``run`` is the study's import run config (``Study.import_config``). The manifest is a
    checkpoint manifest (docs §2.3) with ``step`` 0, no training data and an ``import``
    block: format, path, conversion version and the SHA-256 of every imported file. The
    validation loss is measured on ``val_ids`` (GPT-2 ids: the study's validation file)
    in windows of ``n_ctx`` tokens, as training measures it; None leaves it null.
    The run log is the train log's shape with one row (step 0: nothing was trained)."""
    spec = run["import"]
    where = spec.get("path") or f"{spec.get('repo_id')}@{spec.get('revision')}"
    if spec["format"] in CAUSAL_LM_FORMATS:
        model, vocab, record, tokenizer = causal_import.import_causal_lm(spec)
        sizes = {k: v for k, v in model.cfg.to_dict().items() if k != "hf_config"}
        expected = {k: v for k, v in run["model"].items() if k != "hf_config"}
        context = causal_import.context_length(model.cfg.to_dict())
        # the validation text in the model's own ids (None without a tokenizer)
        if val_ids is not None:
            val_ids = None if tokenizer is None else causal_import.retokenize(val_ids, tokenizer)
    else:
        model, vocab, record = import_model(
            spec["format"], spec["path"], bool(spec.get("allow_pickle", False))
        )
        sizes, expected, context = model.cfg.to_dict(), run["model"], model.cfg.n_ctx
    if sizes != expected:
        raise ModelImportError(
            f"{where}: the files give model {sizes} but the study read {expected}; they "
            "changed since the workflow started (rerun)"
        )
    if context is not None and n_ctx > context:
        raise ModelImportError(
            f"{where}: context length (n_positions / n_ctx / max_position_embeddings) "
            f"{context} < the study's n_ctx {n_ctx}"
        )
    val = None if val_ids is None else validation_loss(model, val_ids, n_ctx, batch_size)
    imported = {
        "format": record["format"],
        "path": where,
        "allow_pickle": bool(spec.get("allow_pickle", False)),
        "pickle": record["pickle"],
        "conversion_version": record["conversion_version"],
        "files_sha256": record["files_sha256"],
        # format-specific: hf_config (hf-gpt2); tl_config, assumed, dropped_buffers (tl-gpt2);
        # source, the source record (causal-LM formats: hashes, family, conversion, versions)
        **{
            k: v
            for k, v in record.items()
            if k not in ("format", "conversion_version", "files_sha256", "pickle")
        },
    }
    save_checkpoint(checkpoint, model, vocab, {"import": imported})
    config_id = run.get("repository_name") or f"{run['model_name']}-s{run['seed']}"
    source, env = source_freeze(), environment()
    manifest = {
        "record_type": "checkpoint_manifest",
        "config_id": config_id,
        "model_name": run["model_name"],
        "display_name": run.get("display_name", run["model_name"]),
        "config_hash": content_hash(run),
        "config": run,
        "init_seed": int(run["seed"]),
        "data": None,  # nothing was trained here
        "basis_family_hash": None,
        "import": imported,
        "source": source,
        "environment": env,
        "training_runtime": None,
        "step": 0,
        "tokens_seen": 0,
        "n_trainable_params": model.n_params(),
        "val_loss_nats": val,
        "checkpoint_file_sha256": sha256_file(checkpoint),
        "train_log_sha256": None,
        "corpus_manifest_sha256": None,
    }
    log = pd.DataFrame(
        {
            "step": [0],
            "tokens": [0],
            "loss": [val],
            "lr": [0.0],
            "grad_norm": [None],
            "seconds": [0.0],
            "val_loss": [val],
        }  # fmt: skip
    ).astype({"grad_norm": "float64", "loss": "float64", "val_loss": "float64"})
    metadata = {
        "config": run,
        "config_hash": manifest["config_hash"],
        "model_name": run["model_name"],
        "config_id": config_id,
        "seed": int(run["seed"]),
        "n_params": model.n_params(),
        "val_loss_nats": val,
        "import": imported,
        results.CHECKPOINT_SHA256: manifest["checkpoint_file_sha256"],
        results.SOURCE_FREEZE: source,
        "environment": env,
    }
    return manifest, log, metadata
