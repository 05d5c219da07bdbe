"""One (model, seed) training job as ``heads/stages/train.py`` runs it: the verified corpus in; the
final checkpoint, the intermediate checkpoints (each with its manifest) and the train log
out; survives being killed at any point.

The token and vocabulary files are verified against the SHA-256 the corpus manifest records
for them (its ``files`` map) before training; the manifest's ``sampling`` field picks the data
order (``with_replacement``, the default, or ``read_once``).

Intermediate checkpoints (``training.checkpoint_steps`` below the final step) end up in
``checkpoint_dir`` as ``step<NNNNNN>.safetensors`` with ``step<NNNNNN>.manifest.json``.
The resumable state lives in ``resume_dir`` (``state.safetensors``, rewritten atomically
every ``training.resume_every`` steps) together with the intermediate checkpoints written so
far; a restarted job continues from it when its run identity (config hash, corpus manifest
hash) matches and refuses otherwise. The folder is deleted once every output is written.
Outputs are the same bytes with or without interruptions (CPU, fp32), except the log's
wall-clock ``seconds``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from headgeom import checks, results
from headgeom.data.corpus import compact, read_tokens, read_vocab
from headgeom.hashing import (
    ManifestMismatchError,
    load_manifest,
    manifest_hash,
    read_manifest_field,
    sha256_file,
    source_freeze,
    verify_file,
)
from headgeom.io import atomic_path, write_manifest
from headgeom.manifest import checkpoint_manifest, corpus_data_record
from headgeom.model.checkpoint import checkpoint_contents, differing_contents, save_checkpoint
from headgeom.run_config import (
    RunConfig,
    checkpoint_manifest_name,
    checkpoint_name,
    checkpoint_schedule,
)
from headgeom.runtime import environment
from headgeom.training.loop import (
    TrainResult,
    initial_model,
    resolve_device,
    resolve_precision,
    train,
)
from headgeom.training.state import Resume, check_resume_state, discard_partial_writes

STATE_NAME = "state.safetensors"


@dataclass(frozen=True)
class CorpusFiles:
    """The tokenized corpus of a run and the manifest that records its files' SHA-256."""

    train: Path
    val: Path
    vocab: Path
    manifest: Path

    def __post_init__(self) -> None:
        for name in ("train", "val", "vocab", "manifest"):
            object.__setattr__(self, name, Path(getattr(self, name)))


@dataclass(frozen=True)
class JobOutputs:
    """Where a job writes: the final checkpoint, the train log, the intermediate checkpoints
    (default: ``checkpoints/`` beside the final one) and the resumable state (``resume/``)."""

    checkpoint: Path
    log: Path
    checkpoint_dir: Path
    resume_dir: Path

    @classmethod
    def beside(cls, checkpoint, log, checkpoint_dir=None, resume_dir=None) -> JobOutputs:
        final = Path(checkpoint)
        return cls(
            checkpoint=final,
            log=Path(log),
            checkpoint_dir=Path(checkpoint_dir or final.parent / "checkpoints"),
            resume_dir=Path(resume_dir or final.parent / "resume"),
        )


def _publish(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` atomically (a hard link where the file system allows one)."""
    with atomic_path(dst) as tmp:
        tmp.unlink()
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def _check_staged(resume_dir: Path, state: dict) -> None:
    """Before resuming, every intermediate checkpoint the state records must still be there
    with the bytes it had; otherwise the run cannot produce it again and must start over."""
    for step, record in state.get("checkpoints", {}).items():
        path = resume_dir / checkpoint_name(int(step))
        try:
            verify_file(path, record["checkpoint_file_sha256"], resume_dir / STATE_NAME)
        except (FileNotFoundError, ManifestMismatchError) as err:
            raise ManifestMismatchError(
                f"{err}; the resumable state needs it. Delete {resume_dir} to train from scratch"
            ) from None


def step0_regeneration(run: RunConfig, model: torch.nn.Module, vocab: np.ndarray) -> dict:
    """Check C15 (docs §7.3): the step-0 model regenerated from the seed (a second
    :func:`initial_model`) has the checkpoint bytes of ``model``, the initialisation training
    starts from and saves as step 0. Seeding then building leaves every RNG where the first
    build left it, so training continues unchanged. Raises on a difference."""
    again = initial_model(run, n_vocab=len(vocab))
    differing = differing_contents(checkpoint_contents(model, vocab),
                                   checkpoint_contents(again, vocab))  # fmt: skip
    n = len(model.state_dict()) + 2  # tensors, vocabulary map, header
    return checks.enforce("C15", differing, 0, "count", where=run.config_id,
                          what="the step-0 checkpoint regenerated from the seed differs",
                          note=f"checkpoint entries differing in bytes, of {n}")  # fmt: skip


def train_job(
    run: RunConfig,
    corpus: CorpusFiles,
    out: JobOutputs,
    *,
    threads: int,
    device: str = "auto",
    progress: bool = True,
    stop: Callable[[], str | None] | None = None,
) -> TrainResult:
    """Train ``run`` on ``corpus`` and write every output of ``out`` (see the module text).
    ``threads`` is only recorded (the caller sets torch's thread counts before any torch
    work): on CPU a different thread count can change the final bits. ``stop`` (a
    headgeom.training.preemption.StopFlag) ends the job with its state written and
    :class:`~headgeom.training.preemption.Preempted` raised; no output is written then."""
    source = source_freeze()  # the code as training starts
    env = environment()
    state_path = out.resume_dir / STATE_NAME

    manifest = corpus.manifest
    file_sha256 = read_manifest_field(manifest, "files")  # role -> SHA-256 of the file bytes
    for role, path in (("train", corpus.train), ("val", corpus.val), ("vocab", corpus.vocab)):
        verify_file(path, file_sha256[role], manifest)
    sampling = load_manifest(manifest).get("sampling", "with_replacement")
    corpus_hash = manifest_hash(manifest)
    data = corpus_data_record(manifest, run.data_seed)

    device = resolve_device(device)
    runtime = {
        "device": str(device),
        "precision": resolve_precision(run.training.precision, device),
        "threads": threads,
    }
    # What a resumable state must match: the run (config) and its data (corpus manifest).
    identity = {
        "config_hash": run.config_hash,
        "corpus_manifest_sha256": corpus_hash,
        "sampling": sampling,
    }
    resume = Resume(state_path, identity, {**runtime, "source": source}, config=run.raw)
    intermediate = [
        out.checkpoint_dir / name
        for step in checkpoint_schedule(run.training)
        for name in (checkpoint_name(step), checkpoint_manifest_name(step))
    ]
    for path in (state_path, out.checkpoint, out.log, *intermediate):
        discard_partial_writes(path)  # temporary files of writes a kill interrupted
    state = check_resume_state(resume)  # a foreign state stops the job before any data loads
    if state is not None:
        _check_staged(out.resume_dir, state)
    elif out.resume_dir.exists():
        shutil.rmtree(out.resume_dir)  # leftovers of a run killed before its first state

    vocab = read_vocab(corpus.vocab)
    # uint16 holds any GPT-2-sized vocabulary: corpus S stays 2 bytes per token in memory.
    id_dtype = np.uint16 if len(vocab) <= 1 << 16 else np.int32
    train_ids = compact(read_tokens(corpus.train), vocab, dtype=id_dtype)
    val_ids = compact(read_tokens(corpus.val), vocab, dtype=id_dtype)

    model = initial_model(run, n_vocab=len(vocab))
    c15 = step0_regeneration(run, model, vocab)
    print(
        f"{run.config_id}: {model.n_params():,} trainable parameters, "
        f"{len(train_ids):,} train / {len(val_ids):,} val tokens ({sampling}), "
        f"{threads} thread(s)",
        file=sys.stderr,
    )

    def write_intermediate(step: int, trained: torch.nn.Module, val_loss: float) -> dict:
        """Checkpoint + manifest of ``step``, staged in the resume folder until the end."""
        path = out.resume_dir / checkpoint_name(step)
        save_checkpoint(path, trained, vocab)
        sha = sha256_file(path)
        record = checkpoint_manifest(
            run=run,
            model=trained,
            data=data,
            source=source,
            environment=env,
            runtime=runtime,
            step=step,
            tokens_seen=step * run.training.batch_size * trained.cfg.n_ctx,
            val_loss=val_loss,
            checkpoint_sha256=sha,
            train_log_sha256=None,
            corpus_manifest_sha256=corpus_hash,
        )
        write_manifest(out.resume_dir / checkpoint_manifest_name(step), record)
        print(f"checkpoint step {step}: val loss {val_loss:.6f} nats", file=sys.stderr)
        return {"checkpoint_file_sha256": sha, "val_loss_nats": val_loss}

    result = train(
        model,
        train_ids,
        val_ids,
        run.training,
        data_seed=run.data_seed,
        sampling=sampling,
        progress=progress,
        device=device,
        resume=resume,
        on_checkpoint=write_intermediate,
        stop=stop,
    )
    resumed = f", resumed after step {result.resumed_from}" if result.resumed_from else ""
    print(
        f"done: val loss {result.val_loss:.6f} nats, {run.training.steps / result.seconds:.2f} "
        f"steps/s on {result.device} ({result.precision}){resumed}",
        file=sys.stderr,
    )

    model.cpu()
    save_checkpoint(out.checkpoint, model, vocab)
    for path in intermediate:
        _publish(out.resume_dir / path.name, path)
    metadata = {  # the train log's provenance; manifest.final_manifest reads LOG_METADATA
        "config": run.raw,
        "config_hash": run.config_hash,
        "model_name": run.model_name,
        "config_id": run.config_id,
        "seed": run.seed,
        "data_seed": run.data_seed,
        "sampling": sampling,
        "n_params": model.n_params(),
        "val_loss_nats": result.val_loss,
        "corpus_manifest_sha256": corpus_hash,
        results.CHECKPOINT_SHA256: sha256_file(out.checkpoint),
        "intermediate_checkpoints": {str(k): v for k, v in result.checkpoints.items()},
        "device": result.device,
        "precision": result.precision,
        "threads": threads,
        "train_seconds": result.seconds,
        results.SOURCE_FREEZE: source,
        "environment": env,
        **c15,
    }
    results.TRAIN_LOG.write(out.log, result.log, metadata)
    # The state goes first: a kill mid-cleanup then restarts from scratch (same bytes).
    state_path.unlink(missing_ok=True)
    shutil.rmtree(out.resume_dir)
    return result
