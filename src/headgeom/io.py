"""Atomic writes, and the one Parquet writer and reader every stage uses.

Every result file is written to a temporary name in its own folder, fsynced and renamed,
so a killed job never leaves a file that looks complete (DESIGN: "Writes are atomic").

Every Parquet is verified when it is read (docs §2.4): the writer stores a CRC-32 of every
data page (pyarrow's ``write_page_checksum``) and the SHA-256 of its key-value metadata
(:data:`METADATA_SHA256`); :func:`read_table` and :func:`read_parquet_metadata` check both
and refuse a changed file with :class:`IntegrityError`, naming the rule that writes it
(benchmarks/parquet_integrity.py: the checks cost about 1.3× a plain read, a whole-file
SHA-256 2.3×).
"""

from __future__ import annotations

import contextlib
import json
import os
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
    meta.update({k: v for k, v in (metadata or {}).items()})
    encoded = {
        k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True, ensure_ascii=False))
        for k, v in meta.items()
    }
    encoded[METADATA_SHA256] = metadata_digest(encoded)
    table = table.replace_schema_metadata(encoded)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)


def _corrupt(path, what: str) -> IntegrityError:
    what = " ".join(what.split())  # pyarrow's messages span lines
    return IntegrityError(f"{path}: {what}; the file changed after it was written "
                          f"({rerun_hint(path)})")  # fmt: skip


def _open_verified(path: str | os.PathLike) -> tuple[pq.ParquetFile, dict[str, str]]:
    """The open file (pages to be CRC-checked as they are read) and its footer metadata,
    checked against the digest its writer stored (files not written here have none)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: file not found ({rerun_hint(path)})")
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        md = pf.schema_arrow.metadata or {}
        decoded = {k.decode(): v.decode() for k, v in md.items()}
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise _corrupt(path, f"not a readable Parquet footer ({err})") from None
    recorded = decoded.get(METADATA_SHA256)
    if recorded is not None and recorded != (actual := metadata_digest(decoded)):
        pf.close()
        raise _corrupt(path, f"metadata SHA-256 is {actual} but its writer recorded {recorded}")
    return pf, decoded


def read_parquet_metadata(path: str | os.PathLike) -> dict[str, str]:
    """File-level key-value metadata as str → str (JSON values left encoded), verified
    against the digest its writer stored (files without one, not written here, as they are)."""
    pf, md = _open_verified(path)
    pf.close()
    return {k: v for k, v in md.items() if not k.startswith("ARROW:pandas")}


def read_table(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file's table (``columns`` or all): the metadata digest verified, then
    every data page's CRC-32 as it is read. A page whose header or bytes no longer parse
    is reported the same way as one that fails its CRC: the file changed."""
    pf, _ = _open_verified(path)
    with pf:
        if columns is not None and (missing := sorted(set(columns) - set(pf.schema_arrow.names))):
            raise KeyError(f"{path}: no columns {missing} (has {pf.schema_arrow.names})")
        try:
            return pf.read(columns=columns)
        except (pa.ArrowException, OSError) as err:
            what = f"a data page fails its CRC-32 or does not parse ({err})"
            raise _corrupt(path, what) from None


def verify_parquet(path: str | os.PathLike) -> None:
    """Raise IntegrityError unless every page and the metadata of ``path`` are as written
    (``read_table``'s checks, for a reader that only hashes the file)."""
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
