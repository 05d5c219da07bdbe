"""The three behavioural tasks SVA, Quote and Plural (docs §8).

Each example is a clean/reference prompt pair of equal token length that differs in exactly
one token; that token flips which of two single-token answers is correct. Correct and
incorrect are always defined by the clean prompt. Four conditions per task, balanced in
every split; the lexicon is partitioned disjointly across the splits (``headgeom.data.lexicon``).

The prompt renderers here are also used by the demo corpus, so training text and task
prompts share the exact token-level layout.

Any tokenizer (``tokenizers`` or a ``transformers`` fast tokenizer) builds the tasks. The
lexicon is single-token under GPT-2; under another tokenizer each partitioned item that is
not (``lexicon.slot_forms``) is replaced by an unused (else a reserve) single-token item of
the same slot, or dropped from its split when none is left, and drawn examples that fail
the checks are refused and redrawn; :class:`TokenizerFit` counts all three. Under GPT-2
nothing is replaced, so its datasets are the same bytes as before any of this existed.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from tokenizers import Tokenizer

from headgeom import results
from headgeom.data import lexicon
from headgeom.data.tokenizer import EOT_TEXT, as_tokenizer, encode
from headgeom.hashing import content_hash
from headgeom.vocabulary import SPLITS, TASKS

# Conditions in METHODS' order. SVA: subject number × attractor number. Quote: (first-line
# quote, target quote), D = '"' and S = "'" spelled out. Plural: (first, second) numeral.
CONDITIONS = {
    "sva": ("SS", "SP", "PS", "PP"),
    "quote": ("double-double", "double-single", "single-double", "single-single"),
    "plural": ("one-one", "one-two", "two-one", "two-two"),
}
COLUMNS = tuple(results.TASK.names)  # the task Parquet's columns, in file order
_MAX_DRAWS = 2000  # per example: resampling budget for duplicates and validation failures


class TaskValidationError(ValueError):
    """An example violates the tokenisation constraints of docs §8.1; ``reason`` names which
    (one of ``REFUSAL_REASONS``, or "task" when a whole task cannot be built)."""

    def __init__(self, message: str, reason: str = "task") -> None:
        super().__init__(message)
        self.reason = reason


# Why a drawn example is refused (validate_example), in the order the checks run.
REFUSAL_REASONS = (
    "length_mismatch",  # clean and reference prompts have different token lengths
    "not_one_differing_token",  # they differ at zero or several positions
    "answer_not_single_token",
    "same_answer",  # correct and incorrect answers are the same token
    "answer_merges",  # prompt + answer does not tokenise as prompt ids + answer id
)


# --- prompt renderers (shared with the demo corpus) ---------------------------------------------


def sva_prompt(subject: str, preposition: str, attractor: str) -> str:
    """``The [subject] [prep.] the [attractor]`` (words carry their leading space)."""
    return f"The{subject}{preposition} the{attractor}"


def quote_open_line(var: str, q: str, words: Sequence[str]) -> str:
    """``{var} = {q}w1 w2 ...``: a string assignment left open after its last word."""
    return f"{var} = {q}{' '.join(words)}"


def quote_prompt(var1: str, q1: str, word: str, var2: str, q2: str, w1: str, w2: str) -> str:
    """``{var1} = {q1}{word}{q1}\\n{var2} = {q2}{w1} {w2}``; line 2 is not indented.

    The opening quote after ``= `` is the GPT-2 token ' "' / " '" while the answer is the
    bare quote; ending the open string on the spaced word ``w2`` keeps them apart.
    """
    return quote_open_line(var1, q1, [word]) + q1 + "\n" + quote_open_line(var2, q2, [w1, w2])


def plural_prompt(
    subject: str, verb: str, numeral1: str, noun1: str, numeral2: str, size: str, colour: str
) -> str:
    """``She bought two cats and one small red`` (words carry their leading space)."""
    return f"{subject}{verb}{numeral1}{noun1} and{numeral2}{size}{colour}"


# --- validation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidatedExample:
    clean_ids: list[int]
    ref_ids: list[int]
    diff_position: int
    correct_id: int
    incorrect_id: int


def _single_token(tok: Tokenizer, text: str, role: str) -> int:
    # the tokenizer's own encoding of the text (a leading space is its business: GPT-2's
    # "Ġ", a metaspace "▁", ...): one id, or refused
    ids = encode(tok, text)
    if len(ids) != 1:
        raise TaskValidationError(
            f"{role} answer {text!r} is {len(ids)} tokens {ids}, not 1", "answer_not_single_token"
        )
    return ids[0]


def validate_example(
    tok: Tokenizer, clean_text: str, ref_text: str, correct_text: str, incorrect_text: str
) -> ValidatedExample:
    """Tokenise a clean/reference pair and check docs §8.1 [CHECK]; raise if violated.

    Checks: equal token length, exactly one differing token, both answers single distinct
    tokens, and each prompt followed by its own correct answer tokenises as prompt + answer
    (so the answer token never merges with the last prompt token).
    """
    tok = as_tokenizer(tok)
    clean_ids, ref_ids = encode(tok, clean_text), encode(tok, ref_text)
    if len(clean_ids) != len(ref_ids):
        raise TaskValidationError(
            f"clean {clean_text!r} has {len(clean_ids)} tokens but reference {ref_text!r} "
            f"has {len(ref_ids)}",
            "length_mismatch",
        )
    diffs = [i for i, (a, b) in enumerate(zip(clean_ids, ref_ids, strict=True)) if a != b]
    if len(diffs) != 1:
        raise TaskValidationError(
            f"clean {clean_text!r} and reference {ref_text!r} differ at {len(diffs)} token "
            f"positions {diffs}, not exactly 1",
            "not_one_differing_token",
        )
    correct_id = _single_token(tok, correct_text, "correct")
    incorrect_id = _single_token(tok, incorrect_text, "incorrect")
    if correct_id == incorrect_id:
        raise TaskValidationError(
            f"correct and incorrect answers are both {correct_text!r}", "same_answer"
        )
    # The reference's correct answer is the clean prompt's incorrect one.
    for prompt, ids, answer, answer_id in (
        (clean_text, clean_ids, correct_text, correct_id),
        (ref_text, ref_ids, incorrect_text, incorrect_id),
    ):
        if encode(tok, prompt + answer) != ids + [answer_id]:
            raise TaskValidationError(
                f"answer {answer!r} merges with the end of {prompt!r} under the tokenizer",
                "answer_merges",
            )
    return ValidatedExample(clean_ids, ref_ids, diffs[0], correct_id, incorrect_id)


def c7_mismatches(df: pd.DataFrame, tok: Any) -> int:
    """Check C7 (docs §18) on the stored examples, independently of how they were drawn: the
    number of rows whose clean and reference ids differ in length or not at exactly
    ``diff_position``, whose answers are not distinct single tokens (``correct_text`` →
    ``[correct_id]``), or whose texts do not tokenise to their stored ids."""
    tok = as_tokenizer(tok)
    bad = 0
    for row in df.itertuples(index=False):
        clean, ref = [int(i) for i in row.clean_ids], [int(i) for i in row.ref_ids]
        same_length = len(clean) == len(ref)
        diffs = [i for i, (a, b) in enumerate(zip(clean, ref, strict=False)) if a != b]
        ok = (
            same_length
            and diffs == [int(row.diff_position)]
            and encode(tok, row.correct_text) == [int(row.correct_id)]
            and encode(tok, row.incorrect_text) == [int(row.incorrect_id)]
            and int(row.correct_id) != int(row.incorrect_id)
            and encode(tok, row.clean_text) == clean
            and encode(tok, row.ref_text) == ref
        )
        bad += not ok
    return bad


# --- per-task example construction ----------------------------------------------------------------
# Each builder gets the condition index, the lexical-group item, the split's partition and
# an RNG, and returns (clean, ref, correct, incorrect) texts.

Rendered = tuple[str, str, str, str]


def _build_sva(cond: int, subject: tuple[str, str], part: Mapping, rng: random.Random) -> Rendered:
    subj_plural, attr_plural = divmod(cond, 2)  # SS, SP, PS, PP
    attractor = rng.choice(part["attractors"])[attr_plural]
    prep = rng.choice(part["prepositions"])
    clean = sva_prompt(subject[subj_plural], prep, attractor)
    ref = sva_prompt(subject[1 - subj_plural], prep, attractor)  # flip the subject's number
    is_, are = lexicon.SVA_VERBS
    correct, incorrect = (are, is_) if subj_plural else (is_, are)
    return clean, ref, correct, incorrect


def _build_quote(cond: int, var1: str, part: Mapping, rng: random.Random) -> Rendered:
    first_single, target_single = divmod(cond, 2)  # (first, target) in ('"', "'")²
    q1, q2 = lexicon.QUOTE_CHARS[first_single], lexicon.QUOTE_CHARS[target_single]
    other = lexicon.QUOTE_CHARS[1 - target_single]
    var2 = rng.choice(part["second_vars"])
    word, w1, w2 = rng.sample(part["words"], 3)
    clean = quote_prompt(var1, q1, word, var2, q2, w1, w2)
    ref = quote_prompt(var1, q1, word, var2, other, w1, w2)  # swap the target's opening quote
    return clean, ref, q2, other


def _build_plural(cond: int, noun: tuple[str, str], part: Mapping, rng: random.Random) -> Rendered:
    first_two, second_two = divmod(cond, 2)  # (first, second) numeral in {one, two}²
    one_two = lexicon.PLURAL_NUMERALS
    subject = rng.choice(lexicon.PLURAL_SUBJECTS)
    verb = rng.choice(lexicon.PLURAL_VERBS)
    size = rng.choice(part["size_adjectives"])
    colour = rng.choice(part["colour_adjectives"])
    # The first noun phrase agrees with its numeral; only the second numeral flips.
    args = (subject, verb, one_two[first_two], noun[first_two])
    clean = plural_prompt(*args, one_two[second_two], size, colour)
    ref = plural_prompt(*args, one_two[1 - second_two], size, colour)
    return clean, ref, noun[second_two], noun[1 - second_two]


_BUILDERS: dict[str, Callable[[int, Any, Mapping, random.Random], Rendered]] = {
    "sva": _build_sva,
    "quote": _build_quote,
    "plural": _build_plural,
}


def balanced_cells(n: int, groups: list[Any]) -> list[tuple[int, Any]]:
    """(condition index, group item) for ``n`` examples: n/4 per condition exactly, groups
    as equal as possible overall and within each condition (counts differ by at most 1)."""
    if n % 4:
        raise ValueError(f"split size {n} is not a multiple of 4 (4 balanced conditions)")
    per_cond = n // 4
    # Walk the groups cyclically across the concatenated condition blocks: overall group
    # counts are exact when len(groups) divides n, and each block is a contiguous cycle run.
    return [
        (c, groups[(c * per_cond + j) % len(groups)]) for c in range(4) for j in range(per_cond)
    ]


DEFAULT_TASK_CONFIG: dict[str, Any] = {
    "seed": 1,
    "splits": dict(lexicon.DEFAULT_SPLIT_SIZES),
    "prepend_eot": False,
    "partition_counts": {},
}


def resolve_task_config(task: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """One task's config block with defaults filled; unknown keys or bad values get one
    clear message. ``partition_counts`` ({slot: {split: count}}) is resolved in full."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; allowed: {list(TASKS)}")
    config = dict(config or {})
    unknown = set(config) - set(DEFAULT_TASK_CONFIG)
    if unknown:
        raise ValueError(
            f"tasks.{task}: unknown keys {sorted(unknown)}; allowed: {sorted(DEFAULT_TASK_CONFIG)}"
        )
    out = {**DEFAULT_TASK_CONFIG, **config}
    if not isinstance(out["seed"], int) or isinstance(out["seed"], bool):
        raise ValueError(f"tasks.{task}.seed = {out['seed']!r}: must be an integer")
    if not isinstance(out["prepend_eot"], bool):
        raise ValueError(f"tasks.{task}.prepend_eot = {out['prepend_eot']!r}: must be true/false")
    splits = {**lexicon.DEFAULT_SPLIT_SIZES, **dict(out["splits"])}
    if set(splits) != set(SPLITS):
        raise ValueError(
            f"tasks.{task}.splits: unknown splits {sorted(set(splits) - set(SPLITS))}; "
            f"allowed: {list(SPLITS)}"
        )
    for split, n in splits.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n % 4:
            raise ValueError(
                f"tasks.{task}.splits.{split} = {n!r}: must be a non-negative multiple of 4 "
                "(equal examples in each of the 4 conditions)"
            )
    out["splits"] = {s: splits[s] for s in SPLITS}
    out["partition_counts"] = lexicon.resolve_partition_counts(task, out["partition_counts"])
    return out


# --- fitting the lexicon to a tokenizer ---------------------------------------------------------


@dataclass
class TokenizerFit:
    """What building a task under a tokenizer changed, for the task file and the stage log.

    ``replacements``: partitioned items that are not single tokens, each swapped for the
    first single-token item of the same slot left unused (in the partition's seeded
    order), then for the first of ``lexicon.RESERVE``; ``drops``: such items with no
    single-token item left, removed from their split;
    ``refused``: drawn examples refused by ``validate_example`` (and redrawn), by reason."""

    replacements: list[dict[str, str]] = field(default_factory=list)
    drops: list[dict[str, str]] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)

    def counts(self) -> dict[str, dict[str, int]]:
        """{"replaced": {slot: n}, "dropped": {slot: n}, "refused": {reason: n}}."""
        return {
            "replaced": dict(Counter(r["slot"] for r in self.replacements)),
            "dropped": dict(Counter(d["slot"] for d in self.drops)),
            "refused": {r: self.refused[r] for r in REFUSAL_REASONS if self.refused[r]},
        }

    def record(self) -> dict[str, Any]:
        """The counts plus each replaced and dropped item (task file metadata)."""
        return {**self.counts(), "replacements": self.replacements, "drops": self.drops}

    def summary(self) -> str:
        """One log line: "replaced 2 (subjects 2), dropped 0, refused 3 (answer_merges 3)"."""

        def part(name: str, counts: dict[str, int]) -> str:
            detail = ", ".join(f"{k} {v}" for k, v in counts.items())
            return f"{name} {sum(counts.values())}" + (f" ({detail})" if detail else "")

        c = self.counts()
        return ", ".join(part(k, c[k]) for k in ("replaced", "dropped", "refused"))


def check_fixed_words(task: str, tok: Any) -> None:
    """Refuse a tokenizer under which the task's frame answers (``lexicon.
    FIXED_SINGLE_TOKEN_WORDS``) are not single tokens: no lexicon item can replace them, so
    every example would be refused."""
    tok = as_tokenizer(tok)
    for word in lexicon.FIXED_SINGLE_TOKEN_WORDS[task]:
        ids = encode(tok, word)
        if len(ids) != 1:
            raise TaskValidationError(
                f"{task}: {word!r} is {len(ids)} tokens {ids} under this tokenizer, not 1; the "
                f"task needs {list(lexicon.FIXED_SINGLE_TOKEN_WORDS[task])} as single tokens "
                "and the lexicon has no substitute"
            )


def fit_partition(
    task: str, partition: Mapping[str, Mapping[str, list[Any]]], tok: Any
) -> tuple[dict[str, dict[str, list[Any]]], TokenizerFit]:
    """The partition with every item single-token under ``tok`` (``lexicon.slot_forms``).

    Splits are visited in ``SPLITS`` order and items in partition order; a failing item is
    replaced in place by the next single-token ``unused`` item of its slot, then the next
    single-token ``lexicon.RESERVE`` item, else dropped.
    No randomness, and when every item passes the partition is returned unchanged."""
    tok = as_tokenizer(tok)

    def single(slot: str, item: Any) -> bool:
        return all(len(encode(tok, form)) == 1 for form in lexicon.slot_forms(task, slot, item))

    fit = TokenizerFit()
    slots = list(lexicon.TASK_SLOTS[task])
    spare = {
        slot: [(i, "unused") for i in partition["unused"][slot] if single(slot, i)]
        + [(i, "reserve") for i in lexicon.RESERVE[task][slot] if single(slot, i)]
        for slot in slots
    }
    out: dict[str, dict[str, list[Any]]] = {}
    for split in SPLITS:
        out[split] = {}
        for slot in slots:
            items = []
            for item in partition[split][slot]:
                if single(slot, item):
                    items.append(item)
                    continue
                where = {"split": split, "slot": slot, "item": lexicon.group_label(item)}
                if spare[slot]:
                    new, source = spare[slot].pop(0)
                    items.append(new)
                    label = lexicon.group_label(new)
                    fit.replacements.append({**where, "replacement": label, "from": source})
                else:
                    fit.drops.append(where)
            out[split][slot] = items
            need = lexicon.MIN_ITEMS_PER_SPLIT.get((task, slot), 1)
            if len(items) < need <= len(partition[split][slot]):  # short only by our drops
                dropped = [d["item"] for d in fit.drops if (d["split"], d["slot"]) == (split, slot)]
                raise TaskValidationError(
                    f"{task}/{split}: {len(items)} {slot} single-token under this tokenizer, "
                    f"needs {need}; the lexicon has no more (dropped {dropped})"
                )
    if not fit.replacements and not fit.drops:
        return dict(partition), fit
    taken = {(r["slot"], r["replacement"]) for r in fit.replacements if r["from"] == "unused"}
    out["unused"] = {
        slot: [i for i in partition["unused"][slot] if (slot, lexicon.group_label(i)) not in taken]
        for slot in slots
    }
    return out, fit


# --- generation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltTask:
    """One task's examples (columns ``COLUMNS``), the lexicon partition they were drawn from
    and what the tokenizer changed (:class:`TokenizerFit`)."""

    frame: pd.DataFrame
    partition: dict[str, dict[str, list[Any]]]
    fit: TokenizerFit


def build_task(task: str, tokenizer: Any, config: Mapping[str, Any] | None = None) -> BuiltTask:
    """All splits of one task under ``tokenizer`` (a `tokenizers.Tokenizer` or a
    `transformers` fast tokenizer).

    Deterministic given (task, tokenizer, config). The partition is fitted to the tokenizer
    (:func:`fit_partition`); duplicate prompts within a split and examples that fail
    ``validate_example`` are resampled (the latter counted by reason); if a split's lexicon
    cannot supply enough distinct valid examples the error names the split and lexical group.
    """
    tok = as_tokenizer(tokenizer)
    cfg = resolve_task_config(task, config)
    check_fixed_words(task, tok)
    partition, fit = fit_partition(
        task, lexicon.partition_lexicon(task, cfg["seed"], cfg["partition_counts"]), tok
    )
    group_slot = lexicon.GROUP_SLOT[task]
    build = _BUILDERS[task]
    prefix = EOT_TEXT if cfg["prepend_eot"] else ""
    # a fixed stream name (the module's name before headgeom.data existed), not a path:
    # renaming it would change every dataset drawn from it
    rng = random.Random(f"headgeom.tasks:{task}:{cfg['seed']}")
    rows: list[dict[str, Any]] = []
    for split in SPLITS:
        part = partition[split]
        seen: set[str] = set()
        split_rows = []
        for cond, group in balanced_cells(cfg["splits"][split], part[group_slot]):
            for _ in range(_MAX_DRAWS):
                clean, ref, correct, incorrect = build(cond, group, part, rng)
                clean, ref = prefix + clean, prefix + ref
                if clean in seen:
                    continue
                try:
                    ex = validate_example(tok, clean, ref, correct, incorrect)
                except TaskValidationError as err:
                    fit.refused[err.reason] += 1
                    continue
                break
            else:
                raise TaskValidationError(
                    f"{task}/{split}: no new valid example for condition "
                    f"{CONDITIONS[task][cond]} and group {lexicon.group_label(group)!r} after "
                    f"{_MAX_DRAWS} draws; the split's lexicon is too small for its size"
                )
            seen.add(clean)
            split_rows.append(
                {
                    "split": split,
                    "condition": CONDITIONS[task][cond],
                    "lexical_group": lexicon.group_label(group),
                    "clean_ids": ex.clean_ids,
                    "ref_ids": ex.ref_ids,
                    "diff_position": ex.diff_position,
                    "correct_id": ex.correct_id,
                    "incorrect_id": ex.incorrect_id,
                    "correct_text": correct,
                    "incorrect_text": incorrect,
                    "clean_text": clean,
                    "ref_text": ref,
                }
            )
        # Interleave conditions and groups so any prefix of a split is roughly balanced.
        rng.shuffle(split_rows)
        rows.extend(split_rows)
    for i, row in enumerate(rows):
        row["example_id"] = i
    return BuiltTask(pd.DataFrame(rows, columns=list(COLUMNS)), partition, fit)


def generate_task(
    task: str, tokenizer: Any, config: Mapping[str, Any] | None = None
) -> tuple[pd.DataFrame, dict[str, dict[str, list[Any]]]]:
    """All splits of one task as a DataFrame (columns ``COLUMNS``) plus the lexicon partition
    (:func:`build_task` without its :class:`TokenizerFit`)."""
    built = build_task(task, tokenizer, config)
    return built.frame, built.partition


def generate_sva(tokenizer: Tokenizer, config: Mapping[str, Any] | None = None):
    return generate_task("sva", tokenizer, config)


def generate_quote(tokenizer: Tokenizer, config: Mapping[str, Any] | None = None):
    return generate_task("quote", tokenizer, config)


def generate_plural(tokenizer: Tokenizer, config: Mapping[str, Any] | None = None):
    return generate_task("plural", tokenizer, config)


def example_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Examples as plain-Python dicts (column order ``COLUMNS``), ready for canonical JSON."""
    records = []
    for row in df[list(COLUMNS)].itertuples(index=False):
        rec = {}
        for name, value in zip(COLUMNS, row, strict=True):
            if name in ("clean_ids", "ref_ids"):
                rec[name] = [int(v) for v in value]
            elif isinstance(value, str):
                rec[name] = value
            else:
                rec[name] = int(value)
        records.append(rec)
    return records


def dataset_sha256(df: pd.DataFrame) -> str:
    """SHA-256 of the canonical JSON of the example records (cited by downstream analyses)."""
    return content_hash(example_records(df))
