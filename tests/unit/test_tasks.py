"""SVA, Quote and Plural datasets (docs §8): balance, disjoint lexicons, tokenisation."""

from __future__ import annotations

import hashlib
import itertools
import json

import pyarrow.parquet as pq
import pytest

from headgeom.data import lexicon
from headgeom.data.tasks import (
    COLUMNS,
    CONDITIONS,
    TASKS,
    TaskValidationError,
    dataset_sha256,
    generate_task,
    validate_example,
)
from headgeom.data.tokenizer import EOT_ID, decode, encode, load_gpt2_tokenizer
from headgeom.heads.stages import make_tasks as make_tasks_stage
from headgeom.io import read_parquet_metadata

SIZES = {"discovery": 300, "validation": 240, "evaluation": 240, "holdout": 32}
# Tokens every prompt of a task shares; everything else is a partitioned lexical item.
FRAME = {
    "sva": {"The", " the", " is", " are"},
    "quote": {" =", ' "', " '", '"', "'", "\n"},
    "plural": {"She", "He", " bought", " saw", " found", " one", " two", " and"},
}
# Prompt token length per task (all lexicon items are single tokens).
LENGTH = {"sva": 5, "quote": 11, "plural": 8}


@pytest.fixture(scope="module")
def tok():
    return load_gpt2_tokenizer()


@pytest.fixture(scope="module")
def datasets(tok):
    return {task: generate_task(task, tok, {"seed": 7})[0] for task in TASKS}


# --- lexicon -------------------------------------------------------------------------------


def test_lexicon_words_are_single_tokens(tok):
    def single(text):
        return len(encode(tok, text)) == 1

    for task, slots in lexicon.TASK_SLOTS.items():
        everything = [w for items in slots.values() for i in items for w in lexicon.item_words(i)]
        assert len(set(everything)) == len(everything), f"{task}: a word fills two slots"
        for slot, items in slots.items():
            words = [w for item in items for w in lexicon.item_words(item)]
            for word in words:
                if task == "quote":  # bare (after a quote, or starting a line) and spaced
                    assert single(word) and single(" " + word), (slot, word)
                else:
                    assert word.startswith(" ") and single(word), (slot, word)
    frame_words = [*lexicon.SVA_VERBS, *lexicon.PLURAL_NUMERALS, *lexicon.PLURAL_VERBS]
    assert all(single(w) for w in [*frame_words, *lexicon.PLURAL_SUBJECTS, *lexicon.QUOTE_CHARS])
    assert [encode(tok, q)[0] for q in lexicon.QUOTE_CHARS] == [1, 6]


def test_default_partition_counts_match_methods():
    evaluation = {
        task: lexicon.DEFAULT_PARTITION_COUNTS[task][lexicon.GROUP_SLOT[task]]["evaluation"]
        for task in TASKS
    }
    assert evaluation == {"sva": 4, "quote": 8, "plural": 24}
    for task in TASKS:  # defaults fit the pools
        lexicon.resolve_partition_counts(task)


def test_partition_is_disjoint_and_seeded():
    for task in TASKS:
        part = lexicon.partition_lexicon(task, seed=3)
        for slot in lexicon.TASK_SLOTS[task]:
            chunks = [part[s][slot] for s in (*lexicon.SPLITS, "unused")]
            flat = [item for chunk in chunks for item in chunk]
            assert sorted(flat) == sorted(lexicon.TASK_SLOTS[task][slot])
        assert lexicon.partition_lexicon(task, seed=3) == part
        assert lexicon.partition_lexicon(task, seed=4) != part


# --- generated datasets ----------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_balanced_conditions_and_sizes(task, datasets):
    df = datasets[task]
    assert list(df.columns) == list(COLUMNS)
    assert df["example_id"].tolist() == list(range(len(df)))
    counts = df.groupby(["split", "condition"]).size()
    for split, n in SIZES.items():
        for cond in CONDITIONS[task]:
            assert counts[(split, cond)] == n // 4, (split, cond)
    assert not df.duplicated(["split", "clean_text"]).any()


@pytest.mark.parametrize(
    ("task", "n_groups", "per_group"), [("sva", 4, 60), ("quote", 8, 30), ("plural", 24, 10)]
)
def test_evaluation_lexical_groups(task, n_groups, per_group, datasets):
    ev = datasets[task].query("split == 'evaluation'")
    assert ev["lexical_group"].value_counts().tolist() == [per_group] * n_groups
    if task == "sva":  # 15 per condition per subject pair (docs §8.2)
        assert set(ev.groupby(["lexical_group", "condition"]).size()) == {15}


@pytest.mark.parametrize("task", TASKS)
def test_lexical_items_disjoint_across_splits(task, datasets, tok):
    df = datasets[task]
    words = {}
    for split, part in df.groupby("split"):
        ids = {i for col in ("clean_ids", "ref_ids", "correct_id") for i in part[col].explode()}
        texts = {decode(tok, [i]) for i in ids} - FRAME[task]
        words[split] = {w.strip().removesuffix("s") for w in texts}  # a noun pair is one item
        groups = set(part["lexical_group"])
        assert (
            len(groups) == lexicon.DEFAULT_PARTITION_COUNTS[task][lexicon.GROUP_SLOT[task]][split]
        )
    for a, b in itertools.combinations(words, 2):
        assert not words[a] & words[b], (a, b, words[a] & words[b])


@pytest.mark.parametrize("task", TASKS)
def test_tokenisation_constraints(task, datasets, tok):
    for row in datasets[task].itertuples():
        clean, ref = list(row.clean_ids), list(row.ref_ids)
        assert encode(tok, row.clean_text) == clean and decode(tok, clean) == row.clean_text
        assert encode(tok, row.ref_text) == ref and decode(tok, ref) == row.ref_text
        assert len(clean) == len(ref) == LENGTH[task]
        diffs = [i for i, (a, b) in enumerate(zip(clean, ref, strict=True)) if a != b]
        assert diffs == [row.diff_position]
        assert encode(tok, row.correct_text) == [row.correct_id]
        assert encode(tok, row.incorrect_text) == [row.incorrect_id]
        # The answer follows the prompt as its own token.
        assert encode(tok, row.clean_text + row.correct_text) == clean + [row.correct_id]


def _words(text: str) -> list[str]:
    return text.replace("\n", " ").split()


def test_sva_answers_follow_the_subject(datasets):
    plural = {w.strip() for _, w in lexicon.SVA_SUBJECTS}
    for row in datasets["sva"].itertuples():
        the, subject, _prep, the2, attractor = _words(row.clean_text)
        assert (the, the2, row.diff_position) == ("The", "the", 1)
        subj_pl, attr_pl = subject in plural, attractor.endswith("s")
        assert row.condition == "SP"[subj_pl] + "SP"[attr_pl]
        assert row.correct_text == (" are" if subj_pl else " is")
        ref_subject = _words(row.ref_text)[1]
        assert (ref_subject in plural) != subj_pl  # the reference flips the number
        assert row.ref_text.replace(ref_subject, subject, 1) == row.clean_text


def test_quote_answer_is_the_target_opening_quote(datasets, tok):
    name = {'"': "double", "'": "single"}
    for row in datasets["quote"].itertuples():
        line1, line2 = row.clean_text.split("\n")
        q1, q2 = line1.split(" = ")[1][0], line2.split(" = ")[1][0]
        assert line1.endswith(q1) and row.condition == f"{name[q1]}-{name[q2]}"
        assert row.correct_text == q2 and row.incorrect_text != q2
        assert row.lexical_group == line1.split(" = ")[0]
        ref_line2 = row.ref_text.split("\n")[1]
        assert ref_line2.split(" = ")[1][0] == row.incorrect_text
        # The differing token is the target's opening quote, ' "' (366) or " '" (705).
        assert {row.clean_ids[row.diff_position], row.ref_ids[row.diff_position]} == {366, 705}


def test_plural_answer_follows_the_second_numeral(datasets):
    for row in datasets["plural"].itertuples():
        _subj, _verb, num1, noun1, and_, num2, _size, _colour = _words(row.clean_text)
        assert and_ == "and" and row.condition == f"{num1}-{num2}"
        singular = row.lexical_group.split("/")[0]
        assert noun1 == (singular + "s" if num1 == "two" else singular)
        assert row.correct_text.strip() == (singular + "s" if num2 == "two" else singular)
        assert row.incorrect_text.strip() != row.correct_text.strip()
        assert _words(row.ref_text)[5] == {"one": "two", "two": "one"}[num2]
        assert row.diff_position == 5


def test_determinism_seed_and_prepend_eot(tok, datasets):
    small = {"seed": 7, "splits": {"discovery": 8, "validation": 8, "evaluation": 8, "holdout": 4}}
    a, part_a = generate_task("plural", tok, small)
    b, part_b = generate_task("plural", tok, small)
    assert dataset_sha256(a) == dataset_sha256(b) and part_a == part_b
    c, _ = generate_task("plural", tok, {**small, "seed": 8})
    assert dataset_sha256(c) != dataset_sha256(a)
    eot, _ = generate_task("plural", tok, {**small, "prepend_eot": True})
    assert all(ids[0] == EOT_ID for ids in eot["clean_ids"])
    assert all(ids[0] == EOT_ID for ids in eot["ref_ids"])
    assert (eot["diff_position"] == a["diff_position"] + 1).all()
    assert (eot["correct_id"] == a["correct_id"]).all()


def test_config_errors_and_partition_override(tok):
    with pytest.raises(ValueError, match="multiple of 4"):
        generate_task("sva", tok, {"seed": 1, "splits": {"holdout": 30}})
    with pytest.raises(ValueError, match="unknown keys"):
        generate_task("sva", tok, {"seed": 1, "sede": 2})
    with pytest.raises(ValueError, match="needs 16 items but the lexicon has 15"):
        generate_task("sva", tok, {"seed": 1, "partition_counts": {"subjects": {"holdout": 3}}})
    counts = {"subjects": {"evaluation": 3}}
    splits = {"evaluation": 36}
    df, part = generate_task("sva", tok, {"seed": 1, "splits": splits, "partition_counts": counts})
    assert df.query("split == 'evaluation'")["lexical_group"].nunique() == 3
    assert len(part["evaluation"]["subjects"]) == 3 and len(part["unused"]["subjects"]) == 1


# --- validator -----------------------------------------------------------------------------


def test_validator_accepts_a_good_example(tok):
    ex = validate_example(
        tok, "The author near the tables", "The authors near the tables", " is", " are"
    )
    assert ex.diff_position == 1 and (ex.correct_id, ex.incorrect_id) == (318, 389)
    assert issubclass(TaskValidationError, ValueError)


@pytest.mark.parametrize(
    ("clean", "ref", "correct", "incorrect", "message"),
    [
        ("The author near the tables", "The authors near the big tables", " is", " are", "tokens"),
        ("The author near the table", "The authors near the tables", " is", " are", "differ at 2"),
        ("The author near the table", "The author near the table", " is", " are", "differ at 0"),
        ("The author near the table", "The authors near the table", " is", " are not", "2 tokens"),
        ("The author near the table", "The authors near the table", " is", " is", "both"),
        ("We saw the", "We saw a", "m", "n", "merges"),
    ],
)
def test_validator_rejects(tok, clean, ref, correct, incorrect, message):
    with pytest.raises(TaskValidationError, match=message):
        validate_example(tok, clean, ref, correct, incorrect)


# --- CLI -----------------------------------------------------------------------------------


def test_make_tasks_cli(tmp_path):
    make_tasks = make_tasks_stage
    out = tmp_path / "tasks" / "quote.parquet"
    cfg = {"seed": 5, "splits": {"discovery": 16, "validation": 8, "evaluation": 8, "holdout": 4}}
    assert (
        make_tasks.main(["--task", "quote", "--config-json", json.dumps(cfg), "--out", str(out)])
        == 0
    )

    table = pq.read_table(out)
    types = {f.name: str(f.type) for f in table.schema}
    assert types["clean_ids"] == "list<element: int32>" and types["correct_id"] == "int32"
    assert types["example_id"] == "int32" and "string" in types["split"]
    assert all(f.metadata and f.metadata[b"description"] for f in table.schema)

    meta = read_parquet_metadata(out)
    assert meta["task"] == "quote" and json.loads(meta["generator_seed"]) == 5
    config = json.loads(meta["config"])
    assert config["splits"] == cfg["splits"] and config["prepend_eot"] is False
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert meta["config_hash"] == hashlib.sha256(canonical.encode()).hexdigest()

    # dataset_sha256: canonical JSON of the records, recomputed from the file alone.
    records = table.to_pylist()
    canonical = json.dumps(records, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert meta["dataset_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()

    partition = json.loads(meta["lexicon_partition"])
    for split, part in table.to_pandas().groupby("split", observed=True):
        assert set(part["lexical_group"]) <= set(partition[split]["first_vars"])


@pytest.mark.parametrize("task", ["sva", "quote", "plural"])
def test_the_partition_stream_keeps_its_name(task):
    """The partition is drawn from the stream "headgeom.lexicon.partition:<task>:<seed>"
    (data, not a module path: moving the module must not change a single dataset)."""
    import random

    slot, pool = next(iter(lexicon.TASK_SLOTS[task].items()))
    items = list(pool)
    random.Random(f"headgeom.lexicon.partition:{task}:7").shuffle(items)
    n = lexicon.resolve_partition_counts(task)[slot]["discovery"]
    assert lexicon.partition_lexicon(task, 7)["discovery"][slot] == items[:n]
