"""Word lists shared by the task generators (docs §8) and the embedded demo corpus.

Every word that fills a task slot is a single GPT-2 token in the form the prompt uses
(leading space for prose words; bare *and* spaced for Quote words, which appear both right
after an opening quote and after a space). Both forms of a noun pair are single tokens, so
every prompt of a task has the same token length. ``tests/unit/test_tasks.py`` verifies this
with the real tokenizer.

Each task's slots are partitioned DISJOINTLY across the four splits (docs §8.1);
the demo corpus uses every word of every split, as FineWeb covers all words.
The per-split counts below are defaults; callers may override them (``partition_counts``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from headgeom.vocabulary import SPLITS

DEFAULT_SPLIT_SIZES = {"discovery": 300, "validation": 240, "evaluation": 240, "holdout": 32}


def _pairs(words: str) -> tuple[tuple[str, str], ...]:
    """Regular nouns as (singular, plural) with the GPT-2 leading space."""
    return tuple((f" {w}", f" {w}s") for w in words.split())


def _spaced(words: str) -> tuple[str, ...]:
    return tuple(f" {w}" for w in words.split())


# --- SVA (docs §8.2): The [subject] [prep.] the [attractor] -> " is" / " are" ---------------
SVA_SUBJECTS = _pairs(
    "author teacher doctor farmer singer pilot lawyer nurse player writer officer driver "
    "student artist soldier"
)
SVA_ATTRACTORS = _pairs(
    "table chair door window bottle plate desk lamp wall tree car house bridge tower gate "
    "fence cabinet curtain mirror clock basket candle road hill"
)
SVA_PREPOSITIONS = _spaced(
    "near behind beside with by under above below across inside beyond around"
)

SVA_VERBS = (" is", " are")  # singular, plural: the answer tokens

# --- Quote (docs §8.3): {var1} = {q1}{word}{q1}\n{var2} = {q2}{w1} {w2} -> q2 ----------------
# Variable names are bare (they start a line); words are stored bare and used bare after an
# opening quote and with a leading space as the last word of the target string.
QUOTE_FIRST_VARS = tuple(
    "name title label text note prefix key value mode path color msg tag kind status data "
    "item result source target query url host user email size width style".split()
)
QUOTE_SECOND_VARS = tuple(
    "height font format version token index count level score price date time message "
    "content body header type flag state error output input model field column page unit "
    "group role action".split()
)
QUOTE_WORDS = tuple(
    "song story book river moon stone window paper glass water fire rain wind night day "
    "morning winter forest wood sea lake cloud star sun tree leaf flower rose grass sand "
    "bread apple bell music dream heart gold silver".split()
)
QUOTE_CHARS = ('"', "'")  # answer tokens: '"' is GPT-2 id 1, "'" is id 6

# --- Plural (docs §8.4): She bought two cats and one small red -> " cat" / " cats" ---------
PLURAL_NOUNS = _pairs(
    "cat dog bird horse cow pig goat duck chicken frog snake rat lion tiger bear rabbit monkey "
    "bee ant spider worm bug dragon robot monster ghost apple egg banana carrot onion grape "
    "bean nut seed cookie cake pie cup bowl pot pan jar fork ball toy doll book pen card coin "
    "ring gift hat coat shirt sock glove boot skirt jacket belt button flag stamp ticket drum "
    "guitar bell rocket bike boat ship train plane truck van taxi blanket towel brick tile"
)
PLURAL_SIZE_ADJECTIVES = _spaced("small big large tiny huge little tall short long wide thin")
PLURAL_COLOUR_ADJECTIVES = _spaced(
    "red blue green black white brown yellow pink gray purple orange"
)
# Shared frame words: too few to partition, and they carry no answer information.
PLURAL_SUBJECTS = ("She", "He")
PLURAL_VERBS = _spaced("bought saw found")
PLURAL_NUMERALS = (" one", " two")  # singular, plural

# --- Filler for the demo corpus (never in a task prompt) -----------------------------------------
SVA_PREDICATES = _spaced("happy here ready late tired busy quiet right wrong away new old")
FILLER_NAMES = tuple("Anna Tom Maria Sam Lucy Ben Emma Jack Nina Paul Sara Leo".split())
FILLER_PLACES = _spaced("park market station library kitchen garden beach museum school office")
FILLER_TIMES = _spaced("today yesterday tomorrow again later early")
FILLER_ADJECTIVES = _spaced("quiet bright warm cold busy calm strange simple pleasant long")
FILLER_NOUNS = _spaced("weather music lunch dinner movie game answer problem plan letter")
FILLER_VERBS_PAST = _spaced("liked visited painted cleaned opened closed watched remembered")
CODE_NUMBER_VARS = tuple("total limit offset step depth retries".split())

# Slots per task. The first slot is the task's lexical group (docs §8.1, §12.6).
TASK_SLOTS: dict[str, dict[str, tuple[Any, ...]]] = {
    "sva": {
        "subjects": SVA_SUBJECTS,
        "attractors": SVA_ATTRACTORS,
        "prepositions": SVA_PREPOSITIONS,
    },
    "quote": {
        "first_vars": QUOTE_FIRST_VARS,
        "second_vars": QUOTE_SECOND_VARS,
        "words": QUOTE_WORDS,
    },
    "plural": {
        "nouns": PLURAL_NOUNS,
        "size_adjectives": PLURAL_SIZE_ADJECTIVES,
        "colour_adjectives": PLURAL_COLOUR_ADJECTIVES,
    },
}
GROUP_SLOT = {"sva": "subjects", "quote": "first_vars", "plural": "nouns"}

# Stand-ins for items that are not single tokens under another tokenizer, taken after a
# slot's unused leftovers (``headgeom.data.tasks.fit_partition``). Outside the partitioned
# pools and the demo corpus, so GPT-2 datasets and the corpus never see them; single tokens
# under GPT-2 and SmolLM2 alike, and distinct from every word of their task.
RESERVE: dict[str, dict[str, tuple[Any, ...]]] = {
    "sva": {
        "subjects": _pairs("manager dancer worker reader speaker editor builder"),
        "attractors": _pairs("screen sign pillar statue barrel cart post"),
        "prepositions": _spaced("toward along against within outside"),
    },
    "quote": {
        "first_vars": tuple("env cfg tmp buf obj ctx".split()),
        "second_vars": tuple("val ref src doc img pos".split()),
        "words": tuple("home life world game love side hand face room road voice light".split()),
    },
    "plural": {
        "nouns": _pairs("cap bag tent net map bucket basket candle"),
        "size_adjectives": _spaced("giant narrow"),
        "colour_adjectives": _spaced("violet silver golden"),
    },
}
# Words every example needs as single tokens that no lexicon item can stand in for: the
# answers of SVA and Quote, and Plural's flipped numeral (a task's frame).
FIXED_SINGLE_TOKEN_WORDS = {"sva": SVA_VERBS, "quote": QUOTE_CHARS, "plural": PLURAL_NUMERALS}
# Slots that each example draws several distinct items from (Quote: word, w1, w2).
MIN_ITEMS_PER_SPLIT = {("quote", "words"): 3}


def slot_forms(task: str, slot: str, item: Any) -> list[str]:
    """The strings an item takes in a task's prompts, each of which must be one token: the
    stored words (spaced prose words, bare variable names); Quote's words also appear
    spaced (the open string's last word), as the demo corpus uses them."""
    words = item_words(item)
    if (task, slot) == ("quote", "words"):
        return [form for w in words for form in (w, f" {w}")]
    return words


# Per-split item counts. Group slots give METHODS' evaluation counts (4 subject pairs,
# 8 first variable names, 24 nouns); other splits scale with their size.
DEFAULT_PARTITION_COUNTS: dict[str, dict[str, dict[str, int]]] = {
    "sva": {
        "subjects": {"discovery": 5, "validation": 4, "evaluation": 4, "holdout": 2},
        "attractors": {"discovery": 8, "validation": 6, "evaluation": 6, "holdout": 4},
        "prepositions": {"discovery": 4, "validation": 3, "evaluation": 3, "holdout": 2},
    },
    "quote": {
        "first_vars": {"discovery": 10, "validation": 8, "evaluation": 8, "holdout": 2},
        "second_vars": {"discovery": 10, "validation": 8, "evaluation": 8, "holdout": 4},
        "words": {"discovery": 12, "validation": 10, "evaluation": 10, "holdout": 6},
    },
    "plural": {
        "nouns": {"discovery": 30, "validation": 24, "evaluation": 24, "holdout": 4},
        "size_adjectives": {"discovery": 3, "validation": 3, "evaluation": 3, "holdout": 2},
        "colour_adjectives": {"discovery": 3, "validation": 3, "evaluation": 3, "holdout": 2},
    },
}


def resolve_partition_counts(
    task: str, overrides: Mapping[str, Mapping[str, int]] | None = None
) -> dict[str, dict[str, int]]:
    """Defaults for ``task`` with ``overrides`` ({slot: {split: count}}) applied and checked."""
    if task not in TASK_SLOTS:
        raise ValueError(f"unknown task {task!r}; allowed: {sorted(TASK_SLOTS)}")
    counts = {slot: dict(c) for slot, c in DEFAULT_PARTITION_COUNTS[task].items()}
    if not isinstance(overrides or {}, Mapping):
        raise ValueError(
            f"partition_counts.{task} = {overrides!r}: must map slot -> split -> count"
        )
    for slot, per_split in (overrides or {}).items():
        if slot not in counts:
            raise ValueError(
                f"partition_counts.{task}: unknown slot {slot!r}; allowed: {sorted(counts)}"
            )
        if not isinstance(per_split, Mapping):
            raise ValueError(
                f"partition_counts.{task}.{slot} = {per_split!r}: must map split -> count"
            )
        for split, n in per_split.items():
            if split not in SPLITS:
                raise ValueError(
                    f"partition_counts.{task}.{slot}: unknown split {split!r}; "
                    f"allowed: {list(SPLITS)}"
                )
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"partition_counts.{task}.{slot}.{split} = {n!r}: must be an integer >= 1"
                )
            counts[slot][split] = n
    for slot, per_split in counts.items():
        pool = len(TASK_SLOTS[task][slot])
        if sum(per_split.values()) > pool:
            raise ValueError(
                f"partition_counts.{task}.{slot} = {per_split} needs {sum(per_split.values())} "
                f"items but the lexicon has {pool}"
            )
    return counts


def partition_lexicon(
    task: str, seed: int, counts: Mapping[str, Mapping[str, int]] | None = None
) -> dict[str, dict[str, list[Any]]]:
    """Disjoint lexical items per split: {split: {slot: [items]}} (+ "unused" leftovers).

    Each slot's pool is shuffled with a generator seeded by (task, seed) and cut into
    consecutive runs, so the splits never share an item (docs §8.1).
    """
    counts = resolve_partition_counts(task, counts)
    # a fixed stream name (the module's name before headgeom.data existed), not a path:
    # renaming it would change every dataset drawn from it
    rng = random.Random(f"headgeom.lexicon.partition:{task}:{seed}")
    out: dict[str, dict[str, list[Any]]] = {s: {} for s in (*SPLITS, "unused")}
    for slot, pool in TASK_SLOTS[task].items():
        items = list(pool)
        rng.shuffle(items)
        start = 0
        for split in SPLITS:
            n = counts[slot][split]
            out[split][slot] = items[start : start + n]
            start += n
        out["unused"][slot] = items[start:]
    return out


def item_words(item: Any) -> list[str]:
    """The word strings of a lexicon item (a pair gives both forms)."""
    return list(item) if isinstance(item, tuple | list) else [item]


def group_label(item: Any) -> str:
    """Readable lexical-group name: " author"/" authors" -> "author/authors"."""
    return "/".join(w.strip() for w in item_words(item))
