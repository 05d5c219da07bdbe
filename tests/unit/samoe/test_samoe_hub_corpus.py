"""The paper-scale corpus of a Hub family (samoe/stages/hub_corpus.py, headgeom.samoe.hub_corpus)
on tiny local "domains" (Parquet and JSONL files) and a tiny local tokenizer whose ids exceed
16 bits. Every expectation is a naive in-memory re-implementation of the documented rules
(files read with pandas/json, documents tokenized one at a time), never the code under test."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from headgeom.samoe import hub_corpus
from headgeom.samoe.stages import hub_corpus as samoe_hub_corpus
from headgeom.training.data import sample_batch

DOMAINS = ("prose", "code", "math")
T = 16
POOLS = {"construction": 6, "calibration": 3, "final": 6, "intervention": 3}
SAMPLING = {"prose": 0.5, "code": 0.25, "math": 0.25}
OFFSET = 70_000  # word ids above 2**16: the file must hold more than uint16
WORDS = {
    "prose": "the a student reads book river light school teacher writes".split(),
    "code": "def return if for x y in range print self".split(),
    "math": "1 2 3 4 5 + - = * x".split(),
}


def _docs(domain: str, n: int, seed: int) -> list[str]:
    rng = random.Random(f"{domain}:{seed}")
    docs = [" ".join([domain, str(i), *rng.choices(WORDS[domain], k=rng.randint(2, 12))])
            for i in range(n)]  # fmt: skip
    docs[7] = docs[3]  # a repeated text
    return docs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three domains on disk, a saved tokenizer and the texts as naive lists."""
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("hubcorpus")
    texts = {d: _docs(d, 160, 1) for d in DOMAINS}
    pd.DataFrame({"text": texts["prose"], "n": range(160)}).to_parquet(root / "prose.parquet")
    with open(root / "code.jsonl", "w") as fh:
        for t in texts["code"]:
            fh.write(json.dumps({"content": t, "lang": "py"}) + "\n")
    half = len(texts["math"]) // 2  # two shards: the held-out documents are the last one's
    pd.DataFrame({"text": texts["math"][:half]}).to_parquet(root / "math-0.parquet")
    pd.DataFrame({"text": texts["math"][half:]}).to_parquet(root / "math-1.parquet")
    words = sorted({w for ts in texts.values() for t in ts for w in t.split()})
    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: OFFSET + i for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[EOS]", unk_token="[UNK]")
    tok.save_pretrained(root / "tok")
    sources = {
        "prose": {"files": [str(root / "prose.parquet")], "format": "parquet"},
        "code": {"files": [str(root / "code.jsonl")], "format": "jsonl", "text_column": "content"},
        "math": {"files": [str(root / "math-*.parquet")], "format": "parquet"},
    }
    return {"root": root, "texts": texts, "sources": sources, "tok": str(root / "tok")}


def _cfg(world, n_tokens=64 * T, seed=1729, **data) -> dict:
    return {"family": "smollm2", "seq_len": T,
            "tokenizer": {"repo_id": world["tok"], "revision": "a" * 40},
            "data": {"seed": seed, "sampling": SAMPLING, "sources": world["sources"],
                     "cpt_train_tokens": n_tokens, "pools": POOLS, **data}}  # fmt: skip


def _run(world, out: Path, cfg=None, *extra: str) -> dict:
    cfg = cfg or _cfg(world)
    argv = ["--config-json", json.dumps(cfg), "--out-dir", str(out), "--no-progress", *extra]
    assert samoe_hub_corpus.main(argv) == 0
    return {p.name: p for p in out.iterdir()}


# --- the naive reference ---------------------------------------------------------------------


def _encode(world, text: str) -> list[int]:
    backend = Tokenizer.from_file(str(Path(world["tok"]) / "tokenizer.json"))
    return backend.encode(text, add_special_tokens=False).ids


def _naive(world, n_tokens: int, seed: int = 1729):
    """(pools rows, training ids, training (domain, text) documents) by the documented rules."""
    eos, texts = 1, world["texts"]
    half = len(texts["math"]) // 2
    heldout = {
        "prose": list(texts["prose"]),
        "code": list(texts["code"]),
        "math": texts["math"][half:] + texts["math"][:half],
    }  # last shard first
    read, rows = set(), []
    pos = dict.fromkeys(DOMAINS, 0)
    for role in ("construction", "calibration", "final"):
        n_role = POOLS[role]
        for i, domain in enumerate(DOMAINS):
            n = n_role // 3 + (i < n_role % 3)
            ids: list[int] = []
            while len(ids) < n * T:
                text = heldout[domain][pos[domain]]
                pos[domain] += 1
                if text in read:
                    continue
                read.add(text)
                ids += [*_encode(world, text), eos]
            rows += [(role, domain, f"{domain}-{k:04d}", ids[k * T : (k + 1) * T])
                     for k in range(n)]  # fmt: skip
    draw = random.Random(f"headgeom.samoe.hub_sampling:{seed}:cpt-train")
    nxt = dict.fromkeys(DOMAINS, 0)
    stream: list[int] = []
    docs = []
    while len(stream) < n_tokens:
        domain = draw.choices(DOMAINS, [SAMPLING[d] for d in DOMAINS])[0]
        while texts[domain][nxt[domain]] in read:
            nxt[domain] += 1
        text = texts[domain][nxt[domain]]
        nxt[domain] += 1
        docs.append((domain, text))
        stream += [*_encode(world, text), eos]
    return rows, np.asarray(stream[:n_tokens], dtype="<u4"), docs, read


# --- the corpus ------------------------------------------------------------------------------


def test_stream_and_pools_equal_a_naive_build(world, tmp_path):
    files = _run(world, tmp_path / "a")
    rows, stream, docs, held = _naive(world, 64 * T)
    data = files["cpt_train.bin"].read_bytes()
    assert data == stream.tobytes()  # EOS (1) after every document, cut at exactly the budget
    assert stream.max() > 2**16  # the ids needed 32 bits
    meta = json.loads(files["cpt_train.json"].read_text())
    manifest = json.loads(files["manifest.json"].read_text())
    assert meta["sha256"] == hashlib.sha256(data).hexdigest() == manifest["files"]["cpt_train"]
    assert (meta["dtype"], meta["n_tokens"], meta["seq_len"], meta["n_sequences"]) == (
        "<u4",
        64 * T,
        T,
        64,
    )
    assert meta["eos_id"] == manifest["eot_id"] == 1 and meta["max_id"] == int(stream.max())
    # realised token shares: every document's tokens and its EOS (the last one cut)
    lengths = [len(_encode(world, t)) + 1 for _, t in docs]
    lengths[-1] -= sum(lengths) - 64 * T
    by_domain = {d: sum(n for (dom, _), n in zip(docs, lengths, strict=True) if dom == d)
                 for d in DOMAINS}  # fmt: skip
    assert meta["tokens_by_domain"] == by_domain
    assert meta["documents_by_domain"] == {d: sum(x == d for x, _ in docs) for d in DOMAINS}
    assert meta["token_shares"] == pytest.approx({d: by_domain[d] / (64 * T) for d in DOMAINS})
    # pools: the POOLS schema, the naive rows, the intervention subset as the toy's
    pools = pd.read_parquet(files["pools.parquet"])
    assert list(pools.columns) == ["role", "domain", "seq_id", "intervention", "tokens"]
    got = [(r.role, r.domain, r.seq_id, list(r.tokens)) for r in pools.itertuples()]
    assert got == [(a, b, c, list(d)) for a, b, c, d in rows]
    assert all(len(t) == T for t in pools["tokens"])
    sub = pools[pools["intervention"]]
    assert (sub["role"] == "final").all() and sorted(sub["domain"]) == sorted(DOMAINS)
    # pools and training share no document text (by SHA-256 in the code, by text here)
    assert not held & {t for _, t in docs}
    assert manifest["n_heldout_documents"] == len(held)


def test_deterministic_and_chunking_never_changes_the_bytes(world, tmp_path):
    a = _run(world, tmp_path / "a")
    b = _run(world, tmp_path / "b", None, "--chunk-tokens", "7")  # 146 flushes
    c = _run(world, tmp_path / "c", _cfg(world, batch_docs=3))
    for name in ("cpt_train.bin", "cpt_train.json", "pools.parquet", "manifest.json"):
        assert a[name].read_bytes() == b[name].read_bytes(), name
    assert a["cpt_train.bin"].read_bytes() == c["cpt_train.bin"].read_bytes()
    d = _run(world, tmp_path / "d", _cfg(world, seed=7))
    assert d["cpt_train.bin"].read_bytes() == _naive(world, 64 * T, seed=7)[1].tobytes()
    assert d["cpt_train.bin"].read_bytes() != a["cpt_train.bin"].read_bytes()


def test_per_document_draw_proportions():
    """The draw is per document (before packing): 20,000 draws within 4σ of each p."""
    import itertools

    def texts(domain):
        return (f"{domain} {i}" for i in itertools.count())

    train = {d: texts(d) for d in DOMAINS}
    draws = list(itertools.islice(hub_corpus.draw_documents(5, SAMPLING, train), 20_000))
    for d, p in SAMPLING.items():
        share = sum(x == d for x, _ in draws) / len(draws)
        assert abs(share - p) < 4 * (p * (1 - p) / len(draws)) ** 0.5, (d, share)
    # each domain's documents in stored order
    assert [t for x, t in draws if x == "code"][:3] == ["code 0", "code 1", "code 2"]


def test_the_loader_reads_the_memmap_as_an_array(world, tmp_path):
    from headgeom.samoe.manifest import verified_inputs  # noqa: F401 (the path it takes)

    out = tmp_path / "a"
    _run(world, out)
    vocab = np.arange(OFFSET + 200)
    tokens = hub_corpus.open_cpt_stream(out, vocab)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.dtype("<u4")
    in_memory = np.fromfile(out / "cpt_train.bin", dtype="<u4").astype(np.int64)
    for step in (1, 2, 17):
        x, y = sample_batch(tokens, step, 4, T, 1729)
        xr, yr = sample_batch(in_memory, step, 4, T, 1729)
        assert torch.equal(x, xr) and torch.equal(y, yr) and x.dtype == torch.int64
    with pytest.raises(hub_corpus.HubCorpusError, match="not the identity"):
        hub_corpus.open_cpt_stream(out, np.arange(100))  # another family's vocabulary
    (out / "cpt_train.bin").write_bytes((out / "cpt_train.bin").read_bytes()[:-4] + b"\0" * 4)
    with pytest.raises(Exception, match="SHA-256"):
        hub_corpus.open_cpt_stream(out, vocab)


# --- failures: named, nothing written --------------------------------------------------------


def test_budget_must_be_whole_sequences(world, tmp_path):
    with pytest.raises(SystemExit, match="cpt_train_tokens = 1000 is not a multiple of"):
        _run(world, tmp_path / "a", _cfg(world, n_tokens=1000))
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").iterdir())


def test_a_source_that_runs_out_is_named_and_leaves_nothing(world, tmp_path):
    out = tmp_path / "a"
    with pytest.raises(SystemExit, match=r"data.sources.(prose|code|math): the source ran out"):
        _run(world, out, _cfg(world, n_tokens=4096 * T))
    assert not list(out.iterdir())


def test_offline_stops_naming_the_dataset_and_what_to_set(world, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the stage sets the Hub's timeout for its own process: gone again after this test
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)
    cfg = _cfg(world)
    hub = {"repo_id": "bigcode/the-stack-dedup", "data_dir": "data/python"}
    cfg["data"]["sources"] = {**world["sources"], "code": hub}
    out = tmp_path / "a"
    with pytest.raises(SystemExit) as err:
        _run(world, out, cfg)
    message = str(err.value)
    assert "bigcode/the-stack-dedup" in message and "offline mode" in message
    assert "data.sources.<domain>: {files:" in message
    assert not out.exists()


def test_an_unloadable_tokenizer_is_named(world, tmp_path):
    cfg = _cfg(world)
    cfg["tokenizer"] = {"repo_id": str(tmp_path / "no-such-model"), "revision": "b" * 40}
    with pytest.raises(SystemExit, match=r"tokenizer of .*no-such-model@bbbb.*families.smollm2"):
        _run(world, tmp_path / "a", cfg)
    assert not (tmp_path / "a").exists()


# --- the embedded domains in a local model source's tokenizer --------------------------------


@pytest.fixture(scope="module")
def gpt2_source(tmp_path_factory):
    """GPT-2's tokenizer saved as a local model source (a transformers directory), its files'
    SHA-256 by hashlib."""
    from transformers import PreTrainedTokenizerFast

    from headgeom.data.tokenizer import load_gpt2_tokenizer

    root = tmp_path_factory.mktemp("gpt2src") / "tok"
    PreTrainedTokenizerFast(tokenizer_object=load_gpt2_tokenizer(),
                            eos_token="<|endoftext|>").save_pretrained(root)  # fmt: skip
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}
    return {"format": "hf-causal-lm", "path": str(root), "sha256": sha}


def _embedded_cfg(source: dict, n_tokens: int = 32 * T, eos_token: str | None = None) -> dict:
    tokenizer = {"source": source, **({"eos_token": eos_token} if eos_token else {})}
    embedded = {d: {"generator": "embedded"} for d in DOMAINS}
    return {"family": "smollm2", "seq_len": T, "tokenizer": tokenizer,
            "data": {"seed": 1729, "sampling": SAMPLING, "sources": embedded,
                     "cpt_train_tokens": n_tokens, "pools": POOLS}}  # fmt: skip


def test_the_embedded_domains_in_the_sources_tokenizer_equal_a_naive_build(gpt2_source, tmp_path):
    from headgeom.data.tokenizer import load_gpt2_tokenizer
    from headgeom.samoe.domains import DomainText

    cfg = _embedded_cfg(gpt2_source)
    argv = ["--config-json", json.dumps(cfg), "--out-dir", str(tmp_path), "--no-progress"]
    assert samoe_hub_corpus.main(argv) == 0
    tok, eos = load_gpt2_tokenizer(), 50256

    def encode(text):
        return tok.encode(text, add_special_tokens=False).ids

    # held-out: one seeded stream per domain, consumed role by role; a repeated text once
    heldout = DomainText(1729, "heldout")
    read, rows = set(), []
    for role in ("construction", "calibration", "final"):
        for i, domain in enumerate(DOMAINS):
            n = POOLS[role] // 3 + (i < POOLS[role] % 3)
            ids: list[int] = []
            while len(ids) < n * T:
                text = heldout.document(domain)
                if text in read:
                    continue
                read.add(text)
                ids += [*encode(text), eos]
            rows += [(role, domain, ids[k * T : (k + 1) * T]) for k in range(n)]
    pools = pd.read_parquet(tmp_path / "pools.parquet")
    assert [(r.role, r.domain, list(r.tokens)) for r in pools.itertuples()] == rows
    # training: the per-document draw over the cpt-train stream, held-out texts skipped
    train, draw = DomainText(1729, "cpt-train"), random.Random(
        "headgeom.samoe.hub_sampling:1729:cpt-train")  # fmt: skip
    stream: list[int] = []
    while len(stream) < 32 * T:
        domain = draw.choices(DOMAINS, [SAMPLING[d] for d in DOMAINS])[0]
        text = train.document(domain)
        while text in read:
            text = train.document(domain)
        stream += [*encode(text), eos]
    assert (tmp_path / "cpt_train.bin").read_bytes() == np.asarray(stream[: 32 * T],
                                                                   "<u4").tobytes()  # fmt: skip
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["eot_id"] == eos and manifest["tokenizer"]["eos_token"] == "<|endoftext|>"
    assert manifest["tokenizer"]["source"]["files_sha256"] == gpt2_source["sha256"]
    assert manifest["sources"]["math"]["generator"] == "headgeom.samoe.domains.DomainText"


def test_the_sources_tokenizer_is_hash_gated_and_its_eos_a_token(gpt2_source, tmp_path):
    source = {**gpt2_source, "sha256": {**gpt2_source["sha256"], "tokenizer.json": "f" * 64}}
    argv = ["--config-json", json.dumps(_embedded_cfg(source)), "--out-dir", str(tmp_path / "a"),
            "--no-progress"]  # fmt: skip
    refused = r"tokenizer.json: SHA-256 is [0-9a-f]{64} but config families.smollm2.source"
    with pytest.raises(SystemExit, match=refused + r".sha256 records f{64}"):
        samoe_hub_corpus.main(argv)
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").iterdir())
    argv = ["--config-json", json.dumps(_embedded_cfg(gpt2_source, eos_token="<|nosuch|>")),
            "--out-dir", str(tmp_path / "b"), "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit, match=r"eos_token = '<\|nosuch\|>': not a token"):
        samoe_hub_corpus.main(argv)
