"""The checkpoint manifest (docs §2.3): the record, one per saved checkpoint, that binds
its weights to the run config, the corpus, the source and the environment, and that every
analysis verifies before it reads weights.

``checkpoint_manifest`` builds every manifest: the intermediate ones while training runs
(their train log does not exist yet, so ``train_log_sha256`` is null) and the final one,
which ``final_manifest`` writes only after checking that the checkpoint, the train log, the
run config and the corpus manifest come from the same training run, and with check C6. The
hashing primitives (canonical JSON, file SHA-256, manifest identity) are in
``headgeom.hashing``.
"""

from __future__ import annotations

import json
import os

import torch

from headgeom import checks
from headgeom.hashing import content_hash, load_manifest, manifest_hash, sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, read_table
from headgeom.model import registry
from headgeom.model.checkpoint import load_checkpoint
from headgeom.model.frozen import check_frozen_buffers
from headgeom.paths import rerun_hint
from headgeom.run_config import RunConfig

# Corpus-manifest fields copied into ``data`` when present (names as in docs §2.3).
DATASET_FIELDS = ("dataset_config", "dataset_revision", "dataset_split", "source_files")

# Train-log file metadata the final manifest is built from (written by heads/stages/train.py).
LOG_METADATA = (
    "config_hash",
    "corpus_manifest_sha256",
    "checkpoint_sha256",
    "val_loss_nats",
    "source_freeze",
    "environment",
    "device",
    "precision",
    "threads",
)


class LineageError(RuntimeError):
    """The inputs do not come from the same training run."""


def data_record(corpus: dict, data_seed: int) -> dict:
    """The ``data`` block of docs §2.3 from the corpus manifest of the model's corpus.
    ``corpus`` names it (R, S, or the study's single corpus); ``corpus_sha256`` and
    ``val_sha256`` hash the token bytes (little-endian uint16, as corpus_R.bin would be);
    ``files_sha256`` hashes the Parquet files as stored; ``sampling`` is how training drew
    from it (with_replacement or read_once)."""
    source = corpus.get("dataset", corpus["config"]["source"])
    data = {
        "dataset": "embedded-demo" if source == "embedded" else source,
        "corpus": corpus.get("corpus", corpus["config"].get("name")),
        "sampling": corpus.get("sampling", "with_replacement"),
        "tokenizer": corpus["tokenizer"]["name"],
        "tokenizer_files_sha256": corpus["tokenizer"]["files_sha256"],
        "corpus_sha256": corpus["train_sha256"],
        "corpus_num_tokens": corpus["n_train_tokens"],
        "val_sha256": corpus["val_sha256"],
        "val_num_tokens": corpus["n_val_tokens"],
        "vocab_sha256": corpus["vocab_sha256"],
        "vocab_size": corpus["vocab_size"],
        "files_sha256": corpus["files"],
        "corpus_config_hash": corpus["config_hash"],
        "data_seed": data_seed,
    }
    data.update({k: corpus[k] for k in DATASET_FIELDS if k in corpus})
    return data


def corpus_data_record(corpus_manifest: str | os.PathLike, data_seed: int) -> dict:
    """:func:`data_record` of the corpus manifest file, naming the file when a field is missing."""
    try:
        return data_record(load_manifest(corpus_manifest), data_seed)
    except KeyError as err:
        raise ValueError(f"{corpus_manifest}: corpus manifest lacks field {err}") from None


def checkpoint_manifest(
    *,
    run: RunConfig,
    model: torch.nn.Module,
    data: dict,
    source: dict,
    environment: dict,
    runtime: dict,
    step: int,
    tokens_seen: int,
    val_loss: float,
    checkpoint_sha256: str,
    train_log_sha256: str | None,
    corpus_manifest_sha256: str,
) -> dict:
    """The checkpoint manifest (docs §2.3) of ``model`` after ``step`` updates; the one
    builder of the final manifest (:func:`final_manifest`) and of the intermediate ones
    (written while training, where ``train_log_sha256`` is null: the log comes after them)."""
    # Multiscreen configs carry no geometry_params; only GPT geometries use Kerdock bases.
    family = registry.basis_family(model.cfg)
    return {
        "record_type": "checkpoint_manifest",
        "config_id": run.config_id,
        "model_name": run.model_name,
        "display_name": run.display_name,
        "config_hash": run.config_hash,
        "config": run.raw,
        "init_seed": run.seed,
        "data": data,
        "basis_family_hash": family.family_hash if family is not None else None,  # §5.7
        "source": source,
        "environment": environment,
        "training_runtime": runtime,
        "step": step,
        "tokens_seen": tokens_seen,
        "n_trainable_params": model.n_params(),
        "val_loss_nats": val_loss,
        "checkpoint_file_sha256": checkpoint_sha256,
        "train_log_sha256": train_log_sha256,
        "corpus_manifest_sha256": corpus_manifest_sha256,
    }


def _same(what: str, path: str, recorded: str, actual: str, where: str) -> None:
    if recorded != actual:
        raise LineageError(
            f"{path}: {what} is {actual} but {where} records {recorded}; {rerun_hint(path)}"
        )


def verified_val_tokens(path: str | os.PathLike, manifest: dict) -> str:
    """SHA-256 of a validation token file; refuse one other than the file the checkpoint's
    manifest records (an imported checkpoint records no training data: any file is taken)."""
    actual = sha256_file(path)
    expected = ((manifest.get("data") or {}).get("files_sha256") or {}).get("val")
    if expected is not None and expected != actual:
        raise LineageError(
            f"{path}: SHA-256 {actual} but the checkpoint manifest records the validation "
            f"file {expected}; give the model's own corpus, or if this is it, it changed after "
            f"it was written ({rerun_hint(path)})"
        )
    return actual


def final_manifest(
    run: RunConfig,
    checkpoint: str | os.PathLike,
    train_log: str | os.PathLike,
    corpus_manifest: str | os.PathLike,
) -> dict:
    """The manifest of a run's final checkpoint, after checking that the train log was
    produced by this run config from this corpus manifest, that the checkpoint bytes are the
    ones training wrote and hold this config's model, and that the log reaches the final
    step. Any mismatch raises LineageError naming the files and both values. Check C6 (every
    frozen buffer byte-identical to the one its record regenerates) runs here too, logged
    under ``checks`` (headgeom.checks); a difference raises FrozenBufferError."""
    meta = read_parquet_metadata(train_log)  # str values as stored, others JSON
    missing = sorted(set(LOG_METADATA) - set(meta))
    if missing:
        raise LineageError(
            f"{train_log}: not a training log of headgeom.heads.stages.train (lacks {missing})"
        )
    if meta["config_hash"] != run.config_hash:
        raise LineageError(
            f"{train_log}: trained with config hash {meta['config_hash']} but "
            f"--config-json hashes to {run.config_hash}; the config changed since training "
            f"({rerun_hint(train_log)})"
        )
    corpus_hash = manifest_hash(corpus_manifest)
    where = f"training log {train_log}"
    _same("content hash", corpus_manifest, meta["corpus_manifest_sha256"], corpus_hash, where)
    checkpoint_sha = sha256_file(checkpoint)
    _same("SHA-256", checkpoint, meta["checkpoint_sha256"], checkpoint_sha, where)

    model, _ = load_checkpoint(checkpoint)
    expected_model = registry.config_from_dict(run.model_config(model.cfg.n_vocab))
    if model.cfg != expected_model:
        raise LineageError(
            f"{checkpoint}: model config {model.cfg.to_dict()} differs from the run "
            f"config's {expected_model.to_dict()}"
        )
    steps = read_table(train_log, columns=["step", "tokens"]).to_pylist()
    last = steps[-1] if steps else {"step": 0, "tokens": 0}
    if last["step"] != run.training.steps:
        raise LineageError(
            f"{train_log}: ends at step {last['step']}, config asks for {run.training.steps} steps"
        )
    residuals = check_frozen_buffers(model, checkpoint)  # C6: raises on any difference
    manifest = checkpoint_manifest(
        run=run,
        model=model,
        data=corpus_data_record(corpus_manifest, run.data_seed),
        source=json.loads(meta["source_freeze"]),
        environment=json.loads(meta["environment"]),
        runtime={
            "device": meta["device"],
            "precision": meta["precision"],
            "threads": json.loads(meta["threads"]),
        },
        step=last["step"],
        tokens_seen=last["tokens"],
        val_loss=json.loads(meta["val_loss_nats"]),
        checkpoint_sha256=checkpoint_sha,
        train_log_sha256=sha256_file(train_log),
        corpus_manifest_sha256=corpus_hash,
    )
    differing = sum(r != 0.0 for r in residuals.values())
    note = f"persistent buffers not byte-identical to their record, of {len(residuals)}"
    manifest["checks"] = checks.record("C6", differing, 0, "count", note=note)
    return manifest


# ----------------------------------------------------------------------------- edits (docs §14.5)
def edited_manifest(parent: dict, checkpoint_sha256: str, edit: dict) -> dict:
    """The manifest of a checkpoint made by editing the weights of ``parent``'s checkpoint
    (docs §14.5: never in place): the parent's run identity, a ``parent`` record (its
    checkpoint bytes, manifest content hash, config id and step), the ``edit`` as done
    (kind, layers, seeds) and the edited file's own SHA-256."""
    keep = ("model_name", "display_name", "config_hash", "config", "init_seed", "data",
            "basis_family_hash", "step", "tokens_seen", "n_trainable_params")  # fmt: skip
    return {
        "record_type": "edited_checkpoint_manifest",
        **{k: parent[k] for k in keep if k in parent},
        "config_id": f"{parent['config_id']}+{edit['name']}",
        "parent": {
            "checkpoint_file_sha256": parent["checkpoint_file_sha256"],
            "manifest_content_hash": content_hash(dict(parent)),
            "config_id": parent["config_id"],
            "step": parent.get("step"),
        },
        "edit": edit,
        "source": source_freeze(),
        "checkpoint_file_sha256": checkpoint_sha256,
    }
