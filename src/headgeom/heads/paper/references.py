"""The paper's reference numbers as data: ``references.yaml`` beside this module.

One record per number (docs §20): its section, metric, model, split, the paper's printed
value with its number or range, the printed decimals, and the recipe (with its arguments)
that computes a run's value (:mod:`headgeom.heads.paper.recipes`). Two lists:

* :func:`references`: the paper-vs-run comparison's rows, in order
  (:mod:`headgeom.heads.paper.comparison` binds each to its recipe);
* :func:`printed`: values the tables print beside a run's value that the comparison does not
  compute.

The parameter counts and validation losses are the model zoo's (``headgeom/model/zoo.yaml``,
record key ``from_zoo``): written there once and read from there. A table or check asks for
a record by ``id`` (:func:`entry`, :func:`text`). The file is checked against
``references.schema.yaml`` on first use; a problem names the file, the record and the key.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from headgeom import datafile
from headgeom.model import zoo

NAME = "references"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One paper number: ``paper`` as printed and its range [low, high] (a point value has
    low = high; None for a printed value that is no number); for a comparison record its
    recipe and arguments."""

    section: str
    metric: str
    model: str
    paper: str
    low: float | None
    high: float | None
    split: str = "evaluation"
    decimals: int | None = None
    percent: bool = False
    recipe: str | None = None
    args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    id: str | None = None
    where: str = field(default="", compare=False)  # the record, as messages name it


def _name(_list: str, _index: int, record: Any) -> str:
    if not isinstance(record, dict):
        return "?"
    return f"{record.get('section', '?')} {record.get('metric', '?')}, {record.get('model', '?')}"


def _bounds(record: Mapping) -> tuple[float | None, float | None]:
    if "range" in record:
        return float(record["range"][0]), float(record["range"][1])
    if "value" in record:
        return float(record["value"]), float(record["value"])
    return None, None


def _from_zoo(record: Mapping, fail) -> tuple[str, float]:
    """(printed text, number) of a ``from_zoo`` record."""
    source = record["from_zoo"]
    configuration = zoo.BY_KEY.get(source["configuration"])
    if configuration is None:
        close = difflib.get_close_matches(source["configuration"], list(zoo.BY_KEY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise fail("from_zoo.configuration", f"no zoo configuration {source['configuration']!r}"
                   f"{hint}")  # fmt: skip
    if source["field"] == "n_params":
        if "seed" in source:
            raise fail("from_zoo.seed", "n_params is per configuration: give no seed")
        return configuration.printed, round(configuration.n_params / 1e6, 2)
    if "seed" not in source:
        raise fail("from_zoo", "val_loss needs the seed")
    loss = configuration.val_loss.get(source["seed"])
    if loss is None:
        raise fail("from_zoo.seed", f"{configuration.key} has no paper validation loss for seed "
                   f"{source['seed']} (seeds: {list(configuration.seeds)})")  # fmt: skip
    return f"{loss:.{record['decimals']}f}", loss


def _entry(data: Mapping, part: str, index: int) -> Entry:
    record = data[part][index]
    where = datafile.entry_where(data, [part, index], _name)

    def fail(key: str, text: str) -> datafile.DataFileError:
        return datafile.problem(__package__, NAME, datafile.entry_where(
            data, [part, index], _name, key), text)  # fmt: skip

    low, high = _bounds(record)
    if low is not None and not low <= high:
        raise fail("range", f"low {low} is above high {high}")
    paper = record.get("paper")
    if "from_zoo" in record:
        paper, low = _from_zoo(record, fail)
        high = low
    return Entry(
        section=record["section"],
        metric=record["metric"],
        model=record["model"],
        paper=paper,
        low=low,
        high=high,
        split=record.get("split", "evaluation"),
        decimals=record.get("decimals"),
        percent=record.get("percent", False),
        recipe=record.get("recipe"),
        args=MappingProxyType(dict(record.get("args", {}))),
        id=record.get("id"),
        where=where,
    )


@functools.cache
def _load() -> tuple[tuple[Entry, ...], tuple[Entry, ...], Mapping[str, Entry]]:
    data = datafile.load(__package__, NAME, _name)
    parts = {
        part: tuple(_entry(data, part, i) for i in range(len(data[part])))
        for part in ("references", "printed")
    }
    by_id: dict[str, Entry] = {}
    for entry in (*parts["references"], *parts["printed"]):
        if entry.id is None:
            continue
        if entry.id in by_id:
            raise datafile.problem(__package__, NAME, f"{entry.where}, key id",
                                   f"{entry.id!r} names {by_id[entry.id].where} too")  # fmt: skip
        by_id[entry.id] = entry
    return parts["references"], parts["printed"], MappingProxyType(by_id)


def references() -> tuple[Entry, ...]:
    """The comparison's records, in the order of its table."""
    return _load()[0]


def printed() -> tuple[Entry, ...]:
    """The values tables print that the comparison does not compute."""
    return _load()[1]


def entry(id: str) -> Entry:
    """The record named ``id`` (either list)."""
    by_id = _load()[2]
    if id not in by_id:
        close = difflib.get_close_matches(id, list(by_id), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        where = datafile.path_of(__package__, f"{NAME}.yaml")
        raise KeyError(f"{where} has no record with id {id!r}{hint}")
    return by_id[id]


def text(id: str) -> str:
    """The paper's printed value of the record named ``id``."""
    return entry(id).paper


def value(id: str) -> float:
    """The paper's number of the point-valued record named ``id``."""
    found = entry(id)
    if found.low is None or found.low != found.high:
        raise ValueError(f"{found.where} ({id!r}): {found.paper!r} is not one number")
    return found.low
