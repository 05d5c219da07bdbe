"""The train → hash_checkpoint → evaluate_clean scripts end to end on a micro corpus, and the
manifest checks that stop analyses from reading weights that changed after hashing."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from headgeom import checks
from headgeom.hashing import (
    ManifestMismatchError,
    canonical_json,
    content_hash,
    load_manifest,
    manifest_hash,
    sha256_file,
)
from headgeom.heads.stages import evaluate_clean, hash_checkpoint, make_tasks, tokenize_corpus
from headgeom.heads.stages import train as train_script
from headgeom.io import read_json, read_parquet_metadata, write_manifest, write_parquet
from headgeom.manifest import (
    LineageError,
    corpus_data_record,
    final_manifest,
    verified_val_tokens,
)
from headgeom.model.checkpoint import load_checkpoint, load_verified
from headgeom.run_config import parse_run_config
from headgeom.runtime import KERNEL_VARIABLES, machine

CORPUS = {"source": "embedded", "seed": 7, "n_train_tokens": 20_000, "n_val_tokens": 1_200}
TASK = {"seed": 11, "splits": {"discovery": 8, "validation": 4, "evaluation": 8, "holdout": 4}}
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
        "steps": 12,
        "batch_size": 4,
        "lr_max": 3e-3,
        "lr_min": 3e-4,
        "warmup_steps": 3,
        "schedule": "cosine",
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "grad_clip": 1.0,
        "eval_every": 5,
        "eval_batch_size": 8,
    },
}
CONFIG_JSON = json.dumps(CONFIG)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train_args(d: Path, **override) -> list[str]:
    paths = {
        "config-json": CONFIG_JSON,
        "train-tokens": d / "train_tokens.parquet",
        "val-tokens": d / "val_tokens.parquet",
        "vocab": d / "vocab.parquet",
        "corpus-manifest": d / "corpus.json",
        "threads": 1,
        "checkpoint": d / "model.safetensors",
        "log": d / "train_log.parquet",
        **override,
    }
    return [x for k, v in paths.items() for x in (f"--{k}", str(v))] + ["--no-progress"]


def _hash_args(d: Path, **override) -> list[str]:
    paths = {
        "config-json": CONFIG_JSON,
        "checkpoint": d / "model.safetensors",
        "train-log": d / "train_log.parquet",
        "corpus-manifest": d / "corpus.json",
        "out": d / "manifest.json",
        **override,
    }
    return [x for k, v in paths.items() for x in (f"--{k}", str(v))]


def _eval_args(d: Path, **override) -> list[str]:
    paths = {
        "checkpoint": d / "model.safetensors",
        "manifest": d / "manifest.json",
        "task": d / "sva.parquet",
        "out": d / "eval_sva.parquet",
        **override,
    }
    return [x for k, v in paths.items() for x in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Corpus, task, training, manifest and clean evaluation through the real scripts."""
    d = tmp_path_factory.mktemp("run")
    tokenize_corpus.main(
        [
            "--config-json",
            json.dumps(CORPUS),
            *("--train", str(d / "train_tokens.parquet")),
            *("--val", str(d / "val_tokens.parquet")),
            *("--vocab", str(d / "vocab.parquet")),
            *("--manifest", str(d / "corpus.json")),
        ]
    )
    make_tasks.main(
        ["--task", "sva", "--config-json", json.dumps(TASK), "--out", str(d / "sva.parquet")]
    )
    assert train_script.main(_train_args(d)) == 0
    assert hash_checkpoint.main(_hash_args(d)) == 0
    assert evaluate_clean.main(_eval_args(d)) == 0
    return d


def _flip_byte(src: Path, dst: Path, offset: int = -100) -> None:
    data = bytearray(src.read_bytes())
    data[offset] ^= 0x01
    dst.write_bytes(bytes(data))


# --------------------------------------------------------------------------- train log
def test_train_log_columns_and_metadata(run):
    log = pd.read_parquet(run / "train_log.parquet")
    steps = CONFIG["training"]["steps"]
    assert list(log.columns) == ["step", "tokens", "loss", "lr", "grad_norm", "seconds", "val_loss"]
    assert log["step"].tolist() == list(range(1, steps + 1))
    assert log.loc[log["val_loss"].notna(), "step"].tolist() == [5, 10, 12]
    schema = pq.read_schema(run / "train_log.parquet")
    assert str(schema.field("val_loss").type) == "double"
    assert b"description" in schema.field("val_loss").metadata
    meta = read_parquet_metadata(run / "train_log.parquet")
    assert meta["config_hash"] == content_hash(CONFIG)
    assert json.loads(meta["config"]) == CONFIG
    assert json.loads(meta["val_loss_nats"]) == log["val_loss"].iloc[-1]
    assert meta["corpus_manifest_sha256"] == manifest_hash(run / "corpus.json")
    assert meta["checkpoint_sha256"] == sha256_file(run / "model.safetensors")
    assert meta["model_name"] == "write-common-axis" and json.loads(meta["seed"]) == 1
    model, vocab = load_checkpoint(run / "model.safetensors")
    assert json.loads(meta["n_params"]) == model.n_params()
    c15 = checks.parse(meta)["C15"]  # the step-0 regeneration, logged in the train log
    assert c15.kind == "count" and c15.residual == 0 and c15.passed
    corpus_vocab = pq.read_table(run / "vocab.parquet").column("gpt2_id").to_numpy()
    np.testing.assert_array_equal(vocab, corpus_vocab)


def test_training_refuses_tokens_that_do_not_match_the_corpus_manifest(run, tmp_path):
    for name in ("train_tokens.parquet", "val_tokens.parquet", "vocab.parquet", "corpus.json"):
        shutil.copy(run / name, tmp_path / name)
    _flip_byte(run / "val_tokens.parquet", tmp_path / "val_tokens.parquet", offset=200)
    with pytest.raises(ManifestMismatchError) as err:
        train_script.main(_train_args(tmp_path))
    assert "val_tokens.parquet" in str(err.value)
    assert sha256_file(tmp_path / "val_tokens.parquet") in str(err.value)
    assert not (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / "train_log.parquet").exists()


# --------------------------------------------------------------------------- manifest
def test_checkpoint_manifest_fields(run):
    m = read_json(run / "manifest.json")
    assert m.pop("record_sha256") == content_hash(m)  # sealed: the rest's content hash
    corpus = read_json(run / "corpus.json")
    log = pd.read_parquet(run / "train_log.parquet")
    assert m["record_type"] == "checkpoint_manifest"
    assert m["config_id"] == "write-common-axis-s1"
    assert m["display_name"] == m["model_name"] == "write-common-axis"
    assert m["config_hash"] == content_hash(CONFIG) and m["config"] == CONFIG
    assert m["init_seed"] == 1 and m["basis_family_hash"] is None
    c6 = checks.parse(m["checks"])["C6"]  # docs §18: logged in the manifest it guards
    assert c6.kind == "count" and c6.residual == 0 and c6.passed
    assert m["data"]["dataset"] == "embedded-demo"
    assert m["data"]["corpus_sha256"] == corpus["train_sha256"]
    assert m["data"]["val_sha256"] == corpus["val_sha256"]
    assert m["data"]["vocab_sha256"] == corpus["vocab_sha256"]
    assert m["data"]["tokenizer_files_sha256"] == corpus["tokenizer"]["files_sha256"]
    assert m["data"]["corpus_num_tokens"] == CORPUS["n_train_tokens"]
    assert m["data"]["val_num_tokens"] == CORPUS["n_val_tokens"]
    assert m["data"]["data_seed"] == 1729
    assert set(m["source"]) == {"git_commit", "tracked_diff_sha256"}
    assert m["environment"]["torch"] == importlib.metadata.version("torch")
    # the machine record: what picks the kernels, so two runs' bytes can be compared
    machine = m["environment"]["machine"]
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["intra_op_threads"] == 1  # the job's --threads
    assert machine["cpu_count"] == os.cpu_count() and machine["arch"] == platform.machine()
    config = torch.__config__.show()
    for key in ("cpu", "os", "blas", "openmp"):
        assert machine[key], key
    if "MKL-DNN" in config:
        assert machine["onednn"] in config and machine["onednn"].startswith("v")
    if "Math Kernel Library" in config:
        assert machine["mkl"] in config
    assert isinstance(machine["kernel_variables"], dict)
    assert (machine["gpu"] is None) == (not torch.cuda.is_available())
    t = CONFIG["training"]
    assert m["step"] == t["steps"]
    assert m["tokens_seen"] == t["steps"] * t["batch_size"] * CONFIG["model"]["n_ctx"]
    assert m["n_trainable_params"] == load_checkpoint(run / "model.safetensors")[0].n_params()
    assert m["val_loss_nats"] == log["val_loss"].iloc[-1]  # unrounded
    assert m["checkpoint_file_sha256"] == sha256_file(run / "model.safetensors")
    assert m["train_log_sha256"] == sha256_file(run / "train_log.parquet")
    assert m["corpus_manifest_sha256"] == manifest_hash(run / "corpus.json")
    assert "manifest_sha256" not in m  # a record holds no hash of its own bytes


def test_manifest_identity_is_the_canonical_content_hash(run):
    text = (run / "manifest.json").read_text()
    assert text.endswith("}\n") and "\n  " in text  # pretty-printed copy on disk
    record = json.loads(text)
    seal = record.pop("record_sha256")  # the record's own content hash, sealed beside it
    assert manifest_hash(run / "manifest.json") == seal == content_hash(record)
    assert manifest_hash(run / "manifest.json") != sha256_file(run / "manifest.json")
    assert canonical_json(json.loads(text)) != text.encode()


def test_a_changed_value_in_a_manifest_is_refused_with_both_hashes(run, tmp_path):
    """One digit of val_loss_nats changed (still valid JSON): the seal no longer matches."""
    text = (run / "manifest.json").read_text()
    record = json.loads(text)
    loss = json.dumps(record["val_loss_nats"])
    changed = text.replace(
        f'"val_loss_nats": {loss}',
        f'"val_loss_nats": {loss[:-1]}0' if loss[-1] != "0" else f'"val_loss_nats": {loss[:-1]}1',
    )
    assert changed != text
    (tmp_path / "manifest.json").write_text(changed)
    unsealed = {k: v for k, v in json.loads(changed).items() if k != "record_sha256"}
    with pytest.raises(ManifestMismatchError) as err:
        load_verified(run / "model.safetensors", tmp_path / "manifest.json")
    message = str(err.value)
    assert str(tmp_path / "manifest.json") in message
    assert record["record_sha256"] in message and content_hash(unsealed) in message
    del record["record_sha256"]
    (tmp_path / "manifest.json").write_text(json.dumps(record))  # a hand-written record
    with pytest.raises(ManifestMismatchError, match="has no 'record_sha256' seal"):
        load_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text(text[:-9])  # truncated
    with pytest.raises(ManifestMismatchError, match="not valid JSON"):
        manifest_hash(tmp_path / "manifest.json")


def test_load_verified_catches_one_flipped_byte(run, tmp_path):
    bad = tmp_path / "model.safetensors"
    _flip_byte(run / "model.safetensors", bad)
    expected = read_json(run / "manifest.json")["checkpoint_file_sha256"]
    with pytest.raises(ManifestMismatchError) as err:
        load_verified(bad, run / "manifest.json")
    message = str(err.value)
    assert str(bad) in message and expected in message and sha256_file(bad) in message
    model, _, manifest = load_verified(run / "model.safetensors", run / "manifest.json")
    assert manifest["config_id"] == "write-common-axis-s1"


def test_hash_checkpoint_refuses_a_corrupted_checkpoint(run, tmp_path):
    _flip_byte(run / "model.safetensors", tmp_path / "model.safetensors")
    args = _hash_args(run, checkpoint=tmp_path / "model.safetensors", out=tmp_path / "m.json")
    with pytest.raises(LineageError) as err:
        hash_checkpoint.main(args)
    message = str(err.value)
    assert "model.safetensors" in message
    assert sha256_file(tmp_path / "model.safetensors") in message
    assert sha256_file(run / "model.safetensors") in message
    assert not (tmp_path / "m.json").exists()


def test_hash_checkpoint_refuses_a_changed_config(run, tmp_path):
    changed = json.loads(CONFIG_JSON)
    changed["training"]["lr_max"] = 1e-3
    args = _hash_args(run, out=tmp_path / "m.json")
    args[args.index("--config-json") + 1] = json.dumps(changed)
    with pytest.raises(LineageError) as err:
        hash_checkpoint.main(args)
    assert content_hash(CONFIG) in str(err.value) and content_hash(changed) in str(err.value)
    assert not (tmp_path / "m.json").exists()


def test_hash_checkpoint_refuses_another_corpus_manifest(run, tmp_path):
    corpus = read_json(run / "corpus.json")
    corpus["n_val_tokens"] += 1
    write_manifest(tmp_path / "corpus.json", corpus)  # another corpus, sealed
    args = _hash_args(run, **{"corpus-manifest": tmp_path / "corpus.json", "out": tmp_path / "m"})
    with pytest.raises(LineageError, match="corpus.json: content hash"):
        hash_checkpoint.main(args)
    assert not (tmp_path / "m").exists()


def test_final_manifest_is_what_hash_checkpoint_writes(run):
    got = final_manifest(
        parse_run_config(CONFIG),
        run / "model.safetensors",
        run / "train_log.parquet",
        run / "corpus.json",
    )
    assert got == load_manifest(run / "manifest.json")
    assert got["train_log_sha256"] == sha256_file(run / "train_log.parquet")


def test_final_manifest_refuses_a_log_that_stops_early_or_is_not_a_train_log(run, tmp_path):
    table = pq.read_table(run / "train_log.parquet")
    meta = read_parquet_metadata(run / "train_log.parquet")  # kept with the first 5 rows
    write_parquet(tmp_path / "short.parquet", table.slice(0, 5), table.schema, meta)
    files = (run / "model.safetensors", tmp_path / "short.parquet", run / "corpus.json")
    with pytest.raises(LineageError, match="ends at step 5, config asks for 12 steps"):
        final_manifest(parse_run_config(CONFIG), *files)
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "bare.parquet")
    files = (run / "model.safetensors", tmp_path / "bare.parquet", run / "corpus.json")
    with pytest.raises(LineageError, match="bare.parquet: not a training log"):
        final_manifest(parse_run_config(CONFIG), *files)


def test_corpus_data_record_names_the_manifest_that_lacks_a_field(run, tmp_path):
    corpus = read_json(run / "corpus.json")
    data = corpus_data_record(run / "corpus.json", 1729)
    assert (data["corpus_sha256"], data["data_seed"]) == (corpus["train_sha256"], 1729)
    del corpus["val_sha256"]
    write_manifest(tmp_path / "corpus.json", corpus)
    with pytest.raises(ValueError, match="corpus.json: corpus manifest lacks field 'val_sha256'"):
        corpus_data_record(tmp_path / "corpus.json", 1729)


# --------------------------------------------------------------------------- evaluation
def test_evaluate_clean_rows_and_metadata(run):
    out = pd.read_parquet(run / "eval_sva.parquet")
    assert out["split"].tolist() == ["discovery", "validation", "evaluation", "holdout"]
    assert out["n"].tolist() == [8, 4, 8, 4]
    assert set(out["model"]) == {"write-common-axis"} and set(out["seed"]) == {1}
    assert set(out["task"]) == {"sva"}
    assert out["accuracy"].between(0, 1).all() and np.isfinite(out["margin"]).all()
    meta = read_parquet_metadata(run / "eval_sva.parquet")
    assert meta["manifest_content_hash"] == manifest_hash(run / "manifest.json")
    assert meta["checkpoint_sha256"] == sha256_file(run / "model.safetensors")
    task_meta = read_parquet_metadata(run / "sva.parquet")
    assert meta["task_dataset_sha256"] == task_meta["dataset_sha256"]
    assert meta["task_file_sha256"] == sha256_file(run / "sva.parquet")


def test_evaluate_clean_refuses_a_flipped_checkpoint_and_writes_nothing(run, tmp_path):
    _flip_byte(run / "model.safetensors", tmp_path / "model.safetensors")
    out = tmp_path / "eval.parquet"
    with pytest.raises(ManifestMismatchError, match="model.safetensors: SHA-256 is"):
        evaluate_clean.main(_eval_args(run, checkpoint=tmp_path / "model.safetensors", out=out))
    assert not out.exists()
    assert not list(tmp_path.glob(".eval.parquet*"))


def test_verified_val_tokens_refuses_another_validation_file(tmp_path):
    val, other = tmp_path / "val.parquet", tmp_path / "other.parquet"
    val.write_bytes(b"validation tokens")
    other.write_bytes(b"other tokens")
    manifest = {"data": {"files_sha256": {"val": sha256_file(val)}}}
    assert verified_val_tokens(val, manifest) == sha256_file(val)
    with pytest.raises(LineageError, match=f"other.parquet: SHA-256 {sha256_file(other)}"):
        verified_val_tokens(other, manifest)
    # an imported checkpoint records no training data: any validation file is its own
    assert verified_val_tokens(other, {"data": None}) == sha256_file(other)


def test_the_machine_record_names_every_kernel_variable_that_is_set(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert machine()["kernel_variables"] == {}
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert machine()["kernel_variables"] == {
        "MKL_CBWR": "COMPATIBLE",
        "ATEN_CPU_CAPABILITY": "default",
    }


def test_the_machine_record_names_the_kernels_numpy_and_scipy_chose():
    """numpy's SIMD targets and numpy's and scipy's OpenBLAS cores, as this process runs
    them: under the session's pin (tests/conftest.py) the AVX2 ones."""
    import numpy as np

    record = machine()
    umath = np._core._multiarray_umath
    assert record["numpy_simd"] == [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__[t]]
    blas = {lib["package"]: lib for lib in record["blas_libraries"]}
    assert {"numpy", "scipy"} <= blas.keys()
    core = os.environ.get("OPENBLAS_CORETYPE")
    if core:  # the pin's (or the caller's) choice reached both libraries
        assert {blas["numpy"]["core"], blas["scipy"]["core"]} == {core}
    if os.environ.get("NPY_ENABLE_CPU_FEATURES") == "X86_V3":
        assert record["numpy_simd"] == ["X86_V3"]
    width = {512: "avx512f", 256: "avx", 128: "sse2"}.get(record["cpu_vector_width"])
    assert width is None or width in open("/proc/cpuinfo").read()
