"""The paper-scale SA-MoE corpus of one Hub family (SAMOE §3.1, §3.2; docs/samoe.md): the
continued-pretraining stream packed into a flat token file, and the held-out pools, in the
family's own tokenizer.

Sources (``data.sources``): per domain (prose, code, math) the workspace's embedded generator
(``generator: embedded``: :class:`headgeom.samoe.domains.DomainText`, the toy study's
documents, no network; its held-out and training streams are separate seeded streams), a
Hugging Face Hub dataset read
through ``datasets`` streaming (``repo_id``, ``config``, ``data_dir``, ``split``,
``revision``; the Hub is asked once with a short timeout before anything is read, as
``headgeom.data.corpus_sources.check_hub`` does for the head-geometry corpora) or local files
(``files`` + ``format: parquet | jsonl``), read by the same ``datasets`` builders; a
``text_column`` per domain (The Stack's is ``content``).

Held-out pools [CHOICE]: per domain, the documents of the source's last shard in stored order
(``corpus_sources.text_batches`` role "val"), consumed role by role (construction,
calibration, final) and domain by domain as the toy's pools are
(``headgeom.samoe.domains.build_pools``): a role's sequences of one domain are its next
documents, each followed by EOS, cut into ``n`` sequences of T tokens; the rest of the last
document used is dropped. Ids ``<domain>-<NNNN>``; the intervention subset as the toy's. Every
document a pool read (used or dropped) is left out of training by its text's SHA-256
(``corpus_sources.document_key``), so pools and training share no document text.

Training stream: documents drawn one at a time, the domain of document i from
``random.Random(f"headgeom.samoe.hub_sampling:{seed}:cpt-train").choices(DOMAINS, weights)``
(the paper's probabilities are per document, before packing), each domain's documents in
stored order (held-out ones skipped); each document's ids without special tokens, then the
family's EOS; the stream is cut at exactly ``cpt_train_tokens`` (a multiple of T: whole
packed sequences). Tokens are little-endian uint32 in one flat file written in chunks of
``chunk_tokens`` (memory bounded by one chunk and one batch of documents, whatever the
budget), hashed while written; a JSON sidecar records dtype, counts, T, SHA-256, EOS, the
largest id and the realised token share of every domain. Readers map it with ``np.memmap``
(:func:`open_packed`).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from headgeom.data import corpus_sources as cs
from headgeom.hashing import ManifestMismatchError, content_hash, sha256_file, verify_file
from headgeom.io import atomic_path, read_json, write_json, write_manifest
from headgeom.model.import_errors import ModelImportError
from headgeom.optional import require
from headgeom.samoe import model_source, results
from headgeom.samoe.domains import DOMAINS, DomainText, balanced, intervention_subset
from headgeom.samoe.domains import ROLES as POOL_ROLES
from headgeom.samoe.manifest import verified_inputs

#: On-disk token type of the packed stream (Gemma 3's 262,144 ids need more than 16 bits).
TOKEN_DTYPE = np.dtype("<u4")
FORMAT = "headgeom.samoe.packed_tokens/1"
#: Tokens held before each write (64 MiB of uint32).
CHUNK_TOKENS = 1 << 24
#: Defaults of the optional data keys the Hub corpora read.
HUB_TIMEOUT_S = 10
BATCH_DOCS = 1024
STREAM = "cpt-train"
LOCAL_FORMATS = {"parquet": "parquet", "jsonl": "jsonl"}  # -> corpus_sources source kind

HINT = (
    "To build the corpus without the Hub, point each domain at local files: "
    "data.sources.<domain>: {files: ['<dir>/*.parquet'], format: parquet, text_column: text} "
    "(or format: jsonl), e.g. shards downloaded elsewhere with `hf download <repo_id> "
    "--repo-type dataset --include '<data_dir>/*'`."
)


class HubCorpusError(cs.CorpusSourceError):
    """The family's corpus cannot be built as configured (source, tokenizer, budget)."""


# --- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedSource:
    """One domain of the workspace's embedded generator (``generator: embedded``): endless
    seeded documents, held-out and training from separate streams."""

    domain: str
    seed: int

    @property
    def provenance(self) -> dict:
        return {"generator": "headgeom.samoe.domains.DomainText", "domain": self.domain,
                "seed": self.seed, "streams": {"heldout": "heldout", "train": STREAM}}  # fmt: skip

    def documents(self, role: str) -> Iterator[str]:
        source = DomainText(self.seed, "heldout" if role == "heldout" else STREAM)
        while True:
            yield source.document(self.domain)


def open_domain(domain: str, spec: Mapping[str, Any], *, batch_docs: int = BATCH_DOCS,
                hub_timeout_s: float = HUB_TIMEOUT_S,
                seed: int = 0) -> cs.Source | EmbeddedSource:  # fmt: skip
    """Open ``data.sources.<domain>`` for streaming (nothing is read yet). A Hub source is
    checked first: offline, unreachable, missing or an unknown revision stop here with a
    message naming the repository and what to set. ``seed``: the embedded generator's."""
    key = f"data.sources.{domain}"
    if "generator" in spec:
        if spec["generator"] != "embedded":
            raise HubCorpusError(f"{key}.generator = {spec['generator']!r}: only 'embedded'")
        return EmbeddedSource(domain, seed)
    column = spec.get("text_column", "text")
    if "files" in spec:
        kind = LOCAL_FORMATS.get(spec.get("format"))
        if kind is None:
            raise HubCorpusError(f"{key}.format = {spec.get('format')!r}: one of "
                                 f"{sorted(LOCAL_FORMATS)}")  # fmt: skip
        cfg = {"source": kind, "files": list(spec["files"]), "text_column": column,
               "batch_docs": batch_docs, "seed": 0}  # fmt: skip
        try:
            return cs.open_source(cfg)
        except cs.CorpusSourceError as err:
            raise HubCorpusError(f"{key}: {err}") from None
    repo, revision = spec["repo_id"], spec.get("revision", "main")
    name, split = spec.get("config"), spec.get("split", "train")
    cs.set_hub_metadata_timeout(hub_timeout_s)
    hub = {"dataset": repo, "dataset_config": name or "default", "revision": revision,
           "hub_timeout_s": hub_timeout_s}  # fmt: skip
    commit = cs.check_hub(hub, key=key, hint=HINT)
    datasets = require("datasets", f"{key} (a Hub corpus)")

    extra = {"data_dir": spec["data_dir"]} if "data_dir" in spec else {}
    try:
        ds = datasets.load_dataset(repo, name, split=split, revision=commit, streaming=True,
                                   **extra)  # fmt: skip
    except Exception as err:  # noqa: BLE001 - name what failed and how to avoid the Hub
        raise HubCorpusError(f"{key}: datasets could not open {repo} (config {name}, "
                             f"data_dir {spec.get('data_dir')}, split {split}, revision "
                             f"{commit}): {type(err).__name__}: {err}. {HINT}"
                             ) from None  # fmt: skip
    cfg = {"source": f"hub:{repo}", "text_column": column, "batch_docs": batch_docs, "seed": 0}
    provenance = {"dataset": repo, "dataset_config": name, "data_dir": spec.get("data_dir"),
                  "dataset_split": split, "dataset_revision": commit,
                  "datasets_version": datasets.__version__}  # fmt: skip
    return cs.Source(cfg, provenance, ds)


def documents(source: cs.Source | EmbeddedSource, role: str) -> Iterator[str]:
    """Document texts of ``source``: role "heldout" the last shard first (stored order),
    "train" every shard in stored order (the embedded generator: its two streams)."""
    if isinstance(source, EmbeddedSource):
        yield from source.documents(role)
        return
    for batch in cs.text_batches(source, "val" if role == "heldout" else "train", "stored"):
        yield from batch


# --- tokenizer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyTokenizer:
    """A family's tokenizer: the ``tokenizers`` backend, its EOS and its provenance."""

    backend: Any  # tokenizers.Tokenizer
    eos_id: int
    vocab_size: int
    provenance: dict

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text without special tokens (no BOS; EOS is the stream's to add)."""
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=TOKEN_DTYPE) for e in encodings]


def load_hf_tokenizer(repo_id: str, revision: str, family: str = "", needs: str = "the paper "
                      "corpus"):  # fmt: skip
    """The family's ``transformers`` fast tokenizer from its own pinned revision (the dense
    import's repository and revision; a local ``save_pretrained`` directory is read from
    there); HubCorpusError naming it (and what ``needs`` it) when it cannot be loaded."""
    AutoTokenizer = require("transformers", needs).AutoTokenizer

    where = f"families.{family}.hf" if family else "the family's hf source"
    try:
        tok = AutoTokenizer.from_pretrained(repo_id, revision=revision)
    except (OSError, ValueError) as err:  # no route, offline without a cache, no revision
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HubCorpusError(f"cannot load the tokenizer of {repo_id}@{revision} ({where}; "
                             f"{first}); {needs} needs the Hugging Face Hub (or a "
                             "warm cache, or a local model directory as repo_id) for "
                             "it") from None  # fmt: skip
    if not getattr(tok, "is_fast", False) or tok.eos_token_id is None:
        raise HubCorpusError(f"the tokenizer of {repo_id}@{revision} ({where}) is not a fast "
                             "tokenizer with an EOS token")  # fmt: skip
    return tok


def tokenizer_sha256(tok) -> str:
    """SHA-256 of a fast tokenizer's full definition (its ``tokenizer.json`` text)."""
    return hashlib.sha256(tok.backend_tokenizer.to_str().encode("utf-8")).hexdigest()


def load_tokenizer(repo_id: str, revision: str, family: str = "") -> FamilyTokenizer:
    """The family's tokenizer (:func:`load_hf_tokenizer`) with its provenance."""
    tok = load_hf_tokenizer(repo_id, revision, family)
    backend = tok.backend_tokenizer
    sha = tokenizer_sha256(tok)
    provenance = {"repo_id": repo_id, "revision": revision,
                  "resolved_commit": getattr(tok, "_commit_hash", None) or None,
                  "class": type(tok).__name__, "tokenizer_json_sha256": sha}  # fmt: skip
    return FamilyTokenizer(backend, int(tok.eos_token_id), len(tok), provenance)


def family_tokenizer(spec: Mapping[str, Any], family: str = "") -> FamilyTokenizer:
    """The tokenizer ``SAMoEStudy.hub_corpus_config`` names: a Hub family's
    (``{repo_id, revision}``) or a source family's (``{source, eos_token?}``: the local model
    source's own, hash-gated; ``eos_token`` the token between documents, default its EOS)."""
    if "source" not in spec:
        return load_tokenizer(spec["repo_id"], spec["revision"], family)
    try:
        tok, record = model_source.load_tokenizer(spec["source"], family)
    except (ModelImportError, ManifestMismatchError) as err:  # missing, unreadable, changed
        raise HubCorpusError(f"the tokenizer of families.{family}.source: {err}") from None
    if not getattr(tok, "is_fast", False):
        raise HubCorpusError(f"families.{family}.source: its tokenizer is not a fast tokenizer")
    eos = spec.get("eos_token", tok.eos_token)
    eos_id = tok.convert_tokens_to_ids(eos) if eos is not None else None
    if eos_id is None or tok.convert_ids_to_tokens(eos_id) != eos:  # an unknown token maps to unk
        raise HubCorpusError(f"families.{family}.eos_token = {eos!r}: not a token of the "
                             "source's tokenizer")  # fmt: skip
    provenance = {"source": record, "class": type(tok).__name__, "eos_token": eos,
                  "tokenizer_json_sha256": tokenizer_sha256(tok)}  # fmt: skip
    return FamilyTokenizer(tok.backend_tokenizer, int(eos_id), len(tok), provenance)


# --- pools -----------------------------------------------------------------------------------


def build_pools(heldout: Mapping[str, Iterator[str]], sizes: Mapping[str, int], seq_len: int,
                encode: Callable[[list[str]], list[np.ndarray]], eos: int,
                intervention: int) -> tuple[pd.DataFrame, set[str]]:  # fmt: skip
    """The pools (``headgeom.samoe.results.POOLS`` rows) and the keys of every held-out
    document read. ``heldout``: domain -> its held-out document texts."""
    rows, read = [], set()
    for role in POOL_ROLES:
        for domain, n in balanced(sizes[role]).items():
            need, stream = n * seq_len, []
            filled = 0
            while filled < need:
                text = next(heldout[domain], None)
                if text is None:
                    raise HubCorpusError(f"data.sources.{domain}: its held-out documents ran "
                                         f"out in the {role} pool ({filled:,} of {need:,} "
                                         "tokens)")  # fmt: skip
                key = cs.document_key(text)
                if key in read:  # a repeated text: one pool sequence only
                    continue
                read.add(key)
                ids = encode([text])[0]
                stream += [ids, np.asarray([eos], dtype=TOKEN_DTYPE)]
                filled += len(ids) + 1
            flat = np.concatenate(stream)[:need].astype(np.int32)
            for i in range(n):
                rows.append({"role": role, "domain": domain, "seq_id": f"{domain}-{i:04d}",
                             "tokens": flat[i * seq_len : (i + 1) * seq_len]})  # fmt: skip
    pools = pd.DataFrame(rows)
    final = pools.loc[pools["role"] == "final", "seq_id"].tolist()
    chosen = set(intervention_subset(final, intervention // len(DOMAINS)))
    pools["intervention"] = (pools["role"] == "final") & pools["seq_id"].isin(chosen)
    return pools[["role", "domain", "seq_id", "intervention", "tokens"]], read


# --- the packed stream -----------------------------------------------------------------------


def draw_documents(seed: int, sampling: Mapping[str, float],
                   train: Mapping[str, Iterator[str]],
                   exclude: set[str] | frozenset[str] = frozenset(),
                   skipped: dict[str, int] | None = None) -> Iterator[tuple[str, str]]:  # fmt: skip
    """(domain, text) of the training stream: each document's domain drawn with
    ``sampling``, then that domain's next document whose key is not in ``exclude``."""
    draw = random.Random(f"headgeom.samoe.hub_sampling:{seed}:{STREAM}")
    weights = [sampling[d] for d in DOMAINS]
    while True:
        domain = draw.choices(DOMAINS, weights)[0]
        for text in train[domain]:
            if cs.document_key(text) not in exclude:
                yield domain, text
                break
            if skipped is not None:
                skipped[domain] = skipped.get(domain, 0) + 1
        else:
            raise HubCorpusError(f"data.sources.{domain}: the source ran out of training "
                                 "documents; add files or lower data.cpt_train_tokens")  # fmt: skip


@dataclass
class PackedStats:
    """What the sidecar records of a written stream."""

    n_tokens: int = 0
    sha256: str = ""
    max_id: int = 0
    tokens_by_domain: dict[str, int] = field(default_factory=dict)
    documents_by_domain: dict[str, int] = field(default_factory=dict)


class _ChunkWriter:
    """Tokens to ``fh`` through one buffer of ``chunk_tokens``, hashed as written."""

    def __init__(self, fh: BinaryIO, chunk_tokens: int):
        self.fh, self.buf, self.fill = fh, np.empty(chunk_tokens, TOKEN_DTYPE), 0
        self.hash, self.max_id = hashlib.sha256(), 0

    def add(self, ids: np.ndarray) -> None:
        while len(ids):
            n = min(len(ids), len(self.buf) - self.fill)
            self.buf[self.fill : self.fill + n] = ids[:n]
            self.fill, ids = self.fill + n, ids[n:]
            if self.fill == len(self.buf):
                self.flush()

    def flush(self) -> None:
        if self.fill:
            data = self.buf[: self.fill]
            self.max_id = max(self.max_id, int(data.max()))
            self.fh.write(data.tobytes())
            self.hash.update(data.tobytes())
            self.fill = 0


def write_packed(fh: BinaryIO, docs: Iterable[tuple[str, str]],
                 encode: Callable[[list[str]], list[np.ndarray]], eos: int, n_tokens: int, *,
                 chunk_tokens: int = CHUNK_TOKENS, batch_docs: int = BATCH_DOCS,
                 progress: Callable[[int], Any] | None = None) -> PackedStats:  # fmt: skip
    """Write exactly ``n_tokens`` tokens of ``docs`` (each document's ids, then ``eos``) to
    ``fh``. Batches of ``batch_docs`` documents are encoded on a worker thread (the Rust
    tokenizer's own threads) while the next batch is drawn."""
    stats = PackedStats(tokens_by_domain=dict.fromkeys(DOMAINS, 0),
                        documents_by_domain=dict.fromkeys(DOMAINS, 0))  # fmt: skip
    out = _ChunkWriter(fh, chunk_tokens)
    docs = iter(docs)
    eos_arr = np.asarray([eos], dtype=TOKEN_DTYPE)

    ran_out: list[HubCorpusError] = []  # raised only if the documents before it fall short

    def submit(pool):
        batch = []
        try:
            while len(batch) < batch_docs:
                batch.append(next(docs))
        except StopIteration:
            pass
        except HubCorpusError as err:
            ran_out.append(err)
        return (batch, pool.submit(encode, [t for _, t in batch])) if batch else None

    filled = 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = submit(pool)
        while pending is not None and filled < n_tokens:
            batch, future = pending
            pending = submit(pool) if filled < n_tokens else None
            for (domain, _), ids in zip(batch, future.result(), strict=True):
                if filled >= n_tokens:
                    break
                doc = np.concatenate([ids, eos_arr])[: n_tokens - filled]
                out.add(doc)
                filled += len(doc)
                stats.tokens_by_domain[domain] += len(doc)
                stats.documents_by_domain[domain] += 1
                if progress is not None:
                    progress(len(doc))
        if pending is not None:
            pending[1].cancel()
    out.flush()
    if filled < n_tokens and ran_out:
        raise ran_out[0]
    if filled < n_tokens:
        raise HubCorpusError(f"the training documents ran out after {filled:,} of {n_tokens:,} "
                             "tokens")  # fmt: skip
    stats.n_tokens, stats.sha256, stats.max_id = filled, out.hash.hexdigest(), out.max_id
    return stats


def sidecar(stats: PackedStats, seq_len: int, eos: int, vocab_size: int,
            sampling: Mapping[str, float]) -> dict:  # fmt: skip
    """The packed file's metadata record (the ``.json`` beside the ``.bin``)."""
    total = max(stats.n_tokens, 1)
    return {
        "format": FORMAT, "dtype": TOKEN_DTYPE.str, "n_tokens": stats.n_tokens,
        "seq_len": seq_len, "n_sequences": stats.n_tokens // seq_len, "sha256": stats.sha256,
        "eos_id": eos, "max_id": stats.max_id, "vocab_size": vocab_size,
        "sampling": dict(sampling), "tokens_by_domain": stats.tokens_by_domain,
        "documents_by_domain": stats.documents_by_domain,
        "token_shares": {d: stats.tokens_by_domain[d] / total for d in DOMAINS},
    }  # fmt: skip


def open_packed(path: str | os.PathLike, meta: Mapping[str, Any] | str | os.PathLike,
                verify: bool = False) -> np.memmap:  # fmt: skip
    """The packed stream as a read-only ``np.memmap`` of ``n_tokens`` ids; refused when the
    file's size (or, with ``verify``, its SHA-256) is not the sidecar's."""
    path = Path(path)
    if not isinstance(meta, Mapping):
        meta = read_json(meta)
    if meta.get("format") != FORMAT or np.dtype(meta["dtype"]) != TOKEN_DTYPE:
        raise HubCorpusError(f"{path}: sidecar format {meta.get('format')!r} / dtype "
                             f"{meta.get('dtype')!r}, expected {FORMAT!r} / "
                             f"{TOKEN_DTYPE.str!r}")  # fmt: skip
    size, expected = path.stat().st_size, meta["n_tokens"] * TOKEN_DTYPE.itemsize
    if size != expected:
        raise HubCorpusError(f"{path}: {size:,} bytes, the sidecar records {meta['n_tokens']:,} "
                             f"tokens ({expected:,} bytes); rebuild the corpus")  # fmt: skip
    if verify:
        verify_file(path, meta["sha256"], "its sidecar")
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", shape=(meta["n_tokens"],))


# --- one family's corpus ---------------------------------------------------------------------

#: The files of a family's corpus, by manifest role.
FILES = ("cpt_train", "cpt_train_meta", "pools")
MANIFEST_RECORD = "samoe_hub_corpus_manifest"


def build(cfg: Mapping[str, Any], out: Mapping[str, str | os.PathLike],
          manifest_path: str | os.PathLike, *, chunk_tokens: int = CHUNK_TOKENS,
          progress: Callable[[int], Any] | None = None) -> dict:  # fmt: skip
    """Build one family's corpus (``cfg``: ``SAMoEStudy.hub_corpus_config``) into ``out``
    (role -> path, roles ``FILES``) and its manifest; return the manifest. Every source and
    the tokenizer are opened before anything is written; a failure leaves none of the
    outputs."""
    data, family, T = cfg["data"], cfg["family"], int(cfg["seq_len"])
    n_tokens = int(data["cpt_train_tokens"])
    if n_tokens % T:
        raise HubCorpusError(f"data.cpt_train_tokens = {n_tokens} is not a multiple of the "
                             f"sequence length {T} (whole packed sequences)")  # fmt: skip
    batch_docs = int(data.get("batch_docs", BATCH_DOCS))
    timeout = float(data.get("hub_timeout_s", HUB_TIMEOUT_S))
    sources = {d: open_domain(d, data["sources"][d], batch_docs=batch_docs,
                              hub_timeout_s=timeout, seed=int(data["seed"]))
               for d in DOMAINS}  # fmt: skip
    tok = family_tokenizer(cfg["tokenizer"], family)
    common = {"config": dict(cfg), "config_hash": content_hash(dict(cfg)), "family": family,
              "eot_id": tok.eos_id}  # fmt: skip
    with cs.all_or_nothing(*out.values(), manifest_path):
        heldout = {d: documents(s, "heldout") for d, s in sources.items()}
        pools, held = build_pools(heldout, data["pools"], T, tok.encode, tok.eos_id,
                                  data["pools"]["intervention"])  # fmt: skip
        skipped: dict[str, int] = {}
        train = {d: documents(s, "train") for d, s in sources.items()}
        docs = draw_documents(data["seed"], data["sampling"], train, held, skipped)
        with atomic_path(out["cpt_train"]) as tmp, open(tmp, "wb") as fh:
            stats = write_packed(fh, docs, tok.encode, tok.eos_id, n_tokens,
                                 chunk_tokens=chunk_tokens, batch_docs=batch_docs,
                                 progress=progress)  # fmt: skip
        meta = sidecar(stats, T, tok.eos_id, tok.vocab_size, data["sampling"])
        write_json(out["cpt_train_meta"], meta)
        results.POOLS.write(out["pools"], pools, common)
        manifest = {
            "record_type": MANIFEST_RECORD, **common,
            "tokenizer": tok.provenance, "vocab_size": tok.vocab_size,
            "sources": {d: s.provenance for d, s in sources.items()},
            "n_tokens": {"cpt_train": stats.n_tokens}, "seq_len": T,
            "cpt_train": {k: meta[k] for k in ("tokens_by_domain", "documents_by_domain",
                                               "token_shares", "max_id", "sha256")},
            "heldout_documents_skipped": {d: skipped.get(d, 0) for d in DOMAINS},
            "n_heldout_documents": len(held),
            "n_pool_sequences": pools["role"].value_counts().sort_index().to_dict(),
            "files": {"cpt_train": stats.sha256,
                      **{r: sha256_file(out[r]) for r in ("cpt_train_meta", "pools")}},
        }  # fmt: skip
        write_manifest(manifest_path, manifest)
    return manifest


def open_cpt_stream(corpus_dir: str | os.PathLike, vocab: np.ndarray) -> np.ndarray:
    """A Hub family's packed training stream (``np.memmap``), verified against the corpus
    manifest (both files' SHA-256) and refused when an id is outside the model's vocabulary
    (Hub models keep the tokenizer's ids: their vocabulary map is the identity)."""
    corpus_dir = Path(corpus_dir)
    files = {"cpt_train": corpus_dir / "cpt_train.bin",
             "cpt_train_meta": corpus_dir / "cpt_train.json"}  # fmt: skip
    verified_inputs(corpus_dir / "manifest.json", files)
    meta = read_json(files["cpt_train_meta"])
    vocab = np.asarray(vocab)
    if not np.array_equal(vocab, np.arange(len(vocab))) or meta["max_id"] >= len(vocab):
        raise HubCorpusError(f"{files['cpt_train']}: ids up to {meta['max_id']} in the "
                             f"family tokenizer's ids, but the model's vocabulary map is not "
                             f"the identity over them ({len(vocab)} ids); the corpus and the "
                             "model come from different families")  # fmt: skip
    return open_packed(files["cpt_train"], meta)
