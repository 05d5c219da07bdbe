"""The three tasks under a tokenizer other than GPT-2 (docs §8.1): single-token checks, lexicon
replacements, drops and refusals counted by hand, the tokenizer's hash, and GPT-2's datasets
unchanged.

The second tokenizer is ``tests.helpers.tokenizers.metaspace_tokenizer`` (a metaspace
WordPiece vocabulary we write: a word is one token exactly when its "▁" spelling is in it)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from headgeom.data import lexicon, tasks
from headgeom.data.tasks import (
    TASKS,
    TaskValidationError,
    build_task,
    c7_mismatches,
    dataset_sha256,
    validate_example,
)
from headgeom.data.tokenizer import encode, load_gpt2_tokenizer, tokenizer_sha256
from headgeom.heads.stages import make_tasks
from headgeom.io import read_parquet_metadata
from tests.helpers.tokenizers import metaspace_tokenizer

SMALL = {"discovery": 16, "validation": 8, "evaluation": 8, "holdout": 4}


@pytest.fixture(scope="module")
def meta_tok():
    return metaspace_tokenizer()


def test_the_test_tokenizer_marks_spaces_its_own_way(meta_tok):
    enc = meta_tok.encode("The authors near the", add_special_tokens=False)
    assert enc.tokens == ["The", "▁authors", "▁near", "▁the"]
    assert len(encode(meta_tok, " is")) == 1 and len(encode(meta_tok, "song")) == 1
    assert metaspace_tokenizer(without=[" authors"]).encode(" authors").tokens == [
        "▁author",
        "##s",
    ]


# --- single-token checks ---------------------------------------------------------------------


def test_every_lexicon_and_reserve_item_is_single_token_under_gpt2_and_distinct():
    gpt2 = load_gpt2_tokenizer()
    for task in TASKS:
        words = [
            w
            for pools in (lexicon.TASK_SLOTS[task], lexicon.RESERVE[task])
            for items in pools.values()
            for item in items
            for w in lexicon.item_words(item)
        ]
        assert len(set(words)) == len(words), f"{task}: a reserve word repeats a task word"
        for slot, items in lexicon.RESERVE[task].items():
            for item in items:
                for form in lexicon.slot_forms(task, slot, item):
                    assert len(encode(gpt2, form)) == 1, (task, slot, form)


@pytest.mark.parametrize(
    ("clean", "ref", "correct", "incorrect", "reason"),
    [
        ("The author near the tables", "The authors near the big tables", " is", " are",
         "length_mismatch"),
        ("The author near the table", "The authors near the tables", " is", " are",
         "not_one_differing_token"),
        ("The author near the table", "The authors near the table", " is", " are not",
         "answer_not_single_token"),
        ("The author near the table", "The authors near the table", " is", " is", "same_answer"),
        ("We saw the", "We saw a", "m", "n", "answer_merges"),
    ],
)  # fmt: skip
def test_each_refusal_names_its_reason(clean, ref, correct, incorrect, reason):
    with pytest.raises(TaskValidationError) as err:
        validate_example(load_gpt2_tokenizer(), clean, ref, correct, incorrect)
    assert err.value.reason == reason and reason in tasks.REFUSAL_REASONS


def test_a_metaspace_answer_is_checked_by_its_own_encoding(meta_tok):
    ex = validate_example(meta_tok, "The author by the cart", "The authors by the cart", " is",
                          " are")  # fmt: skip
    assert (ex.correct_id, ex.incorrect_id) == tuple(
        meta_tok.token_to_id(w) for w in ("▁is", "▁are")
    )
    without_is = metaspace_tokenizer(without=[" is"])
    with pytest.raises(TaskValidationError, match=r"correct answer ' is' is 3 tokens"):
        validate_example(without_is, "The author by the cart", "The authors by the cart", " is",
                         " are")  # fmt: skip


def test_a_fixed_answer_that_is_not_one_token_refuses_the_task():
    with pytest.raises(TaskValidationError, match=r"sva: ' are' is 4 tokens .* no substitute"):
        build_task("sva", metaspace_tokenizer(without=[" are"]), {"seed": 1, "splits": SMALL})
    # Quote's answers are fixed too; Plural's fixed word is the numeral it flips
    with pytest.raises(TaskValidationError, match="plural: ' two'"):
        build_task("plural", metaspace_tokenizer(without=[" two"]), {"seed": 1, "splits": SMALL})


# --- replacements, drops, refusals: counted by hand --------------------------------------------


def test_sva_replacement_from_the_reserve_and_a_drop():
    # The default counts use all 15 subject pairs and all 24 attractors: nothing is unused,
    # so stand-ins come from the reserve, in its order.
    part = lexicon.partition_lexicon("sva", 1)
    subject = part["evaluation"]["subjects"][0]
    attractor = part["holdout"]["attractors"][0]
    reserve_subjects = lexicon.RESERVE["sva"]["subjects"]
    without = [
        subject[1],  # the plural alone fails: the pair is replaced
        reserve_subjects[0][0],  # the first reserve pair fails too: the second stands in
        attractor[0],
        *(a[0] for a in lexicon.RESERVE["sva"]["attractors"]),  # no stand-in left: dropped
    ]
    tok = metaspace_tokenizer(without=without)
    built = build_task("sva", tok, {"seed": 1, "splits": SMALL})

    assert built.fit.counts() == {
        "replaced": {"subjects": 1},
        "dropped": {"attractors": 1},
        "refused": {},
    }
    assert built.fit.replacements == [
        {"split": "evaluation", "slot": "subjects", "item": lexicon.group_label(subject),
         "replacement": lexicon.group_label(reserve_subjects[1]), "from": "reserve"},
    ]  # fmt: skip
    assert built.fit.drops == [
        {"split": "holdout", "slot": "attractors", "item": lexicon.group_label(attractor)}
    ]
    evaluation = [reserve_subjects[1], *part["evaluation"]["subjects"][1:]]
    assert built.partition["evaluation"]["subjects"] == evaluation  # replaced in place
    assert built.partition["holdout"]["attractors"] == part["holdout"]["attractors"][1:]
    df = built.frame
    groups = set(df.query("split == 'evaluation'")["lexical_group"])
    assert groups == {lexicon.group_label(s) for s in evaluation}
    assert not df["clean_text"].str.contains(subject[1] + " ").any()
    assert not df["clean_text"].str.contains(attractor[0] + "$").any()
    assert len(set(map(len, df["clean_ids"]))) == 1  # every item one token: one length
    assert c7_mismatches(df, tok) == 0


def test_quote_replacement_from_the_unused_leftovers():
    counts = {"words": {s: 4 for s in lexicon.SPLITS}}  # 16 of 38 words: 22 left unused
    cfg = {"seed": 2, "splits": SMALL, "partition_counts": counts}
    part = lexicon.partition_lexicon("quote", 2, counts)
    unused = part["unused"]["words"]
    word = part["validation"]["words"][1]
    # the spaced form alone fails (the open string's last word), bare is fine
    tok = metaspace_tokenizer(without=[" " + word, " " + unused[0]])
    built = build_task("quote", tok, cfg)

    assert built.fit.counts() == {"replaced": {"words": 1}, "dropped": {}, "refused": {}}
    assert built.fit.replacements == [
        {"split": "validation", "slot": "words", "item": word, "replacement": unused[1],
         "from": "unused"},
    ]  # fmt: skip
    assert built.partition["validation"]["words"][1] == unused[1]
    # the stand-in leaves the unused leftovers; the failing leftover stays there
    assert built.partition["unused"]["words"] == [unused[0], *unused[2:]]
    assert c7_mismatches(built.frame, tok) == 0


def test_refusals_are_counted_by_reason(monkeypatch):
    # " two small" as one token: a prompt with it is one token shorter than its pair, so
    # every draw with the size adjective " small" is refused (length) and redrawn.
    calls: list[tuple[str, str, bool]] = []
    real = tasks.validate_example

    def spy(tok, clean, ref, correct, incorrect):
        try:
            ex = real(tok, clean, ref, correct, incorrect)
        except TaskValidationError:
            calls.append((clean, ref, False))
            raise
        calls.append((clean, ref, True))
        return ex

    monkeypatch.setattr(tasks, "validate_example", spy)
    cfg = {"seed": 3, "splits": {"discovery": 32, "validation": 32, "evaluation": 32, "holdout": 8}}
    built = build_task("plural", metaspace_tokenizer(phrases=[" two small"]), cfg)

    refused = [c for c in calls if not c[2]]
    assert built.fit.counts()["refused"] == {"length_mismatch": len(refused)}
    assert len(refused) > 0
    assert all(" two small" in clean + ref for clean, ref, _ in refused)
    assert not any(" two small" in clean + ref for clean, ref, ok in calls if ok)
    # the plain tokenizer refuses none of the same draws
    assert build_task("plural", metaspace_tokenizer(), cfg).fit.counts()["refused"] == {}


# --- the tokenizer's hash ----------------------------------------------------------------------


def test_tokenizer_hash_is_its_serialised_definition(tmp_path, meta_tok):
    path = tmp_path / "tokenizer.json"
    meta_tok.save(str(path))
    assert tokenizer_sha256(Tokenizer.from_file(str(path))) == tokenizer_sha256(meta_tok)
    assert tokenizer_sha256(meta_tok) == hashlib.sha256(meta_tok.to_str().encode()).hexdigest()
    # one vocabulary entry fewer, or one phrase more: another tokenizer, another hash
    assert tokenizer_sha256(metaspace_tokenizer(without=[" is"])) != tokenizer_sha256(meta_tok)
    assert tokenizer_sha256(metaspace_tokenizer(phrases=[" a b"])) != tokenizer_sha256(meta_tok)


def test_tokenizer_hash_does_not_depend_on_the_process(tmp_path, meta_tok):
    """Rust hash maps hold the vocabulary in a per-process random order: two fresh
    processes with other hash seeds serialise it to the same bytes."""
    path = tmp_path / "tokenizer.json"
    meta_tok.save(str(path))
    code = (
        "import sys; from tokenizers import Tokenizer; "
        "from headgeom.data.tokenizer import tokenizer_sha256; "
        "print(tokenizer_sha256(Tokenizer.from_file(sys.argv[1])))"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, str(path)], env=env,
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert out.stdout.strip() == tokenizer_sha256(meta_tok)


def test_a_transformers_tokenizer_builds_the_same_task(meta_tok):
    transformers = pytest.importorskip("transformers")
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=meta_tok)
    cfg = {"seed": 4, "splits": SMALL}
    # transformers gives its copy a post-processor: another definition, the same encodings
    definition = wrapped.backend_tokenizer.to_str().encode()
    assert tokenizer_sha256(wrapped) == hashlib.sha256(definition).hexdigest()
    assert dataset_sha256(build_task("quote", wrapped, cfg).frame) == dataset_sha256(
        build_task("quote", meta_tok, cfg).frame
    )
    with pytest.raises(TypeError, match="neither a tokenizers.Tokenizer"):
        build_task("quote", object(), cfg)


# --- GPT-2: the same datasets as before ------------------------------------------------------

# dataset_sha256 of the default study's task files (config/config.yaml seeds), written by the
# code before any tokenizer could be chosen (commit a9ffe52); the Parquet files matched byte
# for byte too, with the source freeze held fixed.
GPT2_DEMO = {
    ("sva", 101): "4106396f30fe2a75bed0729703911045b63a94d24c09c1e4766ec0606f86f9d4",
    ("quote", 102): "1da5dedadbdfa4ccb3c2588352b02e081ac0c9e70f7c56ea34a6c281087aefcf",
    ("plural", 103): "eca408833c818f0efb609292e3665bf97201cb05fe1859b739a20ac2390f0a1f",
}


@pytest.mark.parametrize(("task", "seed"), list(GPT2_DEMO))
def test_gpt2_datasets_are_the_previous_codes(task, seed):
    built = build_task(task, load_gpt2_tokenizer(), {"seed": seed})
    assert dataset_sha256(built.frame) == GPT2_DEMO[(task, seed)]
    assert built.fit.counts() == {"replaced": {}, "dropped": {}, "refused": {}}
    partition = lexicon.partition_lexicon(task, seed)
    assert built.partition == partition


# --- the stage -----------------------------------------------------------------------------


def _make(tmp_path, task, tokenizer=None):
    out = tmp_path / f"{task}.parquet"
    argv = ["--task", task, "--config-json", json.dumps({"seed": 1, "splits": SMALL})]
    argv += ["--out", str(out)] + (["--tokenizer", tokenizer] if tokenizer else [])
    assert make_tasks.main(argv) == 0
    return out, read_parquet_metadata(out)


def test_make_tasks_gpt2_metadata_keeps_its_keys(tmp_path):
    _, meta = _make(tmp_path, "plural")
    assert "tokenizer_files_sha256" in meta
    assert not {"tokenizer", "tokenizer_sha256", "tokenizer_fit"} & set(meta)


def test_make_tasks_with_a_tokenizer_json(tmp_path, capsys):
    plural = lexicon.partition_lexicon("sva", 1)["discovery"]["subjects"][0][1]
    tok = metaspace_tokenizer(without=[plural])  # its pair is replaced from the reserve
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    out, meta = _make(tmp_path, "sva", str(path))
    record = json.loads(meta["tokenizer"])
    assert record == {
        "kind": "tokenizer.json",
        "path": str(path),
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    assert meta["tokenizer_sha256"] == tokenizer_sha256(tok)
    fit = json.loads(meta["tokenizer_fit"])
    assert (fit["replaced"], fit["dropped"], fit["refused"]) == ({"subjects": 1}, {}, {})
    assert json.loads(meta["check_C7_mismatches"]) == 0
    ids = pq.read_table(out).column("correct_id").to_pylist()
    assert set(ids) == {tok.token_to_id("▁is"), tok.token_to_id("▁are")}
    assert "replaced 1 (subjects 1), dropped 0, refused 0" in capsys.readouterr().err


def test_make_tasks_with_a_model_directory(tmp_path, meta_tok):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "model"
    transformers.PreTrainedTokenizerFast(tokenizer_object=meta_tok).save_pretrained(folder)
    _, meta = _make(tmp_path, "quote", str(folder))
    record = json.loads(meta["tokenizer"])
    assert record["kind"] == "directory" and "tokenizer.json" in record["files_sha256"]
    want = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    assert record["files_sha256"]["tokenizer.json"] == want


@pytest.mark.parametrize(
    ("value", "message"),
    [("nope.txt", "--tokenizer 'nope.txt': not 'gpt2'"), ("gone.json", "gone.json: no such")],
)
def test_make_tasks_refuses_a_bad_tokenizer(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit):
        _make(tmp_path, "sva", str(tmp_path / value) if value == "gone.json" else value)
    assert message in capsys.readouterr().err
