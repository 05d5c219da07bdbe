"""What the atlas page shows, read from the atlas's Parquets: the rows exactly as the Parquet
holds them and only the columns of the results contract (:mod:`headgeom.atlas.results`, whose
``ResultTable`` schemas are the column lists checked here: there is no second copy).

The per-layer profile, the edits' effects and their summary (the mean over corpora) are what
the page is about, so they must be there; every other table is optional, and its view is left
out when it is absent (a model without a PLE branch simply has no ``ple`` rows; a study
without pairs has no two-checkpoint tables). A table that is there must have every column of
its contract: otherwise it is refused, naming the file and the column.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from headgeom.atlas import results
from headgeom.atlas.paths import TEMPLATES
from headgeom.hashing import sha256_file
from headgeom.io import read_table


def _kind(type_: pa.DataType) -> str:
    """A column's kind: text, int, float (null allowed) or bool."""
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "text"
    if pa.types.is_integer(type_):
        return "int"
    if pa.types.is_floating(type_):
        return "float"
    if pa.types.is_boolean(type_):
        return "bool"
    raise TypeError(f"the atlas page shows no column of type {type_}")


def _spec(table: results.ResultTable) -> dict[str, str]:
    return {f.name: _kind(f.type) for f in table.schema}


#: table -> {column: kind}, one model's: the results contract's.
MODEL_TABLES: dict[str, dict[str, str]] = {
    "profile": _spec(results.PROFILE),
    "effects": _spec(results.EFFECTS),
    "retention": _spec(results.RETENTION),
    "summary": _spec(results.SUMMARY),
    "compression": _spec(results.COMPRESSION),
}
#: table -> {column: kind}, one pair's (atlas/pairs/<pair>/<table>.parquet, a ``pair`` column
#: on every row): the results contract's.
PAIR_TABLES: dict[str, dict[str, str]] = {
    name: _spec(table) for name, table in results.PAIR_TABLES.items()
}
#: The model's tables the page cannot do without.
REQUIRED = ("profile", "effects", "summary")


class AtlasPageInputError(ValueError):
    """An atlas table the page cannot show (missing, a column missing or of another kind,
    rows of another pair)."""


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
    if present.empty:  # an all-null column (knob_rms without post-norms) has any type
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


def read(path: Path, spec: Mapping[str, str], pair: str | None = None) -> pd.DataFrame:
    """The table at ``path`` with the columns ``spec``, checked: every column there and of
    its kind; a pair's table (``pair``) only rows of that pair, its ``pair`` column dropped."""
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
    if pair is None:
        return frame
    others = sorted(set(frame["pair"].dropna()) - {pair})
    if others or frame["pair"].isna().any():
        raise AtlasPageInputError(
            f"{path}: rows of pair {others or [None]}, expected only pair {pair!r}"
        )
    return frame.drop(columns=["pair"])


def standard_paths(results_dir: str | os.PathLike) -> dict[str, Path]:
    """Where the atlas workflow writes one model's tables under ``results/<study>/``
    (:data:`headgeom.atlas.paths.TEMPLATES`)."""
    return {table: Path(results_dir) / TEMPLATES[table] for table in MODEL_TABLES}


def pair_dir(results_dir: str | os.PathLike, pair: str) -> Path:
    """Where a pair's tables are: ``results/<study>/atlas/pairs/<pair>/``."""
    return Path(results_dir) / "atlas" / "pairs" / pair


def gather(
    paths: Mapping[str, str | os.PathLike],
    model: str,
    pairs: Mapping[str, str | os.PathLike] | None = None,
) -> AtlasData:
    """Read ``model``'s tables from ``paths`` (table -> file; an optional table left out or
    absent: its view is left out) and each pair's from its folder (``pairs``: name ->
    folder). A named pair without any of its tables is refused (a misspelt name would
    otherwise silently drop its views)."""
    unknown = sorted(set(paths) - set(MODEL_TABLES))
    if unknown:
        raise AtlasPageInputError(f"tables {unknown}: the atlas page knows {list(MODEL_TABLES)}")
    sources: list[Source] = []
    tables: dict[str, pd.DataFrame] = {}
    for table, spec in MODEL_TABLES.items():
        path = Path(paths[table]) if table in paths else None
        if path is None or not path.is_file():
            if table in REQUIRED:
                raise AtlasPageInputError(
                    f"{path or table}: not found; the atlas page needs {model}'s {table} "
                    f"table (tables {list(REQUIRED)} are required, the others optional)"
                )
            continue
        tables[table] = read(path, spec)
        sources.append(Source(table, str(path), sha256_file(path)))
    read_pairs = []
    for name, folder in (pairs or {}).items():
        pair = Pair(name)
        for table, spec in PAIR_TABLES.items():
            path = Path(folder) / f"{table}.parquet"
            if path.is_file():
                pair.tables[table] = read(path, spec, name)
                sources.append(Source(table, str(path), sha256_file(path), name))
        if not pair.tables:
            raise AtlasPageInputError(
                f"{folder}: no table of pair {name!r} "
                f"(expected some of {[f'{t}.parquet' for t in PAIR_TABLES]})"
            )
        read_pairs.append(pair)
    return AtlasData(model, tables, read_pairs, sources)
