"""Corpus sources (docs §3): local text / Parquet / JSONL and the Hub through `datasets`,
EOT-separated documents cut at exact sizes, the shared validation file, R vs S, manifests,
and every failure stopping at once with no output left behind."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from headgeom.data import corpus, corpus_sources
from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer
from headgeom.hashing import ManifestMismatchError, verify_file
from headgeom.heads.stages import tokenize_corpus
from headgeom.manifest import data_record
from tests.e2e.conftest import REPO, make_workdir, snakemake

REVISION = "87f09149ef4734204d70ed1d046ddc9ca3f2b8f9"
OUTPUTS = ("train", "val", "vocab", "manifest")


@pytest.fixture(autouse=True)
def _short_datasets_shutdown_sleep(monkeypatch):
    """`datasets` sleeps 5 s after interleaving shards (an Arrow shutdown workaround); the
    tiny sources here need far less."""
    import datasets

    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0.2)


@pytest.fixture(scope="module")
def tok():
    return load_gpt2_tokenizer()


def _docs(shard: int, n: int) -> list[str]:
    """Varied documents: unicode, code, blank lines, leading spaces, one duplicate text."""
    out = []
    for i in range(n):
        out.append(
            f"Doc {shard}.{i}: the café ☕ served {i * 7} pastries.\n"
            f"  x = 'item_{i}'\n\nNaïve résumé №{shard}; 北京 {i % 3}" + " more words" * (i % 5)
        )
    return out


@pytest.fixture(scope="module")
def shards() -> list[list[str]]:
    docs = [_docs(s, 30) for s in range(3)]
    docs[2][0] = docs[0][3]  # a validation document that also occurs in a training shard
    return docs


@pytest.fixture(scope="module")
def local_files(tmp_path_factory, shards) -> dict[str, list[str]]:
    """The same documents as Parquet (one file per shard), JSONL, and text (file per doc)."""
    d = tmp_path_factory.mktemp("sources")
    for s, docs in enumerate(shards):
        table = pa.table({"id": [f"{s}-{i}" for i in range(len(docs))], "body": docs})
        pq.write_table(table, d / f"part-{s}.parquet", row_group_size=5)
        (d / f"part-{s}.jsonl").write_text(
            "".join(
                json.dumps({"body": t, "n": i}, ensure_ascii=False) + "\n"
                for i, t in enumerate(docs)
            ),
            encoding="utf-8",
        )
    text_docs = shards[0][:20]  # one document per file; the last file is the validation shard
    for i, t in enumerate(text_docs):
        (d / f"doc-{i:02d}.txt").write_text(t, encoding="utf-8")
    return {
        "parquet": [str(d / "part-*.parquet")],
        "jsonl": [str(d / "part-0.jsonl"), str(d / "part-[12].jsonl")],
        "text": [str(d / "doc-*.txt")],
    }


def _reference(shards: list[list[str]], tok, n_val: int, n_train: int):
    """Independent construction: a plain per-document `encode` loop over the files' rows.

    Validation: the first documents of the last shard (then the one before it...); train:
    every shard in stored order without the validation documents' texts; each document then
    EOT, cut exactly.
    """
    val, val_texts = [], set()
    for text in (t for shard in reversed(shards) for t in shard):
        if len(val) >= n_val:
            break
        val_texts.add(text)
        val += tok.encode(text, add_special_tokens=False).ids + [EOT_ID]
    train = []
    for text in (t for shard in shards for t in shard):
        if len(train) >= n_train:
            break
        if text not in val_texts:
            train += tok.encode(text, add_special_tokens=False).ids + [EOT_ID]
    if len(train) < n_train:
        raise AssertionError("reference corpus too small for the test")
    return np.asarray(val[:n_val], dtype=np.uint16), np.asarray(train[:n_train], dtype=np.uint16)


def _build(tmp: Path, cfg: dict) -> dict[str, Path]:
    out = {k: tmp / f"{k}.parquet" for k in ("train", "val", "vocab")}
    out["manifest"] = tmp / "manifest.json"
    argv = ["--config-json", json.dumps(cfg)]
    for k, p in out.items():
        argv += [f"--{k}", str(p)]
    assert tokenize_corpus.main(argv) == 0
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- local sources: tokens equal the plain loop ----------------------------------------------


@pytest.mark.parametrize(
    ("kind", "extra", "n_val", "n_train"),
    [
        ("parquet", {"text_column": "body"}, 300, 2_049),
        ("jsonl", {"text_column": "body"}, 257, 1_501),
        ("text", {}, 120, 401),
    ],
)
def test_local_source_matches_plain_loop(
    tmp_path, tok, shards, local_files, kind, extra, n_val, n_train
):
    cfg = {
        "source": kind,
        "files": local_files[kind],
        "n_val_tokens": n_val,
        "n_train_tokens": n_train,
        "batch_docs": 4,
        **extra,
    }
    out = _build(tmp_path, cfg)
    docs = [[t] for t in shards[0][:20]] if kind == "text" else shards
    ref_val, ref_train = _reference(docs, tok, n_val, n_train)
    val, train = corpus.read_tokens(out["val"]), corpus.read_tokens(out["train"])
    assert len(val) == n_val and len(train) == n_train  # exact, odd sizes included
    np.testing.assert_array_equal(val, ref_val)
    np.testing.assert_array_equal(train, ref_train)

    manifest = json.loads(out["manifest"].read_text())
    assert manifest["dataset"] == f"local-{kind}"
    assert manifest["n_train_tokens"] == n_train and manifest["n_val_tokens"] == n_val
    for role in ("train", "val", "vocab"):
        assert manifest["files"][role] == _sha(out[role])
        assert manifest["file_bytes"][role] == out[role].stat().st_size
    assert manifest["train_sha256"] == hashlib.sha256(ref_train.astype("<u2").tobytes()).hexdigest()
    assert manifest["val_sha256"] == hashlib.sha256(ref_val.astype("<u2").tobytes()).hexdigest()
    listed = {Path(f["path"]).name: f["sha256"] for f in manifest["source_files"]}
    for f in manifest["source_files"]:
        assert f["sha256"] == _sha(Path(f["path"]))
    assert len(listed) == (20 if kind == "text" else 3)


def test_documents_are_eot_separated_and_validation_excluded(tmp_path, tok, shards, local_files):
    n_train = 2_500
    cfg = {
        "source": "parquet",
        "files": local_files["parquet"],
        "text_column": "body",
        "n_val_tokens": 400,
        "n_train_tokens": n_train,
    }
    out = _build(tmp_path, cfg)
    train = corpus.read_tokens(out["train"]).tolist()
    cut = [i for i, t in enumerate(train) if t == EOT_ID]
    texts = [tok.decode(train[a + 1 : b]) for a, b in zip([-1, *cut], cut, strict=False)]
    val_texts = set(shards[2][: len(texts)])  # a superset of the validation documents
    val = corpus.read_tokens(out["val"]).tolist()
    n_val_docs = val.count(EOT_ID) + (val[-1] != EOT_ID)
    val_docs = set(shards[2][:n_val_docs])
    stored = [t for s in shards for t in s if t not in val_docs]
    assert texts == stored[: len(texts)]  # whole documents, in stored order
    assert not val_docs & set(texts)  # including the duplicated text shards[0][3]
    assert shards[0][3] in val_docs and val_texts
    manifest = json.loads(out["manifest"].read_text())
    assert manifest["n_val_documents"] == n_val_docs


def test_rebuild_is_byte_identical(tmp_path, local_files):
    cfg = {
        "source": "jsonl",
        "files": local_files["jsonl"],
        "text_column": "body",
        "n_val_tokens": 300,
        "n_train_tokens": 1_000,
        "order": "shuffled",
        "shuffle_buffer": 8,
    }
    a, b = _build(tmp_path / "a", cfg), _build(tmp_path / "b", cfg)
    for role in ("train", "val", "vocab"):
        assert _sha(a[role]) == _sha(b[role]), role
    ma, mb = (json.loads(x["manifest"].read_text()) for x in (a, b))
    assert ma["files"] == mb["files"] and ma["train_sha256"] == mb["train_sha256"]


def test_corpora_r_and_s_share_the_validation_file(tmp_path, tok, shards, local_files):
    base = {
        "source": "parquet",
        "files": local_files["parquet"],
        "text_column": "body",
        "n_val_tokens": 300,
        "compact_vocab": False,
    }
    r = _build(tmp_path / "R", {**base, "name": "R", "n_train_tokens": 2_000})
    s = _build(
        tmp_path / "S",
        {
            **base,
            "name": "S",
            "n_train_tokens": 2_001,
            "order": "shuffled",
            "sampling": "read_once",
            "shuffle_buffer": 16,
        },
    )
    mr, ms = (json.loads(x["manifest"].read_text()) for x in (r, s))
    assert (mr["corpus"], mr["sampling"], mr["order"]) == ("R", "with_replacement", "stored")
    assert (ms["corpus"], ms["sampling"], ms["order"]) == ("S", "read_once", "shuffled")
    assert _sha(r["val"]) == _sha(s["val"])  # one shared file: the same bytes for R and S
    assert mr["val_sha256"] == ms["val_sha256"] and mr["vocab_size"] == 50257
    r_tok, s_tok = corpus.read_tokens(r["train"]), corpus.read_tokens(s["train"])
    assert len(s_tok) == 2_001 and not np.array_equal(r_tok[:2000], s_tok[:2000])
    # S holds whole training documents (shuffled), never a validation document.
    val = corpus.read_tokens(r["val"]).tolist()
    val_docs = set(shards[2][: val.count(EOT_ID) + 1])
    allowed = {t for sh in shards for t in sh} - val_docs
    ids = s_tok.tolist()
    cut = [i for i, t in enumerate(ids) if t == EOT_ID]
    texts = [tok.decode(ids[a + 1 : b]) for a, b in zip([-1, *cut], cut, strict=False)]
    assert texts and set(texts) <= allowed
    # The checkpoint manifest's data block names the model's corpus and its hashes.
    data_s = data_record(ms, 1729)
    assert (data_s["corpus"], data_s["sampling"]) == ("S", "read_once")
    assert data_s["corpus_sha256"] == ms["train_sha256"] == corpus.token_bytes_sha256(s_tok)
    assert data_s["corpus_num_tokens"] == 2_001 and data_s["val_sha256"] == mr["val_sha256"]
    assert data_record(mr, 1729)["corpus"] == "R"


def test_embedded_source_is_the_demo_corpus(tmp_path, tok):
    """The demo corpus through the new pipeline equals headgeom.data.corpus.build_demo_corpus."""
    out = _build(
        tmp_path, {"source": "embedded", "seed": 5, "n_train_tokens": 6_001, "n_val_tokens": 999}
    )
    train, val = corpus.build_demo_corpus(5, 6_001, 999, tok)
    np.testing.assert_array_equal(corpus.read_tokens(out["train"]), train)
    np.testing.assert_array_equal(corpus.read_tokens(out["val"]), val)
    manifest = json.loads(out["manifest"].read_text())
    assert manifest["sampling"] == "with_replacement" and manifest["corpus"] == "default"
    assert manifest["dataset"] == "embedded-demo"


def test_fineweb_source_reads_the_pinned_revision_through_datasets(
    tmp_path, monkeypatch, local_files
):
    """The Hub path with the Hub replaced: one metadata request for the pin, then
    `datasets.load_dataset(streaming=True)` with exactly the configured id, config, split and
    revision (served here from the local Parquet files, which hold the same documents)."""
    import datasets

    calls = []
    real_load = datasets.load_dataset

    def fake_load(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        files = sorted(
            str(p) for p in Path(local_files["parquet"][0]).parent.glob("part-*.parquet")
        )
        ds = real_load("parquet", data_files=files, split="train", streaming=True)
        return ds.rename_column("body", "text")

    class Info:
        sha = REVISION

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(corpus_sources, "_hub_dataset_info", lambda repo, revision, timeout: Info)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    sizes = {"n_val_tokens": 300, "n_train_tokens": 2_049, "compact_vocab": False}
    hub = _build(tmp_path / "hub", {"source": "fineweb", "revision": REVISION, **sizes})
    assert calls == [
        (
            "HuggingFaceFW/fineweb-edu",
            "sample-10BT",
            {"split": "train", "revision": REVISION, "streaming": True},
        )
    ]
    manifest = json.loads(hub["manifest"].read_text())
    assert manifest["dataset"] == "HuggingFaceFW/fineweb-edu"
    assert (manifest["dataset_config"], manifest["dataset_revision"]) == ("sample-10BT", REVISION)
    data = data_record(manifest, 1729)
    assert data["dataset_revision"] == REVISION and data["dataset"] == manifest["dataset"]
    monkeypatch.setattr(datasets, "load_dataset", real_load)
    local = _build(
        tmp_path / "local",
        {"source": "parquet", "files": local_files["parquet"], "text_column": "body", **sizes},
    )
    for role in ("train", "val"):
        np.testing.assert_array_equal(
            corpus.read_tokens(hub[role]), corpus.read_tokens(local[role])
        )


# --- failures: at once, clear, nothing left behind --------------------------------------------


def _assert_no_outputs(tmp_path: Path) -> None:
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [], left


FINEWEB = {
    "source": "fineweb",
    "revision": REVISION,
    "n_train_tokens": 2_000,
    "n_val_tokens": 300,
    "hub_timeout_s": 3,
}


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "offline mode"),
        (
            {"HF_ENDPOINT": "http://127.0.0.1:9"},
            "cannot reach the Hugging Face Hub at http://127.0.0.1:9",
        ),
    ],
)
def test_no_hub_fails_at_once_naming_local_files(tmp_path, monkeypatch, env, expect):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    start = time.perf_counter()
    with pytest.raises(corpus_sources.CorpusSourceError) as err:
        _build(tmp_path, FINEWEB)
    assert time.perf_counter() - start < 10
    text = str(err.value)
    assert expect in text and REVISION in text
    assert "corpus.source: parquet" in text and "corpus.files" in text
    _assert_no_outputs(tmp_path)


def test_wrong_revision_is_named(tmp_path, monkeypatch):
    from huggingface_hub.errors import RevisionNotFoundError

    wrong = "0" * 40
    asked = {}

    def missing(repo, revision, timeout):
        asked.update(repo=repo, revision=revision, timeout=timeout)
        err = RevisionNotFoundError.__new__(RevisionNotFoundError)
        Exception.__init__(err, f"404 Revision Not Found for url .../{revision}")
        raise err

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(corpus_sources, "_hub_dataset_info", missing)
    with pytest.raises(
        corpus_sources.CorpusSourceError,
        match=f"revision {wrong} of dataset HuggingFaceFW/fineweb-edu does not exist",
    ):
        _build(tmp_path, {**FINEWEB, "revision": wrong})
    assert asked == {"repo": "HuggingFaceFW/fineweb-edu", "revision": wrong, "timeout": 3.0}
    _assert_no_outputs(tmp_path)
    with pytest.raises(ValueError, match="revision = 'main' must be a full 40-hex commit"):
        _build(tmp_path, {**FINEWEB, "revision": "main"})


def test_truncated_or_corrupt_token_file_is_named(tmp_path):
    out = _build(
        tmp_path / "c",
        {"source": "embedded", "seed": 3, "n_train_tokens": 5_000, "n_val_tokens": 500},
    )
    path, size = out["train"], out["train"].stat().st_size
    good = path.read_bytes()
    manifest = json.loads(out["manifest"].read_text())
    path.write_bytes(good[: size // 2])
    with pytest.raises(corpus.TokenFileError, match="truncated or corrupt") as err:
        corpus.read_tokens(path)
    assert str(path) in str(err.value) and f"{size // 2:,} bytes" in str(err.value)
    # Against its manifest (what train.py checks first): expected vs actual hash.
    with pytest.raises(ManifestMismatchError) as err:
        verify_file(path, manifest["files"]["train"], out["manifest"])
    assert manifest["files"]["train"] in str(err.value) and _sha(path) in str(err.value)

    # A complete file whose tokens are not the ones it records: both hashes named.
    tokens = np.arange(100, dtype=np.uint16)
    table = pa.table({"token": pa.array(tokens)}).replace_schema_metadata(
        {"n_tokens": "100", "token_sha256": "ab" * 32}
    )
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(corpus.TokenFileError, match="ab" * 32) as err:
        corpus.read_tokens(tmp_path / "bad.parquet")
    assert corpus.token_bytes_sha256(tokens) in str(err.value)
    pq.write_table(table.replace_schema_metadata({"n_tokens": "101"}), tmp_path / "short.parquet")
    with pytest.raises(
        corpus.TokenFileError, match="holds 100 tokens but its metadata records 101"
    ):
        corpus.read_tokens(tmp_path / "short.parquet")


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"n_train_tokens": 10**6}, "ran out after"),
        ({"text_column": "text"}, "no column 'text'"),
        ({"files": ["/nonexistent/*.parquet"]}, "matches no file"),
        ({"files": 3}, "must be a non-empty list"),
        ({"revision": REVISION}, "unknown keys ['revision']"),
    ],
)
def test_bad_local_source_fails_cleanly(tmp_path, local_files, change, expect):
    cfg = {
        "source": "parquet",
        "files": local_files["parquet"],
        "text_column": "body",
        "n_val_tokens": 300,
        "n_train_tokens": 1_000,
        **change,
    }
    with pytest.raises((ValueError, corpus_sources.CorpusSourceError)) as err:
        _build(tmp_path, cfg)
    assert expect in str(err.value)
    _assert_no_outputs(tmp_path)


# --- the workflow: each model reads its own corpus --------------------------------------------


def _two_corpus_config() -> dict:
    cfg = yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text())
    steps = cfg["training"]["steps"] * cfg["training"]["batch_size"]
    cfg["corpus"] = {
        "source": "embedded",
        "seed": 7,
        "n_val_tokens": 2048,
        "compact_vocab": False,
        "corpora": {
            "R": {"n_train_tokens": 30_000},
            "S": {
                "n_train_tokens": steps * cfg["architecture"]["n_ctx"] + 1,
                "order": "shuffled",
                "sampling": "read_once",
            },
        },
    }
    cfg["models"]["learned"]["corpus"] = "S"  # write-common-axis: the default, R
    return cfg


@pytest.mark.e2e  # a Snakemake subprocess
def test_workflow_wires_each_model_to_its_corpus(tmp_path):
    work = make_workdir(tmp_path / "w", _two_corpus_config())
    proc = snakemake(
        work,
        "-n",
        "-p",
        "--cores",
        "1",
        "results/micro/models/learned/s1/manifest.json",
        "results/micro/models/write-common-axis/s1/train_log.parquet",
    )
    text = proc.stdout + proc.stderr
    train_cmds = [
        line for line in text.splitlines() if "python -m headgeom.heads.stages.train" in line
    ]
    assert len(train_cmds) == 2
    for cmd in train_cmds:
        corpus_name = "S" if '"model_name":"learned"' in cmd else "R"
        for flag in ("train-tokens", "val-tokens", "vocab", "corpus-manifest"):
            assert f"--{flag} results/micro/corpus/{corpus_name}/" in cmd, (flag, cmd)
    tokenize = [
        line
        for line in text.splitlines()
        if "python -m headgeom.heads.stages.tokenize_corpus" in line
    ]
    assert len(tokenize) == 2 and any('"sampling":"read_once"' in c for c in tokenize)


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda c: c["models"]["learned"].update(corpus="T"), "models.learned.corpus is 'T'"),
        (
            lambda c: c["corpus"]["corpora"]["S"].update(n_train_tokens=5_000),
            "corpus S is read once but holds 5,000 tokens",
        ),
        (lambda c: c["corpus"].update(compact_vocab=True), "set corpus.compact_vocab: false"),
    ],
)
@pytest.mark.e2e  # a Snakemake subprocess
def test_workflow_rejects_inconsistent_corpora(tmp_path, edit, expect):
    cfg = _two_corpus_config()
    edit(cfg)
    work = make_workdir(tmp_path / "w", cfg)
    proc = snakemake(work, "-n", "--cores", "1", check=False)
    assert proc.returncode != 0 and expect in proc.stdout + proc.stderr
    assert not (work / "results").exists()


def test_the_hub_metadata_timeout_is_whole_seconds_and_the_users_wins(monkeypatch):
    # huggingface_hub int()s the variable when it is imported: "10.0" would break it
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)
    corpus_sources.set_hub_metadata_timeout(2.5)
    assert int(os.environ["HF_HUB_ETAG_TIMEOUT"]) == 3
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "42")
    corpus_sources.set_hub_metadata_timeout(10.0)
    assert os.environ["HF_HUB_ETAG_TIMEOUT"] == "42"
