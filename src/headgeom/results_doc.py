"""The column tables of docs/results.md, generated from the results contract
(:mod:`headgeom.results`): each column's description exists once, in the schema every
Parquet carries as field metadata, and the reference shows the same words.

    python -m headgeom.results_doc            # rewrite the column tables of both docs
    python -m headgeom.results_doc --check    # exit 1, naming them, when any is stale

One reference per study kind (:data:`headgeom.studies.KINDS`: ``results_doc`` documents the
tables of ``results``): docs/results.md (the head-geometry study, :mod:`headgeom.results`) and
docs/samoe.md (the SA-MoE study, :mod:`headgeom.samoe.results`).

The prose around each table (paths, rules, metadata keys, formulas) is written by hand; a
table is the block between ``<!-- columns: NAME -->`` and ``<!-- /columns -->``, NAME a
:class:`headgeom.results.ResultTable`. Every result table has exactly one block.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pyarrow as pa

from headgeom import results
from headgeom.io import write_text
from headgeom.studies import KINDS, ROOT, results_tables

#: Each reference and the result tables whose columns it documents.
DOCS = {ROOT / kind.results_doc: results_tables(kind) for kind in KINDS.values()}
BLOCK = re.compile(r"<!-- columns: (?P<name>\w+) -->\n(?P<body>.*?)<!-- /columns -->", re.S)


#: Arrow's names of the float types, as numpy and pandas call them.
FLOATS = {"halffloat": "float16", "float": "float32", "double": "float64"}


def type_name(type_: pa.DataType) -> str:
    """An Arrow type as the reference prints it: floats by their numpy names, a dictionary
    (categorical) column as ``dictionary<its value type>``, lists by their element type."""
    if pa.types.is_dictionary(type_):
        return f"dictionary<{type_name(type_.value_type)}>"
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return f"list<{type_name(type_.value_type)}>"
    return FLOATS.get(str(type_), str(type_))


def column_table(table: results.ResultTable) -> str:
    """The Markdown table of ``table``: every column, its Arrow type, its description."""
    lines = ["| Column | Type | Description |", "|---|---|---|"]
    for field in table.schema:
        text = table.descriptions[field.name].replace("|", "\\|")
        lines.append(f"| `{field.name}` | {type_name(field.type)} | {text} |")
    return "\n".join(lines) + "\n"


def render(text: str, where: str = "docs/results.md", tables=None) -> str:
    """``text`` with every column block regenerated; an unknown, repeated or missing table
    is an error naming it."""
    tables = results.TABLES if tables is None else tables
    seen: list[str] = []

    def block(match: re.Match) -> str:
        name = match["name"]
        if name not in tables:
            raise ValueError(f"{where}: no result table {name!r}; known: {sorted(tables)}")
        seen.append(name)
        return f"<!-- columns: {name} -->\n{column_table(tables[name])}<!-- /columns -->"

    out = BLOCK.sub(block, text)
    repeated = sorted({n for n in seen if seen.count(n) > 1})
    missing = sorted(set(tables) - set(seen))
    if repeated or missing:
        raise ValueError(
            f"{where}: every result table needs one column block; "
            f"repeated: {repeated or 'none'}, missing: {missing or 'none'}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, help="one reference (default: both)")
    parser.add_argument("--check", action="store_true", help="only report stale tables")
    args = parser.parse_args(argv)
    docs = DOCS if args.doc is None else {args.doc: DOCS.get(args.doc.resolve(), results.TABLES)}
    status = 0
    for doc, tables in docs.items():
        text = doc.read_text()
        current = render(text, str(doc), tables)
        if current == text:
            continue
        if args.check:
            stale = [m["name"] for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(current),
                                               strict=True) if m[0] != n[0]]  # fmt: skip
            print(f"{doc}: stale column tables {stale}; run python -m headgeom.results_doc",
                  file=sys.stderr)  # fmt: skip
            status = 1
        else:
            write_text(doc, current)
    return status


if __name__ == "__main__":
    sys.exit(main())
