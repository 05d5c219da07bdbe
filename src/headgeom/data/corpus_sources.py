"""Document sources of the training corpora and their parallel GPT-2 tokenization (docs §3).

A study's ``corpus`` config names one source of documents and any number of named training
corpora drawn from it (the paper: R, 200,000,000 tokens sampled with replacement; S,
1,073,741,825 tokens read once), plus one validation file shared by all of them:

* ``fineweb`` — a Hugging Face Hub dataset through ``datasets`` (streaming), pinned to a full
  commit (FineWeb-Edu ``sample-10BT`` for the paper). The Hub is asked once, with a short
  timeout and no retries, before anything is read: no network, a missing dataset or a wrong
  revision stop at once with a message saying what to change.
* ``text`` / ``parquet`` / ``jsonl`` — local files (globs) through the same ``datasets``
  streaming builders, so a bring-your-own corpus is read exactly like FineWeb.
* ``embedded`` — the generated demo corpus of ``headgeom.data.corpus`` (no ``datasets``).

Document streams ([CHOICE], docs §3.2–3.4): the validation file holds the first documents
of the last shard, in stored order (continuing into the shard before it if one is too small);
a training corpus iterates every shard in stored order (``order: stored``, corpus R) or a
seeded ``datasets`` shuffle of shards and documents (``order: shuffled``, corpus S: shard
order permuted, documents through a ``shuffle_buffer``-document buffer), skipping every
document whose text (SHA-256) is a validation document. Each document's ids are followed
by EOT (50256); the stream is cut at exactly the requested number of tokens. A literal
``<|endoftext|>`` inside a document's text is encoded as the EOT token, as
``headgeom.data.tokenizer`` encodes every text. Shuffled streams are a pure function of the seed,
the shuffle buffer, the source and the ``datasets`` version (recorded in the manifest).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from headgeom.data.corpus import iter_demo_texts
from headgeom.data.tokenizer import EOT_ID
from headgeom.hashing import sha256_file
from headgeom.optional import require

SOURCES = ("embedded", "fineweb", "text", "parquet", "jsonl")
LOCAL_SOURCES = {"text": "text", "parquet": "parquet", "jsonl": "json"}  # -> datasets builder
ORDERS = ("stored", "shuffled")
SAMPLINGS = ("with_replacement", "read_once")
SAMPLE_BY = ("document", "paragraph", "line")
FINEWEB_EDU = {
    "dataset": "HuggingFaceFW/fineweb-edu",
    "dataset_config": "sample-10BT",
    "split": "train",
}
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

# Keys of the source (shared by the validation file and every corpus) and their defaults.
SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "embedded": {},
    "fineweb": {
        **FINEWEB_EDU,
        "text_column": "text",
        "hub_timeout_s": 10,
        "shuffle_buffer": 10_000,
    },
    "text": {"sample_by": "document", "shuffle_buffer": 10_000},
    "parquet": {"text_column": "text", "shuffle_buffer": 10_000},
    "jsonl": {"text_column": "text", "shuffle_buffer": 10_000},
}
SOURCE_REQUIRED = {"fineweb": ("revision",), **{kind: ("files",) for kind in LOCAL_SOURCES}}
COMMON_DEFAULTS = {"seed": 1729, "batch_docs": 1024}
CORPUS_DEFAULTS = {
    "name": "default",  # a study's only corpus, used by every model that names none
    "order": "stored",
    "sampling": "with_replacement",
    "compact_vocab": True,
}


class CorpusSourceError(RuntimeError):
    """The document source cannot be read as configured (network, revision, files)."""


LOCAL_HINT = (
    "To build the corpus without the Hub, point the config at local files: "
    "corpus.source: parquet (or jsonl / text) with corpus.files: ['<dir>/*.parquet'] — e.g. "
    "the sample-10BT Parquet files downloaded elsewhere with `hf download "
    "HuggingFaceFW/fineweb-edu --repo-type dataset --revision <rev> --include "
    "'sample/10BT/*'` — and corpus.text_column: text."
)


# --- config --------------------------------------------------------------------------------------


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"corpus config: {key} = {value!r} {allowed}")


def _check_int(cfg: Mapping, key: str, minimum: int) -> None:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _fail(key, value, f"must be an integer >= {minimum}")


def resolve_source(
    config: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The source part of a corpus config with defaults filled; unknown keys rejected.

    ``extra`` maps further allowed keys to their defaults (None: required).
    """
    extra = extra or {}
    source = config.get("source")
    if source not in SOURCES:
        _fail("source", source, f"is not one of {list(SOURCES)}")
    defaults = {**COMMON_DEFAULTS, **SOURCE_DEFAULTS[source]}
    required = ("n_val_tokens", *SOURCE_REQUIRED.get(source, ()))
    allowed = {"source", *defaults, *required, *extra}
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(
            f"corpus config: unknown keys {unknown} for source {source!r}; allowed: "
            f"{sorted(allowed)}"
        )
    needed = [*required, *(k for k, v in extra.items() if v is None)]
    missing = [k for k in needed if k not in config]
    if missing:
        raise ValueError(f"corpus config: source {source!r} needs keys {missing}")
    cfg = {**defaults, **{k: v for k, v in extra.items() if v is not None}, **config}
    for key, minimum in (("seed", 0), ("n_val_tokens", 1), ("batch_docs", 1)):
        _check_int(cfg, key, minimum)
    if "shuffle_buffer" in cfg:
        _check_int(cfg, "shuffle_buffer", 1)
    if source == "fineweb":
        if not isinstance(cfg["revision"], str) or not REVISION_RE.match(cfg["revision"]):
            _fail(
                "revision",
                cfg["revision"],
                "must be a full 40-hex commit of the dataset repository (a pin, not a branch)",
            )
        if not (isinstance(cfg["hub_timeout_s"], int | float) and cfg["hub_timeout_s"] > 0):
            _fail("hub_timeout_s", cfg["hub_timeout_s"], "must be a positive number of seconds")
    if source in LOCAL_SOURCES:
        files = cfg["files"]
        if isinstance(files, str):
            cfg["files"] = files = [files]
        valid = isinstance(files, list) and files and all(isinstance(f, str) and f for f in files)
        if not valid:
            _fail("files", files, "must be a non-empty list of paths or glob patterns")
    if "sample_by" in cfg and cfg["sample_by"] not in SAMPLE_BY:
        _fail("sample_by", cfg["sample_by"], f"is not one of {list(SAMPLE_BY)}")
    return cfg


def resolve_corpus(config: Mapping[str, Any]) -> dict[str, Any]:
    """A training corpus config: the source keys plus name, n_train_tokens, order, sampling,
    compact_vocab."""
    extra = {"n_train_tokens": None, **CORPUS_DEFAULTS}
    cfg = resolve_source(config, extra)
    _check_int(cfg, "n_train_tokens", 1)
    if not isinstance(cfg["name"], str) or not re.match(
        r"^[A-Za-z0-9][A-Za-z0-9_-]*$", cfg["name"]
    ):
        _fail("name", cfg["name"], "must be a corpus name (letters, digits, '-', '_')")
    if cfg["order"] not in ORDERS:
        _fail("order", cfg["order"], f"is not one of {list(ORDERS)}")
    if cfg["sampling"] not in SAMPLINGS:
        _fail("sampling", cfg["sampling"], f"is not one of {list(SAMPLINGS)}")
    if not isinstance(cfg["compact_vocab"], bool):
        _fail("compact_vocab", cfg["compact_vocab"], "must be a bool")
    return cfg


def validation_config(corpus_config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the validation file depends on: the same for every corpus of a study, so
    every corpus gets a byte-identical copy. Batching and shuffling never change it, nor does
    the seed unless it seeds the embedded generator."""
    cfg = resolve_source({k: v for k, v in corpus_config.items() if k not in _CORPUS_KEYS})
    ignored = {"batch_docs", "shuffle_buffer"} | (
        {"seed"} if cfg["source"] != "embedded" else set()
    )
    return {k: v for k, v in cfg.items() if k not in ignored}


_CORPUS_KEYS = {"n_train_tokens", *CORPUS_DEFAULTS}


# --- the Hub -------------------------------------------------------------------------------------


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_dataset_info(repo_id: str, revision: str, timeout: float) -> Any:
    """One request, no retries; the endpoint is read now so HF_ENDPOINT set late is honoured."""
    from huggingface_hub import HfApi  # optional: [hf] extra

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).dataset_info(
        repo_id, revision=revision, timeout=timeout
    )


def check_hub(cfg: Mapping[str, Any], *, key: str = "corpus", hint: str = LOCAL_HINT) -> str:
    """Ask the Hub for the pinned revision before reading anything; return the commit.

    Raises CorpusSourceError at once when offline, unreachable, the dataset is missing or the
    revision does not exist. ``key`` is the config block the messages tell the user to set
    and ``hint`` how to avoid the Hub (the SA-MoE corpora pass their own). A revision that is
    not a full commit (a branch such as ``main``) is resolved, and the commit returned.
    """
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError  # [hf]

    repo, revision = cfg["dataset"], cfg["revision"]
    repo_key = "dataset" if key == "corpus" else "repo_id"
    where = f"dataset {repo} (config {cfg['dataset_config']}) at revision {revision}"
    if _offline():
        raise CorpusSourceError(
            f"cannot read {where}: offline mode is set (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). "
            + hint
        )
    try:
        info = _hub_dataset_info(repo, revision, float(cfg["hub_timeout_s"]))
    except RevisionNotFoundError as err:
        raise CorpusSourceError(
            f"revision {revision} of dataset {repo} does not exist on the Hub ({err}); set "
            f"{key}.revision to a full commit of that repository"
            + (
                " (docs §3.1 pins 87f09149ef4734204d70ed1d046ddc9ca3f2b8f9 for FineWeb-Edu)"
                if key == "corpus"
                else ""
            )
        ) from None
    except RepositoryNotFoundError as err:
        raise CorpusSourceError(
            f"dataset {repo} was not found on the Hub ({err}); check {key}.{repo_key}. " + hint
        ) from None
    except Exception as err:  # noqa: BLE001 - any transport failure means "no Hub"
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        raise CorpusSourceError(
            f"cannot reach the Hugging Face Hub at {endpoint} for {where} "
            f"({type(err).__name__}: {err}; timeout {cfg['hub_timeout_s']} s). " + hint
        ) from None
    sha = getattr(info, "sha", None)
    if not REVISION_RE.match(revision):  # a branch: the commit it names now
        return sha or revision
    if sha is not None and sha != revision:
        raise CorpusSourceError(f"{where}: the Hub resolved the revision to {sha}, not the pin")
    return revision


# --- opening a source ----------------------------------------------------------------------------


def expand_files(patterns: Iterable[str]) -> list[Path]:
    """Files matching each pattern (sorted within a pattern, first occurrence kept)."""
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise CorpusSourceError(
                f"corpus.files pattern {pattern!r} matches no file (relative to {Path.cwd()})"
            )
        files += [Path(m) for m in matches if Path(m) not in files]
    return files


@dataclass
class Source:
    """An opened document source and the provenance its manifest records."""

    cfg: dict[str, Any]
    provenance: dict[str, Any]
    dataset: Any = None  # datasets.IterableDataset (None for embedded)

    @property
    def text_column(self) -> str:
        return self.cfg.get("text_column", "text")


def set_hub_metadata_timeout(seconds: float) -> None:
    """Short metadata timeouts for the streaming reads too (``HF_HUB_ETAG_TIMEOUT``, unless
    the user set it): huggingface_hub reads it when it is first imported, as a whole number
    of seconds (``int("10.0")`` fails there, and so would every later import)."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(math.ceil(seconds)))


def open_source(cfg: Mapping[str, Any]) -> Source:
    """Open the configured source for streaming (no document is read yet)."""
    cfg = dict(cfg)
    kind = cfg["source"]
    if kind == "embedded":
        return Source(cfg, {"dataset": "embedded-demo", "generator_seed": cfg["seed"]})
    if kind == "fineweb":
        set_hub_metadata_timeout(cfg["hub_timeout_s"])
    datasets = require("datasets", f"corpus.source {kind}")

    if kind == "fineweb":
        revision = check_hub(cfg)
        try:
            ds = datasets.load_dataset(
                cfg["dataset"],
                cfg["dataset_config"],
                split=cfg["split"],
                revision=revision,
                streaming=True,
            )
        except Exception as err:  # noqa: BLE001 - name what failed and how to avoid the Hub
            raise CorpusSourceError(
                f"datasets could not open {cfg['dataset']} (config {cfg['dataset_config']}, "
                f"split {cfg['split']}, revision {revision}): {type(err).__name__}: {err}. "
                + LOCAL_HINT
            ) from None
        provenance = {
            "dataset": cfg["dataset"],
            "dataset_config": cfg["dataset_config"],
            "dataset_split": cfg["split"],
            "dataset_revision": revision,
        }
    else:
        files = expand_files(cfg["files"])
        kwargs: dict[str, Any] = {}
        if kind == "text":
            kwargs = {"sample_by": cfg["sample_by"]}
        try:
            ds = datasets.load_dataset(
                LOCAL_SOURCES[kind],
                data_files=[str(f) for f in files],
                split="train",
                streaming=True,
                **kwargs,
            )
        except Exception as err:  # noqa: BLE001
            raise CorpusSourceError(
                f"datasets could not read the {kind} files {[str(f) for f in files]}: "
                f"{type(err).__name__}: {err}"
            ) from None
        provenance = {
            "dataset": f"local-{kind}",
            "source_files": [
                {"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files
            ],
        }
    provenance["datasets_version"] = datasets.__version__
    return Source(cfg, provenance, ds)


def text_batches(source: Source, role: str, order: str = "stored") -> Iterator[list[str]]:
    """Document texts in batches of ``batch_docs``.

    ``role`` "val": the last shard in stored order (then the shard before it, and so on, when
    one shard is too small, e.g. one text file per document); "train": every shard in
    ``order``.
    """
    cfg, batch = source.cfg, source.cfg["batch_docs"]
    if cfg["source"] == "embedded":
        stream = "validation" if role == "val" else ("train" if order == "stored" else order)
        texts = iter_demo_texts(cfg["seed"], stream)
        while True:
            yield [next(texts) for _ in range(batch)]
    ds = source.dataset
    if role == "val":  # the last shard first; earlier ones only if it is too small
        parts = [
            ds.shard(num_shards=ds.num_shards, index=i) for i in reversed(range(ds.num_shards))
        ]
    elif order == "shuffled":
        parts = [ds.shuffle(seed=cfg["seed"], buffer_size=cfg["shuffle_buffer"])]
    else:
        parts = [ds]
    column = source.text_column
    known = parts[0].column_names  # None when the stream does not declare its features
    if known is not None:
        if column not in known:
            raise CorpusSourceError(
                f"documents of corpus source {cfg['source']!r} have no column {column!r} "
                f"(columns: {sorted(known)}); set corpus.text_column"
            )
        parts = [part.select_columns([column]) for part in parts]  # decode only the text
    rows_of = (rows for part in parts for rows in part.iter(batch_size=batch))
    for i, rows in enumerate(rows_of):
        if column not in rows:
            raise CorpusSourceError(
                f"documents of corpus source {cfg['source']!r} have no column {column!r} "
                f"(columns: {sorted(rows)}); set corpus.text_column"
            )
        texts = rows[column]
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise CorpusSourceError(
                f"column {column!r} holds a {type(bad).__name__}, not text (batch {i})"
            )
        yield texts


# --- parallel tokenization -----------------------------------------------------------------------


def document_key(text: str) -> str:
    """Identity of a document: SHA-256 of its UTF-8 text (validation exclusion, dedup)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class TokenStream:
    """Exactly ``n_tokens`` tokens and the documents (keys, tokens incl. EOT) they came from."""

    tokens: np.ndarray
    doc_keys: list[str] = field(default_factory=list)
    doc_tokens: list[int] = field(default_factory=list)
    n_skipped: int = 0  # documents left out because they are validation documents


def _encode(tok: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    # encode_batch_fast: the same ids as encode_batch without character offsets (~1.3x faster).
    encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    return [np.asarray(e.ids, dtype="<u2") for e in encodings]


def tokenize_stream(
    batches: Iterable[list[str]],
    tokenizer: Tokenizer,
    n_tokens: int,
    *,
    exclude: set[str] | frozenset[str] = frozenset(),
    progress: Callable[[int], Any] | None = None,
    what: str = "corpus",
) -> TokenStream:
    """Concatenate documents (each followed by EOT) until exactly ``n_tokens``.

    Parallel in two ways: ``encode_batch_fast`` tokenizes a batch on all cores (Rust threads,
    RAYON_NUM_THREADS), and the next batch is read from the source while the current one is
    being encoded. Documents whose key is in ``exclude`` are skipped before encoding.
    """
    out = np.empty(n_tokens, dtype="<u2")
    stream = TokenStream(out)
    filled = 0
    batches = iter(batches)

    def submit(pool: ThreadPoolExecutor) -> tuple[list[str], Future] | None:
        for texts in batches:
            keys = [document_key(t) for t in texts]
            kept = [(k, t) for k, t in zip(keys, texts, strict=True) if k not in exclude]
            stream.n_skipped += len(texts) - len(kept)
            if kept:
                return [k for k, _ in kept], pool.submit(_encode, tokenizer, [t for _, t in kept])
        return None

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = submit(pool)
        while pending is not None and filled < n_tokens:
            keys, future = pending
            pending = submit(pool)  # read ahead while this batch is encoded
            for key, ids in zip(keys, future.result(), strict=True):
                if filled >= n_tokens:
                    break
                n = min(len(ids), n_tokens - filled)
                out[filled : filled + n] = ids[:n]
                filled += n
                written = n
                if n == len(ids) and filled < n_tokens:
                    out[filled] = EOT_ID
                    filled += 1
                    written += 1
                stream.doc_keys.append(key)
                stream.doc_tokens.append(written)
                if progress is not None:
                    progress(written)
        if pending is not None:
            pending[1].cancel()
    if filled < n_tokens:
        raise CorpusSourceError(
            f"{what}: the source ran out after {filled:,} tokens "
            f"({len(stream.doc_keys):,} documents, {stream.n_skipped:,} validation documents "
            f"skipped), fewer than the {n_tokens:,} asked for; add files or lower the size"
        )
    return stream


# --- outputs -------------------------------------------------------------------------------------


@contextlib.contextmanager
def all_or_nothing(*paths: str | os.PathLike) -> Iterator[None]:
    """Remove every listed output when the block fails, so a failed build leaves none of
    them (each file is also written atomically, so none is ever half-written)."""
    try:
        yield
    except BaseException:
        for path in paths:
            Path(path).unlink(missing_ok=True)
        raise
