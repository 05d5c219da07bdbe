"""Exact resume of heads/stages/train.py (the acceptance test of docs §7.3): a training job
SIGKILLed at a random point and restarted writes a final checkpoint with the SHA-256 of an
uninterrupted run, the same intermediate checkpoints and the same training log except
wall-clock seconds; a state from another config is refused."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom.data.corpus import compact, read_tokens, read_vocab, token_bytes_sha256, vocab_sha256
from headgeom.hashing import sha256_file
from headgeom.heads.stages import train as train_script
from headgeom.io import read_json, write_manifest, write_parquet
from headgeom.model.checkpoint import load_checkpoint, save_checkpoint
from headgeom.run_config import parse_run_config
from headgeom.training.loop import initial_model, validation_loss
from headgeom.training.state import ResumeMismatchError, read_resume_record

#: training runs in subprocesses (SIGKILLed and restarted): the e2e tier
pytestmark = pytest.mark.e2e
#: The library's folder: the subprocess imports the stage from it.
SRC = Path(__file__).resolve().parents[2] / "src"


SEED = 20240604  # the kill points
CORPUS = {"source": "embedded", "seed": 7, "n_train_tokens": 20_000, "n_val_tokens": 1_200}
CONFIG = {
    "model_name": "write-common-axis",
    "seed": 1,
    "data_seed": 1729,
    "model": {
        "n_ctx": 32,
        "n_layer": 2,
        "n_head": 2,
        "d_model": 16,
        "d_head": 8,
        "d_mlp": 32,
        "geometry": "write-common-axis",
    },
    "training": {
        "steps": 240,
        "batch_size": 4,
        "lr_max": 3e-3,
        "lr_min": 3e-4,
        "warmup_steps": 10,
        "schedule": "cosine",
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "grad_clip": 1.0,
        "eval_every": 100,
        "eval_batch_size": 8,
        "checkpoint_steps": [0, 16, 64, 1024],
        "resume_every": 7,
    },
}
INTERMEDIATE = (0, 16, 64)  # 1024 is past the run: clipped
FILES = {"train": "train_tokens.parquet", "val": "val_tokens.parquet", "vocab": "vocab.parquet"}


def write_corpus(d: Path, train: np.ndarray, val: np.ndarray, **manifest_fields) -> Path:
    """Token files, vocabulary and corpus manifest as heads/stages/tokenize_corpus.py lays them out
    (written with the project's Parquet writer; no tokenizer needed)."""
    d.mkdir(parents=True, exist_ok=True)
    token_schema = pa.schema([("token", pa.uint16())])
    for name, ids in (("train", train), ("val", val)):
        table = pa.table({"token": pa.array(ids.astype(np.uint16), type=pa.uint16())})
        write_parquet(d / f"{name}_tokens.parquet", table, token_schema)
    vocab = np.unique(np.concatenate([train, val])).astype(np.int64)
    vocab_schema = pa.schema(
        [("model_id", pa.int32()), ("gpt2_id", pa.int32()), ("text", pa.string())]
    )
    vocab_table = pa.table(
        {
            "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
            "gpt2_id": pa.array(vocab.astype(np.int32)),
            "text": pa.array([f"<{i}>" for i in vocab]),
        }
    )
    write_parquet(d / "vocab.parquet", vocab_table, vocab_schema)
    files = {r: d / f for r, f in FILES.items()}
    manifest = {
        "record_type": "corpus_manifest",
        "dataset": "synthetic-test",
        "corpus": "T",
        "config": {"source": "synthetic", "name": "T"},
        "config_hash": "0" * 64,
        "tokenizer": {"name": "gpt2", "files_sha256": {}},
        "n_train_tokens": len(train),
        "n_val_tokens": len(val),
        "train_sha256": token_bytes_sha256(train),
        "val_sha256": token_bytes_sha256(val),
        "vocab_sha256": vocab_sha256(vocab),
        "vocab_size": len(vocab),
        "files": {role: sha256_file(path) for role, path in files.items()},
        **manifest_fields,
    }
    write_manifest(d / "corpus.json", manifest)
    return d


def markov_tokens(n: int, seed: int) -> np.ndarray:
    """A learnable stream over 48 GPT-2 ids: each token mostly follows from the previous."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    jumps = rng.random(n) < 0.2
    noise = rng.integers(0, 48, n)
    for i in range(1, n):
        out[i] = noise[i] if jumps[i] else (3 * out[i - 1] + 1) % 48
    return out + 100


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    return write_corpus(d, markov_tokens(20_000, 1), markov_tokens(1_200, 2))


def _args(corpus: Path, out: Path, config: dict = CONFIG) -> list[str]:
    return [
        *("--config-json", json.dumps(config)),
        *("--train-tokens", str(corpus / "train_tokens.parquet")),
        *("--val-tokens", str(corpus / "val_tokens.parquet")),
        *("--vocab", str(corpus / "vocab.parquet")),
        *("--corpus-manifest", str(corpus / "corpus.json")),
        *("--threads", "1"),
        *("--checkpoint", str(out / "model.safetensors")),
        *("--log", str(out / "train_log.parquet")),
        "--no-progress",
    ]


def _start(corpus: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-m", "headgeom.heads.stages.train", *_args(corpus, out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _start_until(corpus: Path, out: Path, target: int) -> subprocess.Popen:
    """A training subprocess, returned once its resumable state has passed step ``target``."""
    proc = _start(corpus, out)
    deadline = time.monotonic() + 120
    while (step := _state_step(out)) is None or step < target:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "training made no progress"
        time.sleep(0.005)
    return proc


def _state_step(out: Path) -> int | None:
    try:
        return read_resume_record(out / "resume" / "state.safetensors")["step"]
    except (ResumeMismatchError, FileNotFoundError):
        return None


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The uninterrupted run (in this process: same code, one thread, same bytes)."""
    out = tmp_path_factory.mktemp("reference")
    assert train_script.main(_args(corpus, out)) == 0
    return out


def _assert_same_run(out: Path, ref: Path) -> None:
    assert sha256_file(out / "model.safetensors") == sha256_file(ref / "model.safetensors")
    for step in INTERMEDIATE:
        name = f"step{step:06d}"
        got, want = out / "checkpoints", ref / "checkpoints"
        assert (got / f"{name}.safetensors").read_bytes() == (
            want / f"{name}.safetensors"
        ).read_bytes()
        m_got, m_want = (
            read_json(got / f"{name}.manifest.json"),
            read_json(want / f"{name}.manifest.json"),
        )
        for m in (m_got, m_want):  # the code version may change under a shared checkout
            m.pop("source")
            # torch sets its inter-op pool once per process: the in-process reference keeps
            # the test process's
            m["environment"]["machine"].pop("inter_op_threads")
        assert m_got == m_want
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == sorted(
        p.name for p in (ref / "checkpoints").iterdir()
    )
    got, want = pq.read_table(out / "train_log.parquet"), pq.read_table(ref / "train_log.parquet")
    assert got.schema.equals(want.schema, check_metadata=False)
    for column in got.column_names:
        if column != "seconds":
            assert got.column(column).equals(want.column(column)), column
    meta_got, meta_want = got.schema.metadata, want.schema.metadata
    volatile = {b"train_seconds", b"source_freeze", b"metadata_sha256"}  # the digest of both
    assert {k: v for k, v in meta_got.items() if k not in volatile} == {
        k: v for k, v in meta_want.items() if k not in volatile
    }
    assert not (out / "resume").exists()  # deleted once every output is written


def test_reference_run_outputs(reference, corpus):
    """Checkpoint files and manifests of the uninterrupted run, checked independently."""
    run = parse_run_config(CONFIG)
    vocab = read_vocab(corpus / "vocab.parquet")
    val = compact(read_tokens(corpus / "val_tokens.parquet"), vocab)
    log = pq.read_table(reference / "train_log.parquet").to_pandas()
    names = sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert names == [
        f"step{s:06d}.{ext}" for s in INTERMEDIATE for ext in ("manifest.json", "safetensors")
    ]
    # docs §7.3: the step-0 checkpoint is the initialisation, regenerated to the byte.
    regenerated = reference / "regenerated.safetensors"
    save_checkpoint(regenerated, initial_model(run, n_vocab=len(vocab)), vocab)
    step0 = reference / "checkpoints" / "step000000.safetensors"
    assert step0.read_bytes() == regenerated.read_bytes()
    for step in INTERMEDIATE:
        path = reference / "checkpoints" / f"step{step:06d}.safetensors"
        manifest = read_json(path.with_name(f"step{step:06d}.manifest.json"))
        assert manifest["step"] == step and manifest["config_hash"] == run.config_hash
        assert manifest["tokens_seen"] == step * 4 * 32
        assert manifest["checkpoint_file_sha256"] == sha256_file(path)
        assert manifest["train_log_sha256"] is None
        model, _ = load_checkpoint(path)
        assert manifest["val_loss_nats"] == pytest.approx(validation_loss(model, val, 32, 5))
        if step:
            assert log.loc[log["step"] == step, "val_loss"].item() == manifest["val_loss_nats"]
    assert log.loc[log["val_loss"].notna(), "step"].tolist() == [16, 64, 100, 200, 240]
    assert log["step"].tolist() == list(range(1, 241))


def test_sigkill_at_a_random_step_then_restart_gives_the_same_bytes(reference, corpus, tmp_path):
    """Kill once the run has passed a random step (seeded), refuse a changed config on the
    state it left, then restart: every output equals the uninterrupted run's."""
    out = tmp_path / "run"
    target = random.Random(SEED).randrange(8, 230)
    proc = _start_until(corpus, out, target)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _state_step(out)
    assert target <= killed_at < 240
    assert not (out / "model.safetensors").exists()

    # A kill inside an atomic write leaves only a temporary file; it must not matter.
    (out / "resume" / ".state.safetensors.garbage.tmp").write_bytes(b"\0" * 100)

    changed = json.loads(json.dumps(CONFIG))
    changed["training"]["lr_max"] = 2e-3
    with pytest.raises(ResumeMismatchError) as err:
        train_script.main(_args(corpus, out, changed))
    message = str(err.value)
    assert "config_hash" in message and parse_run_config(changed).config_hash in message
    assert parse_run_config(CONFIG).config_hash in message and "delete" in message
    assert "training.lr_max: 0.003 -> 0.002" in message
    assert _state_step(out) == killed_at  # the refusal touched nothing

    assert train_script.main(_args(corpus, out)) == 0
    _assert_same_run(out, reference)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=lambda s: s.name)
def test_a_preemption_signal_stops_at_a_step_and_the_rerun_redoes_none(
    sig, reference, corpus, tmp_path, capsys
):
    """A cluster's warning signal mid-run: the job ends with status 75 (EX_TEMPFAIL) after
    the update in flight with its state written at that update, no final output exists, and
    the rerun starts after that very update (no update redone) and gives the same bytes."""
    out = tmp_path / "run"
    target = random.Random(SEED + sig).randrange(8, 200)
    proc = _start_until(corpus, out, target)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 75, err
    stopped = int(re.search(rf"{sig.name} received: stopped after step (\d+)", err)[1])
    assert target <= stopped < 240
    assert _state_step(out) == stopped  # the state is the update the signal interrupted
    assert not (out / "model.safetensors").exists() and not (out / "train_log.parquet").exists()
    capsys.readouterr()
    assert train_script.main(_args(corpus, out)) == 0
    assert f"after step {stopped}" in capsys.readouterr().err  # continues from it: 0 redone
    _assert_same_run(out, reference)


@pytest.mark.slow
def test_repeated_sigkills_at_random_times(reference, corpus, tmp_path):
    """Kills at uniformly random times over a whole run (start-up, step-0 checkpoint, state
    writes, final outputs included), restarting each time, until the job completes."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = _start(corpus, out)
    assert proc.wait() == 0
    duration = time.monotonic() - t0
    for child in out.iterdir():  # start over, kept nothing
        if child.is_dir():
            for f in child.iterdir():
                f.unlink()
            child.rmdir()
        else:
            child.unlink()
    rng = random.Random(SEED)
    kills = []
    while True:
        proc = _start(corpus, out)
        try:
            proc.wait(timeout=rng.uniform(0.0, duration))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(_state_step(out))
            continue
        assert proc.returncode == 0, proc.stderr.read().decode()
        break
    print(f"killed after state steps {kills}")
    assert kills
    _assert_same_run(out, reference)


def test_a_corrupt_state_is_refused_with_its_path(corpus, tmp_path):
    out = tmp_path / "run"
    (out / "resume").mkdir(parents=True)
    state = out / "resume" / "state.safetensors"
    state.write_bytes(b"not a safetensors file")
    with pytest.raises(ResumeMismatchError, match="state.safetensors: not a resumable"):
        train_script.main(_args(corpus, out))
    assert not (out / "model.safetensors").exists()


def test_cuda_is_not_silently_replaced_by_cpu(corpus, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for machines without it")
    with pytest.raises(ValueError, match="no CUDA device"):
        train_script.main([*_args(corpus, tmp_path), "--device", "cuda"])


def test_read_once_corpus_too_small_is_refused_before_training(tmp_path):
    d = write_corpus(
        tmp_path / "c", markov_tokens(20_000, 1), markov_tokens(1_200, 2), sampling="read_once"
    )
    with pytest.raises(ValueError, match=r"read_once sampling needs .* = 30,721"):
        train_script.main(_args(d, tmp_path / "out"))  # 240 × 4 × 32 + 1 > 20,000 tokens
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_read_once_run_reads_the_corpus_in_order(tmp_path):
    """A corpus of exactly steps × batch × n_ctx + 1 tokens is enough, read once, in order:
    the run's first loss is the untrained model's loss on the first window block."""
    config = json.loads(json.dumps(CONFIG))
    config["training"].update(
        steps=6, warmup_steps=2, eval_every=3, checkpoint_steps=[0], resume_every=2
    )
    n = 6 * 4 * 32 + 1
    d = write_corpus(
        tmp_path / "c", markov_tokens(n, 3), markov_tokens(200, 2), sampling="read_once"
    )
    out = tmp_path / "out"
    assert train_script.main(_args(d, out, config)) == 0
    vocab = read_vocab(d / "vocab.parquet")
    ids = torch.as_tensor(compact(read_tokens(d / "train_tokens.parquet"), vocab))
    model, _ = load_checkpoint(out / "checkpoints" / "step000000.safetensors")
    with torch.no_grad():
        logits = model.train()(ids[:128].view(4, 32))
    first = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[1:129])
    log = pq.read_table(out / "train_log.parquet").to_pandas()
    assert log["loss"].iloc[0] == pytest.approx(first.item(), rel=1e-6)
    assert pq.read_schema(out / "train_log.parquet").metadata[b"sampling"] == b"read_once"
