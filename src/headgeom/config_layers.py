"""Study configs that extend another: ``extends: config/paper.yaml`` plus the keys that differ.

A config naming ``extends`` is the base file's config (itself resolved the same way) with
this config laid over it key by key: mappings merge recursively, any other value replaces
the base's, and a key set to ``null`` removes the base's key (e.g. a local corpus drops the
Hub dataset's ``revision``). Keys listed in ``replaces`` take this config's value whole,
without merging (the rehearsal's ``resources`` are its node's, none of the paper's). The
rehearsal study (``config/rehearsal.yaml``) is the paper's config with counts reduced and a
local corpus; everything it does not name is the paper's.
Paths are relative to the working directory (the repository root, where snakemake runs).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

EXTENDS = "extends"
REPLACES = "replaces"


def overlay(base: Mapping, top: Mapping, replaces: Collection[str] = ()) -> dict:
    """``top`` laid over ``base``: mappings merge recursively, None deletes, else replace;
    the top-level keys in ``replaces`` are replaced whole."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if value is None:
            out.pop(key, None)
        elif key in replaces:
            out[key] = copy.deepcopy(value)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = overlay(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve(config: Mapping, root: str | Path = ".", _seen: tuple[Path, ...] = ()) -> dict:
    """``config`` with its ``extends`` chain applied (no ``extends`` key: a copy of it)."""
    if EXTENDS not in config:
        if REPLACES in config:
            raise ValueError(f"config {REPLACES}: only a config that extends another replaces keys")
        return copy.deepcopy(dict(config))
    name = config[EXTENDS]
    if not isinstance(name, str) or not name:
        raise ValueError(f"config extends: expected the path of a YAML config, got {name!r}")
    path = (Path(root) / name).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ValueError(f"config extends: a cycle ({chain})")
    if not path.is_file():
        raise FileNotFoundError(f"config extends: {name}: no such file (relative to {root})")
    base = yaml.safe_load(path.read_text())
    if not isinstance(base, Mapping):
        raise ValueError(f"config extends: {name} is not a YAML mapping")
    base = resolve(base, root, (*_seen, path))
    replaces = config.get(REPLACES, [])
    if not isinstance(replaces, list) or not all(isinstance(k, str) for k in replaces):
        raise ValueError(f"config {REPLACES}: expected a list of top-level keys, got {replaces!r}")
    unknown = [k for k in replaces if k not in config]
    if unknown:
        raise ValueError(f"config {REPLACES}: {unknown} named but not set in this config")
    top = {k: v for k, v in config.items() if k not in (EXTENDS, REPLACES)}
    return overlay(base, top, replaces)


def load(path: str | Path, root: str | Path = ".") -> dict[str, Any]:
    """A config file read and resolved."""
    return resolve(yaml.safe_load(Path(path).read_text()), root)
