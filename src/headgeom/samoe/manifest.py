"""Run manifests of the SA-MoE study (SAMOE §2): what a checkpoint was made from, by hash.

A manifest binds the checkpoint's bytes (``checkpoint_file_sha256``, which every analysis
verifies before loading) to the config it was made with (``config`` and its content hash),
the inputs it read (the SHA-256 of each file's bytes, and the content hash of each input
manifest), the code (source freeze) and the environment. :func:`verified_inputs` is the gate:
an input file whose bytes differ from what its manifest records stops the job, naming both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headgeom.hashing import content_hash, manifest_hash, sha256_file, source_freeze, verify_file
from headgeom.io import read_json, write_manifest
from headgeom.runtime import environment


def run_manifest(
    record_type: str,
    config: Mapping[str, Any],
    checkpoint: str | os.PathLike,
    inputs: Mapping[str, str | os.PathLike],
    input_manifests: Mapping[str, str | os.PathLike],
    **extra: Any,
) -> dict[str, Any]:
    """The manifest record of a checkpoint (not yet written)."""
    return {
        "record_type": record_type,
        "config": dict(config),
        "config_hash": content_hash(dict(config)),
        "checkpoint_file_sha256": sha256_file(checkpoint),
        "inputs_sha256": {name: sha256_file(p) for name, p in sorted(inputs.items())},
        "input_manifests": {name: manifest_hash(p) for name, p in sorted(input_manifests.items())},
        "source_freeze": source_freeze(),
        "environment": environment(),
        **extra,
    }


def run_metadata(run: Mapping[str, Any], manifest: Mapping[str, Any],
                 config: Mapping[str, Any] | None = None,
                 device: Any = None) -> dict[str, Any]:  # fmt: skip
    """The provenance every per-run SA-MoE Parquet carries: the run, the hash of the analysis
    config it was computed with (when it has one), the checkpoint's SHA-256, the content
    hash of its manifest and, for an analysis, the torch device it ran on (``cpu``,
    ``cuda:0``; not part of the config hash: where a job runs is not what it computes)."""
    out: dict[str, Any] = {"run": dict(run)}
    if config is not None:
        out["config_hash"] = content_hash(dict(config))
    out["checkpoint_sha256"] = manifest["checkpoint_file_sha256"]
    out["manifest_content_hash"] = content_hash(dict(manifest))
    if device is not None:
        out["device"] = str(device)
    return out


def add_batch_sequences(parser) -> None:
    """The analyses' ``--batch-sequences`` (config ``capture.batch_sequences``): sequences
    per capture forward; none given, a whole pool in one (``headgeom.samoe.capture.chunks``)."""
    parser.add_argument("--batch-sequences", type=int, default=None,
                        help="sequences per capture forward (default: a pool in one)")  # fmt: skip


def batch_metadata(batch_sequences: int | None) -> dict[str, Any]:
    """``capture_batch_sequences`` for a Parquet's metadata when chunked (not part of the
    config hash: it bounds memory; with one chunk the file is that of the unchunked code)."""
    return {} if batch_sequences is None else {"capture_batch_sequences": int(batch_sequences)}


def write_run_manifest(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    write_manifest(path, dict(record))


def verified_inputs(manifest: str | os.PathLike, files: Mapping[str, str | os.PathLike]) -> dict:
    """Verify each of ``files`` (role -> path) against the SHA-256 that ``manifest`` (a corpus
    manifest's ``files``) records for that role; return the manifest record."""
    record = read_json(manifest)
    recorded = record.get("files", {})
    for role, path in files.items():
        if role not in recorded:
            raise KeyError(f"{manifest}: records no file {role!r} (has {sorted(recorded)})")
        verify_file(path, recorded[role], manifest)
    return record


def config_of(manifest: str | os.PathLike) -> dict:
    return read_json(Path(manifest))["config"]
