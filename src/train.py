"""Train one (model, seed) on the tokenized corpus: final and intermediate checkpoints (each
with its manifest) and the per-step training log; survives being killed at any point.

    python src/train.py --config-json '{"model_name": "learned", "seed": 42, ...}' \\
        --train-tokens train_tokens.parquet --val-tokens val_tokens.parquet \\
        --vocab vocab.parquet --corpus-manifest manifest.json --threads 1 \\
        --checkpoint s42/model.safetensors --log s42/train_log.parquet

The token and vocabulary files are verified against the SHA-256 the corpus manifest records
for them (its ``files`` map) before training; the manifest's ``sampling`` field picks the data
order (``with_replacement``, the default, or ``read_once``).

Intermediate checkpoints (``training.checkpoint_steps`` below the final step) end up in
``--checkpoint-dir`` as ``step<NNNNNN>.safetensors`` with ``step<NNNNNN>.manifest.json``.
The resumable state lives in ``--resume-dir`` (``state.safetensors``, rewritten atomically
every ``training.resume_every`` steps) together with the intermediate checkpoints written so
far; a restarted job continues from it when its run identity (config hash, corpus manifest
hash) matches and refuses otherwise. The directory is deleted once every output is written.
Outputs are the same bytes with or without interruptions (CPU, fp32), except the log's
wall-clock ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from hash_checkpoint import checkpoint_manifest, data_record
from headgeom.data.corpus import compact, read_tokens, read_vocab
from headgeom.hashing import (
    ManifestMismatchError,
    environment,
    manifest_hash,
    read_manifest_field,
    sha256_file,
    source_freeze,
    verify_file,
)
from headgeom.io import atomic_path, read_json, write_json, write_parquet
from headgeom.model.checkpoint import save_checkpoint
from headgeom.training import (
    Resume,
    build_model,
    check_resume_state,
    checkpoint_name,
    checkpoint_schedule,
    discard_partial_writes,
    parse_run_config,
    resolve_device,
    resolve_precision,
    train,
)

STATE_NAME = "state.safetensors"

LOG_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("tokens", pa.int64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("grad_norm", pa.float64()),
        ("seconds", pa.float64()),
        ("val_loss", pa.float64()),
    ]
)
LOG_DESCRIPTIONS = {
    "step": "optimizer update s (1-based; step 0 is the initialisation)",
    "tokens": "training tokens seen after this update (s * batch_size * n_ctx)",
    "loss": "training next-token cross-entropy of this update's batch, nats",
    "lr": "learning rate used by this update",
    "grad_norm": "global gradient L2 norm before clipping",
    "seconds": "wall-clock training seconds since the start at the end of this update "
    "(validation and checkpoint writes excluded; summed over restarts). The only column "
    "that differs between an interrupted-and-resumed run and an uninterrupted one",
    "val_loss": "validation cross-entropy in nats (METHODS §3.4) after this update; null "
    "except every eval_every steps, at every intermediate checkpoint step and at the "
    "final step",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="run config as a JSON object")
    p.add_argument("--train-tokens", required=True, help="train_tokens.parquet (GPT-2 ids)")
    p.add_argument("--val-tokens", required=True, help="val_tokens.parquet (GPT-2 ids)")
    p.add_argument("--vocab", required=True, help="vocab.parquet (model_id ↔ gpt2_id)")
    p.add_argument("--corpus-manifest", required=True, help="corpus manifest.json")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--checkpoint", required=True, help="output .safetensors (final step)")
    p.add_argument("--log", required=True, help="output training log .parquet")
    p.add_argument(
        "--checkpoint-dir",
        help="folder of the intermediate checkpoints (default: checkpoints/ beside --checkpoint)",
    )
    p.add_argument(
        "--resume-dir",
        help="folder of the resumable state (default: resume/ beside --checkpoint)",
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def manifest_name(step: int) -> str:
    return checkpoint_name(step).removesuffix(".safetensors") + ".manifest.json"


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = parse_run_config(json.loads(args.config_json))
    torch.set_num_threads(args.threads)
    source = source_freeze()  # the code as training starts
    env = environment()
    final = Path(args.checkpoint)
    checkpoint_dir = Path(args.checkpoint_dir or final.parent / "checkpoints")
    resume_dir = Path(args.resume_dir or final.parent / "resume")
    state_path = resume_dir / STATE_NAME

    manifest = args.corpus_manifest
    file_sha256 = read_manifest_field(manifest, "files")  # role -> SHA-256 of the file bytes
    for role, path in (
        ("train", args.train_tokens),
        ("val", args.val_tokens),
        ("vocab", args.vocab),
    ):
        verify_file(path, file_sha256[role], manifest)
    corpus = read_json(manifest)
    sampling = corpus.get("sampling", "with_replacement")
    corpus_hash = manifest_hash(manifest)
    try:
        data = data_record(corpus, run.data_seed)
    except KeyError as err:
        raise ValueError(f"{manifest}: corpus manifest lacks field {err}") from None

    device = resolve_device(args.device)
    runtime = {
        "device": str(device),
        "precision": resolve_precision(run.training.precision, device),
        "threads": args.threads,
    }
    # What a resumable state must match: the run (config) and its data (corpus manifest).
    identity = {
        "config_hash": run.config_hash,
        "corpus_manifest_sha256": corpus_hash,
        "sampling": sampling,
    }
    resume = Resume(state_path, identity, {**runtime, "source": source}, config=run.raw)
    intermediate = [
        checkpoint_dir / name
        for step in checkpoint_schedule(run.training)
        for name in (checkpoint_name(step), manifest_name(step))
    ]
    for path in (state_path, final, Path(args.log), *intermediate):
        discard_partial_writes(path)  # temporary files of writes a kill interrupted
    state = check_resume_state(resume)  # a foreign state stops the job before any data loads
    if state is not None:
        _check_staged(resume_dir, state)
    elif resume_dir.exists():
        shutil.rmtree(resume_dir)  # leftovers of a run killed before its first state

    vocab = read_vocab(args.vocab)
    # uint16 holds any GPT-2-sized vocabulary: corpus S stays 2 bytes per token in memory.
    id_dtype = np.uint16 if len(vocab) <= 1 << 16 else np.int32
    train_ids = compact(read_tokens(args.train_tokens), vocab, dtype=id_dtype)
    val_ids = compact(read_tokens(args.val_tokens), vocab, dtype=id_dtype)

    model = build_model(run, n_vocab=len(vocab))
    print(
        f"{run.config_id}: {model.n_params():,} trainable parameters, "
        f"{len(train_ids):,} train / {len(val_ids):,} val tokens ({sampling}), "
        f"{args.threads} thread(s)",
        file=sys.stderr,
    )

    def write_intermediate(step: int, trained: torch.nn.Module, val_loss: float) -> dict:
        """Checkpoint + manifest of ``step``, staged in the resume folder until the end."""
        path = resume_dir / checkpoint_name(step)
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
        write_json(resume_dir / manifest_name(step), record)
        print(f"checkpoint step {step}: val loss {val_loss:.6f} nats", file=sys.stderr)
        return {"checkpoint_file_sha256": sha, "val_loss_nats": val_loss}

    result = train(
        model,
        train_ids,
        val_ids,
        run.training,
        data_seed=run.data_seed,
        sampling=sampling,
        progress=not args.no_progress,
        device=device,
        resume=resume,
        on_checkpoint=write_intermediate,
    )
    resumed = f", resumed after step {result.resumed_from}" if result.resumed_from else ""
    print(
        f"done: val loss {result.val_loss:.6f} nats, {run.training.steps / result.seconds:.2f} "
        f"steps/s on {result.device} ({result.precision}){resumed}",
        file=sys.stderr,
    )

    model.cpu()
    save_checkpoint(final, model, vocab)
    for path in intermediate:
        _publish(resume_dir / path.name, path)
    metadata = {
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
        "checkpoint_file_sha256": sha256_file(final),
        "intermediate_checkpoints": {str(k): v for k, v in result.checkpoints.items()},
        "device": result.device,
        "precision": result.precision,
        "threads": args.threads,
        "train_seconds": result.seconds,
        "source": source,
        "environment": env,
    }
    write_parquet(args.log, result.log, LOG_SCHEMA, metadata, LOG_DESCRIPTIONS)
    # The state goes first: a kill mid-cleanup then restarts from scratch (same bytes).
    state_path.unlink(missing_ok=True)
    shutil.rmtree(resume_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
