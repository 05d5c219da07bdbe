"""The embedded demo corpus, vocabulary compaction, token files and hashing (docs §3).

The demo corpus stands in for FineWeb-Edu on a laptop: seeded, English-like prose and
code-like lines in which the three task constructions occur in exactly the task prompts'
token layout, followed by the correct answer, so a small model can learn the rules.
It uses every lexicon word of every split (the task splits partition the lexicon; the corpus,
like FineWeb, covers all of it). Documents are separated by the EOT token (docs §3.2).
Other sources (FineWeb-Edu, local files) live in ``headgeom.data.corpus_sources``; every token file
is written by ``write_tokens`` and read, verified, by ``read_tokens``.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from headgeom import results
from headgeom.data import lexicon as lx
from headgeom.data.tasks import plural_prompt, quote_open_line, sva_prompt
from headgeom.data.tokenizer import EOT_ID, VOCAB_SIZE
from headgeom.io import IntegrityError, read_table
from headgeom.paths import rerun_hint

# Each encode_batch call handles this many documents: large enough to use the Rust
# tokenizer's threads, small enough that the final overshoot past the target is small.
_BATCH_DOCS = 512


# --- document text generator ---------------------------------------------------------------------


class _Deck:
    """Draws items in shuffled rounds, so every item is used once per round (coverage)."""

    def __init__(self, items: Iterable[Any], rng: random.Random):
        self._items = list(items)
        self._rng = rng
        self._stack: list[Any] = []

    def draw(self) -> Any:
        if not self._stack:
            self._stack = self._items.copy()
            self._rng.shuffle(self._stack)
        return self._stack.pop()


class DemoText:
    """Seeded source of demo documents; one instance per document stream."""

    def __init__(self, rng: random.Random):
        self.rng = rng

        def deck(task: str, slot: str) -> _Deck:  # every word of every split, in rounds
            return _Deck(lx.TASK_SLOTS[task][slot], rng)

        self.subjects = deck("sva", "subjects")
        self.attractors = deck("sva", "attractors")
        self.prepositions = deck("sva", "prepositions")
        self.first_vars = deck("quote", "first_vars")
        self.second_vars = deck("quote", "second_vars")
        self.words = deck("quote", "words")
        self.nouns = deck("plural", "nouns")
        self.sizes = deck("plural", "size_adjectives")
        self.colours = deck("plural", "colour_adjectives")

    def sva_line(self) -> str:
        r = self.rng
        subj_plural = r.randrange(2)
        subject = self.subjects.draw()[subj_plural]
        verb = lx.SVA_VERBS[subj_plural] + r.choice(lx.SVA_PREDICATES)
        if r.random() < 0.15:  # bare agreement without an attractor
            return f"The{subject}{verb}."
        attractor = self.attractors.draw()[r.randrange(2)]
        return sva_prompt(subject, self.prepositions.draw(), attractor) + verb + "."

    def plural_line(self) -> str:
        r = self.rng
        noun = self.nouns.draw()
        n1, n2 = r.randrange(2), r.randrange(2)
        prompt = plural_prompt(
            r.choice(lx.PLURAL_SUBJECTS),
            r.choice(lx.PLURAL_VERBS),
            lx.PLURAL_NUMERALS[n1],
            noun[n1],
            lx.PLURAL_NUMERALS[n2],
            self.sizes.draw(),
            self.colours.draw(),
        )
        return prompt + noun[n2] + "."

    def filler_line(self) -> str:
        r = self.rng
        name, place = r.choice(lx.FILLER_NAMES), r.choice(lx.FILLER_PLACES)
        adj, noun = r.choice(lx.FILLER_ADJECTIVES), r.choice(lx.FILLER_NOUNS)
        time, verb = r.choice(lx.FILLER_TIMES), r.choice(lx.FILLER_VERBS_PAST)
        templates = (
            f"It was a{adj} day at the{place}.",
            f"{name}{verb} the{place}{time}.",
            f"{name} said that the{noun} was{adj}.",
            f"We talked about the{noun} at the{place}.",
            f"The{noun} seemed{adj} to {name}.",
            f"{name} and {r.choice(lx.FILLER_NAMES)} met at the{place}{time}.",
            f"I think the{noun} will be{adj}{time}.",
            f"After the{noun}, {name} went to the{place}.",
        )
        return r.choice(templates)

    def code_line(self, index: int) -> str:
        r = self.rng
        if r.random() < 0.1:  # a non-string assignment breaks the pattern now and then
            return f"{r.choice(lx.CODE_NUMBER_VARS)} = {r.randrange(100)}"
        q = r.choice(lx.QUOTE_CHARS)
        if index % 2 == 0:  # task line 1: a first variable and one word
            var, n_words = self.first_vars.draw(), 1
        else:  # task line 2: a second variable and (mostly) two words
            var, n_words = self.second_vars.draw(), 2 if r.random() < 0.8 else r.choice((1, 3))
        # Closed by the quote that opened it: the answer the Quote task asks for.
        return quote_open_line(var, q, [self.words.draw() for _ in range(n_words)]) + q

    def code_document(self) -> str:
        """2–8 assignment lines, the Quote task's pattern."""
        return "\n".join(self.code_line(i) for i in range(self.rng.randint(2, 8)))

    def prose_document(self) -> str:
        """4–12 lines of SVA, Plural and filler sentences."""
        r = self.rng
        kinds = (self.sva_line, self.plural_line, self.filler_line)
        lines = [r.choices(kinds, weights=(0.4, 0.35, 0.25))[0]() for _ in range(r.randint(4, 12))]
        return "\n".join(lines)

    def document(self) -> str:
        # the same draws in the same order as before the two kinds were named: the demo
        # corpus's bytes do not change
        if self.rng.random() < 0.3:
            return self.code_document()
        return self.prose_document()


def iter_demo_texts(seed: int, stream: str = "train") -> Iterator[str]:
    """Endless, deterministic document texts for (seed, stream); streams are independent."""
    # a fixed stream name (the module's name before headgeom.data existed), not a path:
    # renaming it would change every dataset drawn from it
    source = DemoText(random.Random(f"headgeom.corpus.demo:{seed}:{stream}"))
    while True:
        yield source.document()


@dataclass
class Documents:
    """Generated documents: their texts and GPT-2 ids (without the EOT separator)."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[np.ndarray] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        """Tokens once each document is followed by EOT."""
        return sum(len(ids) + 1 for ids in self.token_ids)

    def concatenated(self, n_tokens: int | None = None) -> np.ndarray:
        """Documents each followed by EOT, as uint16, truncated to exactly ``n_tokens``."""
        eot = np.array([EOT_ID], dtype=np.uint16)
        parts = [p for ids in self.token_ids for p in (ids, eot)]
        arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        if n_tokens is not None:
            if len(arr) < n_tokens:
                raise ValueError(f"documents hold {len(arr)} tokens, fewer than {n_tokens}")
            arr = arr[:n_tokens]
        return arr


def generate_demo_documents(
    seed: int,
    n_tokens_target: int,
    tokenizer: Tokenizer,
    *,
    stream: str = "train",
    exclude: set[str] | frozenset[str] = frozenset(),
    progress: Callable[[int], Any] | None = None,
) -> Documents:
    """Documents of ``stream`` until they hold at least ``n_tokens_target`` tokens (with EOTs).

    Documents whose text is in ``exclude`` are skipped (keeps validation out of train).
    ``progress`` is called with the number of tokens each batch adds.
    """
    docs = Documents()
    texts = iter_demo_texts(seed, stream)
    total = 0
    while total < n_tokens_target:
        batch = [t for t in (next(texts) for _ in range(_BATCH_DOCS)) if t not in exclude]
        for text, enc in zip(
            batch, tokenizer.encode_batch(batch, add_special_tokens=False), strict=True
        ):
            if total >= n_tokens_target:
                break
            n = len(enc.ids) + 1
            docs.texts.append(text)
            docs.token_ids.append(np.asarray(enc.ids, dtype=np.uint16))
            if progress is not None:  # counts only tokens that survive truncation
                progress(min(n, n_tokens_target - total))
            total += n
    return docs


def build_demo_corpus(
    seed: int,
    n_train_tokens: int,
    n_val_tokens: int,
    tokenizer: Tokenizer,
    progress: Callable[[int], Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation token arrays (uint16 GPT-2 ids), exactly the requested lengths.

    They come from separate document streams, and a validation document whose text also
    occurs in train is dropped, so no validation document is ever a training document
    (docs §3.4).
    """
    train_docs = generate_demo_documents(
        seed, n_train_tokens, tokenizer, stream="train", progress=progress
    )
    val_docs = generate_demo_documents(
        seed,
        n_val_tokens,
        tokenizer,
        stream="validation",
        exclude=set(train_docs.texts),
        progress=progress,
    )
    return train_docs.concatenated(n_train_tokens), val_docs.concatenated(n_val_tokens)


# --- vocabulary compaction -----------------------------------------------------------------------


def identity_vocab() -> np.ndarray:
    """The full GPT-2 vocabulary: model id == GPT-2 id (compaction off)."""
    return np.arange(VOCAB_SIZE, dtype=np.int32)


def build_vocab(token_arrays: Iterable[np.ndarray], extra_ids: Iterable[int] = ()) -> np.ndarray:
    """Sorted unique GPT-2 ids used (EOT always included): model id i <-> GPT-2 id vocab[i]."""
    seen = np.zeros(VOCAB_SIZE, dtype=bool)  # a bitmap is faster than np.unique on big arrays
    for arr in token_arrays:
        arr = np.asarray(arr)
        if arr.size and (arr.min() < 0 or arr.max() >= VOCAB_SIZE):
            raise ValueError(f"token ids outside the GPT-2 range [0, {VOCAB_SIZE})")
        seen[arr] = True
    extra = np.asarray([EOT_ID, *extra_ids], dtype=np.int64)
    if extra.min() < 0 or extra.max() >= VOCAB_SIZE:
        raise ValueError(f"extra_ids outside the GPT-2 range [0, {VOCAB_SIZE})")
    seen[extra] = True
    return np.flatnonzero(seen).astype(np.int32)


_COMPACT_CHUNK = 1 << 24


def compact(
    ids: Sequence[int] | np.ndarray,
    vocab: np.ndarray,
    tokenizer: Tokenizer | None = None,
    dtype: Any = np.int64,
) -> np.ndarray:
    """Map GPT-2 ids to model ids (positions in the sorted ``vocab``).

    Raises ValueError naming the first GPT-2 id (with its text when a tokenizer is given)
    that the vocabulary lacks, e.g. a task token the demo corpus never used.
    """
    ids = np.asarray(ids)
    vocab = np.asarray(vocab)
    out = np.empty(len(ids), dtype=dtype)
    # Chunks bound the int64 temporaries: corpus S has 1.07e9 tokens (docs §3.3).
    for start in range(0, len(ids), _COMPACT_CHUNK):
        chunk = ids[start : start + _COMPACT_CHUNK].astype(np.int64)
        pos = np.searchsorted(vocab, chunk)
        found = pos < len(vocab)
        found[found] = vocab[pos[found]] == chunk[found]
        if not found.all():
            first = int(chunk[np.argmin(found)])
            text = f" ({tokenizer.decode([first])!r})" if tokenizer is not None else ""
            raise ValueError(
                f"GPT-2 id {first}{text} is not in the model vocabulary ({len(vocab)} ids); "
                "the corpus never uses it — rebuild the vocabulary with it in extra_ids or "
                "turn compact_vocab off"
            )
        out[start : start + len(chunk)] = pos
    return out


def expand(model_ids: Sequence[int] | np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Inverse of ``compact``: model ids back to GPT-2 ids."""
    return np.asarray(vocab)[np.asarray(model_ids, dtype=np.int64)]


# --- hashing ---------------------------------------------------------------------------------


def token_bytes_sha256(arr: np.ndarray) -> str:
    """SHA-256 of the little-endian uint16 bytes of a token array (docs §1: corpus hashes)."""
    arr = np.asarray(arr)
    if arr.dtype != np.dtype("<u2"):
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.uint16).max):
            raise ValueError("token ids do not fit in uint16")
        arr = arr.astype("<u2")
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def vocab_sha256(vocab: np.ndarray) -> str:
    """SHA-256 of the vocabulary's little-endian int32 bytes."""
    return hashlib.sha256(np.ascontiguousarray(vocab, dtype="<i4").tobytes()).hexdigest()


class TokenFileError(ValueError):
    """A token file is truncated, corrupt or not a token file of this project."""


def write_tokens(path: str | os.PathLike, tokens: np.ndarray, metadata: dict[str, Any]) -> str:
    """Write a token Parquet (one uint16 column) atomically; return the token-bytes SHA-256.

    The file metadata records ``n_tokens`` and ``token_sha256`` so ``read_tokens`` can tell a
    damaged file from a good one without any other file.
    """
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    sha = token_bytes_sha256(tokens)
    meta = {**metadata, "n_tokens": len(tokens), "token_sha256": sha}
    table = pa.table({"token": pa.array(tokens, type=pa.uint16())})
    results.TOKENS.write(path, table, meta)
    return sha


def read_tokens(path: str | os.PathLike) -> np.ndarray:
    """GPT-2 ids of a token file written by ``write_tokens`` (uint16), verified.

    Raises TokenFileError naming the file when it is truncated or unreadable (with its size),
    or when its row count or token bytes differ from the ``n_tokens`` / ``token_sha256`` its
    own metadata records (expected vs actual).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: token file not found")
    size = path.stat().st_size
    try:
        table = read_table(path, columns=["token"])  # every byte verified
    except (IntegrityError, KeyError) as err:
        raise TokenFileError(
            f"{path}: truncated or corrupt token file ({size:,} bytes; a complete one ends "
            f"with the Parquet footer): {err}"
        ) from None
    meta, column = table.schema.metadata or {}, table.column("token")
    if column.type != pa.uint16():
        raise TokenFileError(f"{path}: column 'token' has type {column.type}, expected uint16")
    tokens = column.to_numpy()
    expected_n = meta.get(b"n_tokens")
    if expected_n is not None and int(expected_n) != len(tokens):
        raise TokenFileError(
            f"{path}: holds {len(tokens):,} tokens but its metadata records "
            f"{int(expected_n):,}; the file is damaged ({rerun_hint(path)})"
        )
    expected_sha = meta.get(b"token_sha256")
    if expected_sha is not None:
        actual = token_bytes_sha256(tokens)
        if actual != expected_sha.decode():
            raise TokenFileError(
                f"{path}: token bytes hash to {actual} but the file records "
                f"{expected_sha.decode()}; the file is corrupt ({rerun_hint(path)})"
            )
    return tokens


def read_vocab(path: str) -> np.ndarray:
    """GPT-2 ids indexed by model id (model id i ↔ vocab[i])."""
    table = read_table(path, columns=["model_id", "gpt2_id"])
    model_id = table.column("model_id").to_numpy()
    if not np.array_equal(np.sort(model_id), np.arange(len(model_id))):
        raise ValueError(f"{path}: model_id is not a permutation of 0..{len(model_id) - 1}")
    vocab = np.empty(len(model_id), dtype=np.int64)
    vocab[model_id] = table.column("gpt2_id").to_numpy()
    return vocab
