"""The atlas's scoring corpora, offline: real text that is on every machine, the embedded
corpora of both studies, and local text files.

Sources (:data:`SOURCES`), each an endless or finite stream of documents:

* ``stdlib`` — code: the Python standard library's own ``.py`` sources (its tests, IDLE's
  tests, ``site-packages`` and ``pydoc_data``, the prose corpus's text, left out), in the
  SHA-256 order of their relative paths, so the order does not favour a corner of the
  alphabet; it depends on the Python version, which the record names;
* ``pydoc`` — English prose: the documentation topics of ``pydoc_data.topics`` (the
  language reference's sections that ``help()`` shows), in key order;
* ``demo`` — the head-geometry study's embedded corpus (``headgeom.data.corpus``), drawn
  from its own stream ``atlas``, which no training run reads;
* ``domain`` — one of the SA-MoE study's domains (prose, code, math; ``headgeom.data.domains``),
  stream ``atlas``;
* ``file`` — a local UTF-8 text file the user lists (one document).

:func:`tokenize_windows` encodes a stream's documents with the model's tokenizer (document by
document, an end-of-text id between them where the tokenizer has one, until enough tokens
are read) and cuts fixed non-overlapping windows, each opening with the tokenizer's BOS id
where it has one; :class:`Windows` carries the ids, their SHA-256 and a record of where they
come from. :func:`split_windows` separates the held-out windows of Average's means from the
scored ones.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import platform
import pydoc_data.topics
import sysconfig
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headgeom.data.corpus import iter_demo_texts
from headgeom.data.domains import DOMAINS, DomainText
from headgeom.hashing import canonical_json

SOURCES = ("stdlib", "pydoc", "demo", "domain", "file")
#: The stream the embedded generators draw the atlas's documents from (no training run does).
STREAM = "atlas"
#: Standard-library folders that are not library code (pydoc_data holds the prose corpus).
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
                "pydoc_data"}  # fmt: skip


@dataclass(frozen=True)
class CorpusSpec:
    """One scoring corpus: its ``name`` (a column of the results), its ``source``
    (:data:`SOURCES`), and the source's options: ``path`` (file), ``domain`` (domain),
    ``seed`` (demo, domain)."""

    name: str
    source: str
    path: str | None = None
    domain: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"corpus {self.name!r}: source {self.source!r} is not one of {', '.join(SOURCES)}"
            )
        if self.source == "file" and not self.path:
            raise ValueError(f"corpus {self.name!r}: a file corpus needs a path")
        if self.source == "domain" and self.domain not in DOMAINS:
            raise ValueError(
                f"corpus {self.name!r}: domain {self.domain!r} is not one of {', '.join(DOMAINS)}"
            )

    def record(self) -> dict:
        """What the results record of the corpus's source."""
        out: dict = {"name": self.name, "source": self.source}
        if self.source in ("stdlib", "pydoc"):
            out["python"] = platform.python_version()
        if self.source in ("demo", "domain"):
            out.update(seed=self.seed, stream=STREAM)
        if self.source == "domain":
            out["domain"] = self.domain
        if self.source == "file":
            out["path"] = self.path
        return out


# ----------------------------------------------------------------------------- documents
def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, in SHA-256 order of their relative paths."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP)  # not walked at all
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    key = {p: hashlib.sha256(p.relative_to(root).as_posix().encode()).hexdigest() for p in files}
    return sorted(files, key=key.__getitem__)


def _stdlib_documents() -> Iterator[str]:
    for path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few files are Latin-1 test fixtures; code is plentiful
        if text.strip():
            yield text


def _pydoc_documents() -> Iterator[str]:
    topics = pydoc_data.topics.topics
    for key in sorted(topics):
        yield topics[key]


def documents(spec: CorpusSpec) -> Iterator[str]:
    """The corpus's documents, in its fixed order (endless for the embedded generators)."""
    if spec.source == "stdlib":
        return _stdlib_documents()
    if spec.source == "pydoc":
        return _pydoc_documents()
    if spec.source == "demo":
        return iter_demo_texts(spec.seed, STREAM)
    if spec.source == "domain":
        source = DomainText(spec.seed, STREAM)
        return (source.document(spec.domain) for _ in itertools.count())
    path = Path(spec.path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {spec.name!r}: text file {path} not found")
    try:
        return iter([path.read_text(encoding="utf-8")])
    except UnicodeDecodeError as err:
        raise ValueError(f"corpus {spec.name!r}: {path} is not UTF-8 text ({err})") from None


# ----------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class Windows:
    """A corpus as fixed windows of token ids (n, T) int64, their SHA-256 and its record."""

    name: str
    ids: np.ndarray
    sha256: str
    record: dict

    def __len__(self) -> int:
        return len(self.ids)


def windows_sha256(name: str, ids: np.ndarray) -> str:
    """SHA-256 of a corpus name, its windows' shape and their int64 little-endian bytes."""
    h = hashlib.sha256(canonical_json([name, list(ids.shape)]))
    h.update(np.ascontiguousarray(ids, dtype="<i8").tobytes())
    return h.hexdigest()


def tokenize_windows(
    spec: CorpusSpec,
    encode: Callable[[str], Sequence[int]],
    n_ctx: int,
    n_windows: int,
    bos_id: int | None,
    eos_id: int | None,
    tokenizer: str,
) -> Windows:
    """``n_windows`` windows of ``n_ctx`` ids of the corpus: documents encoded one by one
    (``encode``: text -> ids, no special tokens), joined by ``eos_id`` where given, cut into
    consecutive pieces of n_ctx (n_ctx − 1 after ``bos_id``, which then opens each window).
    ``tokenizer`` names the tokenizer in the record (e.g. its source's SHA-256)."""
    if n_ctx < 2 or n_windows < 1:
        raise ValueError(f"corpus {spec.name!r}: n_ctx {n_ctx} (≥ 2), n_windows {n_windows} (≥ 1)")
    body = n_ctx - (bos_id is not None)
    need = n_windows * body
    stream: list[int] = []
    used = 0
    for text in documents(spec):
        if stream and eos_id is not None:
            stream.append(int(eos_id))
        stream.extend(int(i) for i in encode(text))
        used += 1
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ValueError(
            f"corpus {spec.name!r} ({spec.source}) holds {len(stream):,} tokens; "
            f"{n_windows} windows of {n_ctx} need {need:,}"
        )
    ids = np.asarray(stream[:need], dtype=np.int64).reshape(n_windows, body)
    if bos_id is not None:
        ids = np.concatenate([np.full((n_windows, 1), int(bos_id), dtype=np.int64), ids], axis=1)
    record = {
        **spec.record(),
        "documents_read": used,
        "n_ctx": n_ctx,
        "n_windows": n_windows,
        "bos_id": bos_id,
        "eos_id": eos_id,
        "tokenizer": tokenizer,
    }
    return Windows(spec.name, ids, windows_sha256(spec.name, ids), record)


def split_windows(windows: Windows, n_mean: int, n_eval: int) -> tuple[Windows, Windows]:
    """(the first ``n_mean`` windows: Average's held-out text, the next ``n_eval``: the
    scored text), each hashed on its own."""
    if n_mean < 0 or n_eval < 1 or n_mean + n_eval > len(windows):
        raise ValueError(
            f"corpus {windows.name!r} has {len(windows)} windows; n_mean {n_mean} (≥ 0) + "
            f"n_eval {n_eval} (≥ 1) of them asked for"
        )

    def part(ids: np.ndarray, role: str, first: int) -> Windows:
        record = {**windows.record, "role": role, "windows": f"{first}..{first + len(ids) - 1}"}
        return Windows(windows.name, ids, windows_sha256(windows.name, ids), record)

    mean_ids = windows.ids[:n_mean]
    eval_ids = windows.ids[n_mean : n_mean + n_eval]
    return part(mean_ids, "means", 0), part(eval_ids, "scored", n_mean)


def hf_encoder(tokenizer) -> Callable[[str], list[int]]:
    """``encode`` of a ``transformers`` tokenizer: ids without special tokens."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


def specs_from_config(corpora: Sequence[Mapping]) -> list[CorpusSpec]:
    """Corpus specs from config entries ``{name, source, path?, domain?, seed?}``; names
    must be unique."""
    known = {"name", "source", "path", "domain", "seed"}
    for c in corpora:
        unknown = set(c) - known
        if unknown or "name" not in c or "source" not in c:
            raise ValueError(
                f"corpora entry {dict(c)}: expected keys name, source and optionally path, "
                f"domain, seed; unknown {sorted(unknown)}"
            )
    specs = [CorpusSpec(**dict(c)) for c in corpora]
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"corpora: names {dupes} occur more than once")
    return specs
