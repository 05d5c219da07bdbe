"""The atlas's scoring corpora (headgeom.atlas.corpora): each source's documents, windows cut
from their token stream (BOS first, EOS between documents), the hashes, the held-out split
and the refusals. A byte-level tokenizer written here stands in for a model's."""

from __future__ import annotations

import itertools
import pydoc_data.topics
import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from headgeom.atlas import corpora as C
from headgeom.data.corpus import DemoText
from headgeom.data.domains import DomainText

BOS, EOS = 256, 257


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def windows(spec: C.CorpusSpec, n_ctx: int = 16, n: int = 4, bos=BOS, eos=EOS) -> C.Windows:
    return C.tokenize_windows(spec, encode, n_ctx, n, bos, eos, tokenizer="bytes")


def stream_of(docs, eos=EOS) -> list[int]:
    out: list[int] = []
    for doc in docs:
        out += ([eos] if out else []) + encode(doc)
    return out


def test_stdlib_is_the_standard_librarys_code():
    files = C.stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    assert len(files) > 500 and all(f.suffix == ".py" for f in files)
    parts = {p for f in files for p in f.relative_to(root).parts}
    assert not parts & {"site-packages", "test", "idle_test", "pydoc_data"}
    assert root / "json" / "decoder.py" in files
    assert files == C.stdlib_files()  # a fixed order
    w = windows(C.CorpusSpec("code", "stdlib"), n_ctx=64, n=8)
    first = next(C.documents(C.CorpusSpec("code", "stdlib")))
    assert first == files[0].read_text(encoding="utf-8")
    assert w.ids[0, 1:].tolist() == encode(first)[:63]
    assert w.record["python"] and w.record["source"] == "stdlib"


def test_pydoc_topics_are_english_prose_in_key_order():
    topics = pydoc_data.topics.topics
    docs = list(C.documents(C.CorpusSpec("prose", "pydoc")))
    assert docs == [topics[k] for k in sorted(topics)]
    w = windows(C.CorpusSpec("prose", "pydoc"), n_ctx=32, n=50)
    flat = w.ids[:, 1:].reshape(-1).tolist()
    assert flat == stream_of(docs)[: len(flat)]
    assert (w.ids[:, 0] == BOS).all() and w.ids.shape == (50, 32)
    assert EOS in flat  # several topics: documents joined by EOS


def test_embedded_corpora_are_the_studies_generators():
    demo = C.CorpusSpec("demo", "demo", seed=3)
    source = DemoText(random.Random(f"headgeom.corpus.demo:3:{C.STREAM}"))
    expected = [source.document() for _ in range(3)]
    assert list(itertools.islice(C.documents(demo), 3)) == expected
    math_ = C.CorpusSpec("math", "domain", domain="math", seed=1)
    source = DomainText(1, C.STREAM)
    expected = [source.document("math") for _ in range(3)]
    assert list(itertools.islice(C.documents(math_), 3)) == expected
    w = windows(math_, n_ctx=20, n=30, bos=None)
    assert (
        w.ids.reshape(-1).tolist()
        == stream_of(itertools.islice(C.documents(math_), 200))[: 20 * 30]
    )


def test_file_corpus(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("héllo world\n" * 40, encoding="utf-8")
    w = windows(C.CorpusSpec("notes", "file", path=str(path)), n_ctx=10, n=5, eos=None)
    assert w.ids[:, 1:].reshape(-1).tolist() == encode(path.read_text(encoding="utf-8"))[:45]
    assert w.record["path"] == str(path) and w.record["documents_read"] == 1
    with pytest.raises(ValueError, match="holds 13 tokens; 5 windows of 10 need 45"):
        short = tmp_path / "short.txt"
        short.write_text("héllo world\n", encoding="utf-8")
        windows(C.CorpusSpec("short", "file", path=str(short)), n_ctx=10, n=5, eos=None)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        windows(C.CorpusSpec("gone", "file", path=str(tmp_path / "missing.txt")))
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(ValueError, match="not UTF-8"):
        windows(C.CorpusSpec("latin", "file", path=str(tmp_path / "latin.txt")))


def test_hashes_and_split():
    spec = C.CorpusSpec("prose", "pydoc")
    a, b = windows(spec, n=6), windows(spec, n=6)
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    ids = a.ids.copy()
    ids[3, 5] += 1
    assert C.windows_sha256("prose", ids) != a.sha256
    assert C.windows_sha256("other", a.ids) != a.sha256
    means, scored = C.split_windows(a, 2, 3)
    assert np.array_equal(means.ids, a.ids[:2]) and np.array_equal(scored.ids, a.ids[2:5])
    assert means.sha256 != scored.sha256
    assert (means.record["role"], scored.record["windows"]) == ("means", "2..4")
    with pytest.raises(ValueError, match="has 6 windows"):
        C.split_windows(a, 4, 3)


def test_refusals():
    with pytest.raises(ValueError, match="source 'web'"):
        C.CorpusSpec("x", "web")
    with pytest.raises(ValueError, match="needs a path"):
        C.CorpusSpec("x", "file")
    with pytest.raises(ValueError, match="domain 'poetry'"):
        C.CorpusSpec("x", "domain", domain="poetry")
    with pytest.raises(ValueError, match="n_ctx 1"):
        windows(C.CorpusSpec("x", "pydoc"), n_ctx=1)
    entries = [
        {"name": "code", "source": "stdlib"},
        {"name": "m", "source": "domain", "domain": "math"},
    ]
    specs = C.specs_from_config(entries)
    assert [s.name for s in specs] == ["code", "m"]
    with pytest.raises(ValueError, match="names \\['code'\\] occur more than once"):
        C.specs_from_config([{"name": "code", "source": "stdlib"}] * 2)
    with pytest.raises(ValueError, match="unknown \\['lang'\\]"):
        C.specs_from_config([{"name": "code", "source": "stdlib", "lang": "py"}])
