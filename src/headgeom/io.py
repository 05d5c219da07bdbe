"""Atomic writes, and the one Parquet writer and reader every stage uses.

Every result file is written to a temporary name in its own folder, fsynced and renamed,
so a killed job never leaves a file that looks complete (DESIGN: "Writes are atomic").

Every Parquet is verified when it is read (docs §2.4). Its footer records four digests,
each over a part of the file the others do not cover: :data:`PAGES_SHA256` over every byte
before the footer (the data pages and their headers, hashed as the writer streams them),
:data:`SCHEMA_SHA256` over the Arrow schema a reader sees, :data:`FOOTER_SHA256` over the
footer's structure and :data:`METADATA_SHA256` over the key-value metadata (the other three
included). :func:`read_table` and :func:`read_parquet_metadata` check all four and refuse a
changed file with :class:`IntegrityError`, naming both values and the rule that writes it
(benchmarks/parquet_integrity.py measures the cost against a plain read).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headgeom import __version__
from headgeom.hashing import content_hash, seal_manifest
from headgeom.paths import rerun_hint

#: Key of the SHA-256 of a Parquet's other key-value metadata (canonical JSON of the
#: str -> str map, pyarrow's own ``ARROW:`` keys left out).
METADATA_SHA256 = "metadata_sha256"
#: Key of the SHA-256 of every byte before the footer (magic, data pages, page headers).
PAGES_SHA256 = "pages_sha256"
#: Key of the SHA-256 of the serialized Arrow schema (pyarrow's ``ARROW:schema``, decoded).
SCHEMA_SHA256 = "schema_sha256"
#: Key of the SHA-256 of the footer's structure (Parquet schema, row groups, column chunks).
FOOTER_SHA256 = "footer_sha256"
_DIGESTS = (PAGES_SHA256, SCHEMA_SHA256, FOOTER_SHA256, METADATA_SHA256)


class IntegrityError(ValueError):
    """A file's bytes are not what its writer recorded (a flipped byte, a truncated copy)."""


def metadata_digest(metadata: Mapping[str, str]) -> str:
    own = {k: v for k, v in metadata.items() if k != METADATA_SHA256 and not k.startswith("ARROW:")}
    return content_hash(own)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        # mkstemp creates 0600 (and some writers recreate the file): results are shared.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def refresh_generated(path: Path, text: str, check: bool, command: str) -> int:
    """A generated document: rewrite ``path`` with ``text`` when it differs (0), or with
    ``check`` only report that it is stale, naming ``command`` (1)."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return 0
    if check:
        print(f"{path}: stale; run {command}", file=sys.stderr)
        return 1
    write_text(path, text)
    return 0


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Human-readable JSON (sorted keys, trailing newline); never the hashed form (docs §2.1)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_manifest(path: str | os.PathLike, record: dict) -> None:
    """A manifest as readable JSON with its seal (``hashing.load_manifest`` checks it)."""
    write_json(path, seal_manifest(record))


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def write_parquet(
    path: str | os.PathLike,
    data: pd.DataFrame | pa.Table,
    schema: pa.Schema,
    metadata: Mapping[str, Any] | None = None,
    descriptions: Mapping[str, str] | None = None,
) -> None:
    """Write ``data`` with an explicit ``schema`` and file-level key-value metadata.

    ``metadata`` values are stored as JSON strings under their keys; the code version is
    always added. ``descriptions`` documents columns (stored as field metadata
    ``description``) so a reader understands the file without the code. Result files are
    written through ``headgeom.results`` (the schemas and descriptions of every output).
    """
    if isinstance(data, pd.DataFrame):
        missing = [n for n in schema.names if n not in data.columns]
        if missing:
            raise ValueError(f"{path}: data lacks columns {missing} required by the schema")
        table = pa.Table.from_pandas(data[schema.names], schema=schema, preserve_index=False)
    else:
        table = data.select(schema.names).cast(schema)
    descriptions = dict(descriptions or {})
    if descriptions:
        unknown = set(descriptions) - set(schema.names)
        if unknown:
            raise ValueError(f"descriptions name unknown columns {sorted(unknown)}")
        fields = [
            f.with_metadata({"description": descriptions[f.name]}) if f.name in descriptions else f
            for f in table.schema
        ]
        table = table.cast(pa.schema(fields))
    meta = {"headgeom_version": __version__}
    # digests of the file this metadata was read from are never carried into a new one
    meta.update({k: v for k, v in (metadata or {}).items() if k not in _DIGESTS})
    encoded = {
        k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True, ensure_ascii=False))
        for k, v in meta.items()
    }
    schema = table.schema.with_metadata(encoded)
    table = table.replace_schema_metadata(encoded)
    # A first pass to a null sink gives what the footer's digests cover (pyarrow encodes the
    # same table to the same bytes); the second writes the file with them in its footer.
    dry = _HashingSink(None)
    pages_sha, structure = _write(dry, table, schema, {})
    digests = {PAGES_SHA256: pages_sha, SCHEMA_SHA256: schema_digest(_read_back(structure)),
               FOOTER_SHA256: footer_digest(structure)}  # fmt: skip
    digests[METADATA_SHA256] = metadata_digest({**encoded, **digests})
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            written_sha, written = _write(_HashingSink(fh), table, schema, digests)
        if (written_sha, footer_digest(written)) != (pages_sha, digests[FOOTER_SHA256]):
            raise RuntimeError(f"{path}: pyarrow encoded the table differently twice")


def _write(sink, table: pa.Table, schema: pa.Schema, digests: dict[str, str]):
    """Write ``table`` to ``sink`` with ``digests`` added to its footer; return the SHA-256
    of every byte before the footer and the footer's file metadata."""
    with pq.ParquetWriter(sink, schema, write_page_checksum=True, write_statistics=False) as writer:
        writer.write_table(table)
        pages_sha = sink.hexdigest()  # every row group is out; only the footer is left
        if digests:
            writer.add_key_value_metadata(digests)
    return pages_sha, writer.writer.metadata


class _HashingSink(io.RawIOBase):
    """A writable file that hashes what passes through it (to ``fh``, or nowhere)."""

    def __init__(self, fh) -> None:
        self.fh, self.sha, self.n_bytes = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.n_bytes += len(data)
        return self.fh.write(data) if self.fh is not None else len(data)

    def hexdigest(self) -> str:
        return self.sha.hexdigest()


def _read_back(metadata: pq.FileMetaData) -> pa.Schema:
    """The Arrow schema a reader of a file with this footer sees (pyarrow renames list items
    ``element``, for one), from the footer alone."""
    footer = pa.BufferOutputStream()
    metadata.write_metadata_file(footer)
    return pq.read_schema(pa.BufferReader(footer.getvalue()))


def schema_digest(schema: pa.Schema) -> str:
    """SHA-256 of an Arrow schema as Arrow serializes it (IPC flatbuffer)."""
    return hashlib.sha256(schema.serialize().to_pybytes()).hexdigest()


def footer_digest(metadata: pq.FileMetaData) -> str:
    """SHA-256 of a Parquet footer's structure: the Parquet schema and every row group's and
    column chunk's fields (offsets, sizes, encodings, statistics), not its key-value map."""
    record = {k: v for k, v in metadata.to_dict().items() if k != "serialized_size"}
    record["schema"] = str(metadata.schema).split("\n", 1)[1]  # after its "<object at 0x…>"
    text = json.dumps(record, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _pages_end(path: str | os.PathLike) -> int:
    """Offset of a Parquet file's footer (its last 8 bytes: footer length, ``PAR1``)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size < 12:
            return -1
        fh.seek(size - 8)
        tail = fh.read(8)
    if tail[4:] != b"PAR1":
        return -1
    return size - 8 - int.from_bytes(tail[:4], "little")


def _sha256_prefix(path: str | os.PathLike, n_bytes: int, chunk: int = 1 << 20) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while n_bytes > 0 and (block := fh.read(min(chunk, n_bytes))):
            sha.update(block)
            n_bytes -= len(block)
    return sha.hexdigest()


def _corrupt(path, what: str) -> IntegrityError:
    what = " ".join(what.split())  # pyarrow's messages span lines
    return IntegrityError(f"{path}: {what}; the file changed after it was written "
                          f"({rerun_hint(path)})")  # fmt: skip


def _open_verified(path: str | os.PathLike) -> tuple[pq.ParquetFile, dict[str, str]]:
    """The open file and its footer's key-value metadata, every digest its writer recorded
    checked first (a Parquet not written here, without them, is read as it is)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: file not found ({rerun_hint(path)})")
    pages_end = _pages_end(path)
    if pages_end < 4:
        raise _corrupt(path, "no Parquet footer at its end (truncated or overwritten)")
    try:
        pf = pq.ParquetFile(path)
        raw = pf.metadata.metadata or {}
        decoded = {k.decode(): v.decode() for k, v in raw.items()}
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise _corrupt(path, f"not a readable Parquet footer ({err})") from None
    ours = [k for k in (*_DIGESTS, "headgeom_version") if k in decoded]
    checks = (
        ("metadata", METADATA_SHA256, lambda: metadata_digest(decoded)),  # names every key
        ("schema", SCHEMA_SHA256, lambda: schema_digest(schema)),
        ("footer", FOOTER_SHA256, lambda: footer_digest(pf.metadata)),
        ("pages", PAGES_SHA256, lambda: _sha256_prefix(path, pages_end)),
    )
    for what, key, actual in checks if ours else ():
        if key not in decoded:
            pf.close()
            raise _corrupt(path, f"its footer lacks {key!r} (has {sorted(decoded)})")
        if decoded[key] != (value := actual()):
            pf.close()
            raise _corrupt(
                path, f"{what} SHA-256 is {value} but its writer recorded {decoded[key]}"
            )
    return pf, decoded


def read_parquet_metadata(path: str | os.PathLike) -> dict[str, str]:
    """File-level key-value metadata as str → str (JSON values left encoded), verified
    against the digest its writer stored (files without one, not written here, as they are)."""
    pf, md = _open_verified(path)
    pf.close()
    return {k: v for k, v in md.items() if not k.startswith("ARROW:")}


def read_table(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file's table (``columns`` or all), the whole file verified first."""
    pf, _ = _open_verified(path)
    with pf:
        if columns is not None and (missing := sorted(set(columns) - set(pf.schema_arrow.names))):
            raise KeyError(f"{path}: no columns {missing} (has {pf.schema_arrow.names})")
        try:
            return pf.read(columns=columns)
        except (pa.ArrowException, OSError) as err:  # a file without digests, damaged
            raise _corrupt(path, f"a data page does not parse ({err})") from None


def verify_parquet(path: str | os.PathLike) -> None:
    """Raise IntegrityError unless ``path`` is as written (``read_table``'s checks, for a
    reader that only hashes the file): its digests cover every byte, so nothing is decoded
    unless it has none."""
    pf, metadata = _open_verified(path)
    pf.close()
    if PAGES_SHA256 not in metadata:
        read_table(path)


def metadata_text(metadata: Mapping[str, str], key: str, path: str | os.PathLike) -> str:
    """A string value of Parquet file metadata (raw or JSON-encoded); clear error if absent."""
    if key not in metadata:
        raise KeyError(f"{path}: Parquet file metadata has no {key!r} (keys: {sorted(metadata)})")
    raw = metadata[key]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, str) else raw
