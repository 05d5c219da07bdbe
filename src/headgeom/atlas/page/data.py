"""What the atlas page shows, read from the atlas's Parquets (the contract: ATLAS_SCHEMA.md):
one model's tables under ``<atlas>/<model>/`` and each pair's under ``<atlas>/pairs/<pair>/``,
the rows exactly as the Parquet holds them and only the columns the contract names.

The per-layer profile and the edits are what the page is about, so they must be there; every
other table is optional, and its view is left out when it is absent (a model without a PLE
branch simply has no ``ple`` rows). A table that is there must have every column of the
contract, of its kind, and only rows of the model or pair it is filed under: otherwise it is
refused, naming the file and the column.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headgeom.hashing import sha256_file
from headgeom.io import read_table

# Column kinds: "text", "int", "float" (null allowed), "bool".
_MODEL = {"model": "text"}
_PAIR = {"pair": "text"}
_EDIT_KEY = {"edit": "text", "scope": "text", "layer": "int", "block": "text"}
_VS_ENDS = {"kl_to_a": "float", "kl_to_b": "float", "retention": "float"}

#: table -> {column: kind}, one model's (ATLAS_SCHEMA.md "Single model").
MODEL_TABLES: dict[str, dict[str, str]] = {
    "profile": {
        **_MODEL, "layer": "int", "block": "text", "write_size": "float",
        "constant_part": "float", "volume_knob": "float", "old_state_carried": "float",
    },
    "edits": {
        **_MODEL, **_EDIT_KEY, "corpus": "text", "kl": "float", "delta_top1": "float",
        "n_tokens": "int",
    },
    "retention": {
        **_MODEL, **_EDIT_KEY, "skill": "text", "n_items": "int", "retained": "int",
        "retention": "float",
    },
    "compression": {
        **_MODEL, "method": "text", "group": "text", "setting": "text", "bytes": "int",
        "bytes_original": "int", "corpus": "text", "kl": "float", "delta_top1": "float",
        "retention": "float",
    },
}  # fmt: skip
#: table -> {column: kind}, one pair's (ATLAS_SCHEMA.md "Two checkpoints").
PAIR_TABLES: dict[str, dict[str, str]] = {
    "blend": {**_PAIR, "alpha": "float", "corpus": "text", **_VS_ENDS},
    "probes": {
        **_PAIR, "alpha": "float", "probe": "text", "prompt": "text", "answer": "text",
        "expected": "text", "correct": "bool", "lead": "float",
    },
    "grafts": {
        **_PAIR, "direction": "text", "group": "text", "layer": "int", "part": "text",
        "corpus": "text", **_VS_ENDS,
    },
    "drift": {**_PAIR, "tensor": "text", "group": "text", "layer": "int", "drift": "float"},
    "lowrank": {**_PAIR, "mode": "text", "k": "int", "corpus": "text", **_VS_ENDS},
}  # fmt: skip
#: The model's tables the page cannot do without.
REQUIRED = ("profile", "edits")


class AtlasPageInputError(ValueError):
    """An atlas table the page cannot show (missing, a column missing or of another kind,
    rows of another model or pair)."""


@dataclass(frozen=True)
class Source:
    """One Parquet a view was drawn from: its path and SHA-256."""

    table: str
    path: str
    sha256: str
    pair: str | None = None


@dataclass
class Pair:
    """Two checkpoints of one lineage and their tables (absent: not computed)."""

    name: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


@dataclass
class AtlasData:
    model: str
    tables: dict[str, pd.DataFrame]
    pairs: list[Pair]
    sources: list[Source]


def _kind_ok(values: pd.Series, kind: str) -> bool:
    present = values.dropna()
    if present.empty:  # an all-null column (volume_knob without post-norms) has any type
        return True
    if kind == "text":
        return all(isinstance(v, str) for v in present)
    if kind == "bool":
        return pd.api.types.is_bool_dtype(present) or all(isinstance(v, bool) for v in present)
    if pd.api.types.is_bool_dtype(present) or not pd.api.types.is_numeric_dtype(present):
        return False
    if kind == "int":  # an integer column with nulls reads back as float
        return bool((present == present.round()).all())
    return True


_KIND_WORDS = {"text": "text", "int": "integers", "float": "numbers", "bool": "booleans"}


def read(path: Path, spec: Mapping[str, str], owner: str, name: str) -> pd.DataFrame:
    """The table at ``path`` with the contract's columns ``spec``, checked: every column
    there and of its kind, every row's ``owner`` column (model or pair) equal to ``name``."""
    table = read_table(path)
    missing = [c for c in spec if c not in table.column_names]
    if missing:
        raise AtlasPageInputError(
            f"{path}: no column {missing[0]!r} (the atlas contract's columns: {list(spec)}; "
            f"the file has {table.column_names})"
        )
    frame = table.select(list(spec)).to_pandas()
    for column, kind in spec.items():
        if not _kind_ok(frame[column], kind):
            raise AtlasPageInputError(
                f"{path}: column {column!r} is {frame[column].dtype}, expected {_KIND_WORDS[kind]}"
            )
    others = sorted(set(frame[owner].dropna()) - {name})
    if others or frame[owner].isna().any():
        raise AtlasPageInputError(
            f"{path}: rows of {owner} {others or [None]}, expected only {owner} {name!r}"
        )
    return frame.drop(columns=[owner])


def gather(atlas_dir: str | os.PathLike, model: str, pairs: Sequence[str] = ()) -> AtlasData:
    """Read ``model``'s tables from ``<atlas_dir>/<model>/`` and each pair's from
    ``<atlas_dir>/pairs/<pair>/``. A named pair without any of its tables is refused (a
    misspelt name would otherwise silently drop its views)."""
    root = Path(atlas_dir)
    sources: list[Source] = []
    tables: dict[str, pd.DataFrame] = {}
    for table, spec in MODEL_TABLES.items():
        path = root / model / f"{table}.parquet"
        if not path.is_file():
            if table in REQUIRED:
                raise AtlasPageInputError(
                    f"{path}: not found; the atlas page needs {model}'s {table} table "
                    f"(tables {list(REQUIRED)} are required, the others optional)"
                )
            continue
        tables[table] = read(path, spec, "model", model)
        sources.append(Source(table, str(path), sha256_file(path)))
    read_pairs = []
    for name in pairs:
        pair = Pair(name)
        for table, spec in PAIR_TABLES.items():
            path = root / "pairs" / name / f"{table}.parquet"
            if path.is_file():
                pair.tables[table] = read(path, spec, "pair", name)
                sources.append(Source(table, str(path), sha256_file(path), name))
        if not pair.tables:
            raise AtlasPageInputError(
                f"{root / 'pairs' / name}: no table of pair {name!r} "
                f"(expected some of {[f'{t}.parquet' for t in PAIR_TABLES]})"
            )
        read_pairs.append(pair)
    return AtlasData(model, tables, read_pairs, sources)
