"""Artifact identity (docs §2): canonical JSON, SHA-256 of exact bytes, source freeze, and
verification of a file against the hash its manifest names. The environment a run ran in
is headgeom.runtime.environment."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from headgeom.paths import rerun_hint

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
REPO_ROOT = Path(__file__).resolve().parents[2]


class ManifestMismatchError(RuntimeError):
    """A file's bytes do not match the SHA-256 its manifest records."""


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8, no trailing newline (docs §2.1)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(obj: Any) -> str:
    """Structured content hash: SHA-256 of the canonical JSON bytes."""
    return sha256_bytes(canonical_json(obj))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _git(*args: str) -> bytes | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def source_freeze() -> dict[str, str | None]:
    """Git commit and SHA-256 of `git diff HEAD` over tracked files (docs §2.2).

    Outside a git checkout (e.g. an installed wheel) both are null: the record says so
    rather than inventing an identity.
    """
    commit = _git("rev-parse", "HEAD")
    diff = _git("diff", "HEAD", "--binary")
    return {
        "git_commit": commit.decode().strip() if commit else None,
        "tracked_diff_sha256": sha256_bytes(diff) if diff is not None else None,
    }


def verify_file(path: str | os.PathLike, expected_sha256: str, manifest: str | os.PathLike) -> None:
    """Raise ManifestMismatchError naming the file and both hashes when the bytes differ."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: named by manifest {manifest} but missing")
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise ManifestMismatchError(
            f"{path}: SHA-256 is {actual} but manifest {manifest} records {expected_sha256}; "
            f"the file changed after it was hashed ({rerun_hint(path)})"
        )


#: A manifest's own digest: the content hash of every other field, written beside them, so a
#: changed value is refused on read like a changed byte in the files the manifest names.
MANIFEST_SEAL = "record_sha256"


def seal_manifest(record: dict) -> dict:
    """``record`` with its seal (any old seal replaced); its identity stays ``content_hash``
    of the unsealed record, so sealing changes no recorded manifest hash."""
    own = {k: v for k, v in record.items() if k != MANIFEST_SEAL}
    return {**own, MANIFEST_SEAL: content_hash(own)}


def load_manifest(manifest: str | os.PathLike) -> dict:
    """A JSON manifest's record (its seal checked and removed), or an error naming the file,
    both hashes and the rule that writes it."""
    path = Path(manifest)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: manifest not found") from None
    except json.JSONDecodeError as err:
        raise ManifestMismatchError(
            f"{path}: manifest is not valid JSON ({err}); {rerun_hint(path)}"
        ) from None
    if not isinstance(record, dict) or MANIFEST_SEAL not in record:
        raise ManifestMismatchError(
            f"{path}: manifest has no {MANIFEST_SEAL!r} seal (written by hand or by an older "
            f"version); {rerun_hint(path)}"
        )
    sealed = record.pop(MANIFEST_SEAL)
    actual = content_hash(record)
    if actual != sealed:
        raise ManifestMismatchError(
            f"{path}: manifest content hashes to {actual} but its seal records {sealed}; "
            f"it changed after it was written ({rerun_hint(path)})"
        )
    return record


def read_manifest_field(manifest: str | os.PathLike, key: str) -> Any:
    """One field of a JSON manifest, with an error naming the file and key when absent."""
    path = Path(manifest)
    record = load_manifest(path)
    if key not in record:
        raise KeyError(f"{path}: manifest has no field {key!r}")
    return record[key]


def manifest_hash(manifest: str | os.PathLike) -> str:
    """Identity of a JSON manifest: the content hash of its parsed object, not of its
    pretty-printed bytes (docs §2.1, §2.3)."""
    return content_hash(load_manifest(manifest))
