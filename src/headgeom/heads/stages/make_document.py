"""Render several paper tables in one job (rule make_document; docs §17): Markdown, LaTeX
and CSV of each, with a sidecar of input hashes, from result Parquets.

Inputs come as ``--input TABLE:KIND PATH...`` (the kinds of each table's record,
``headgeom.heads.paper.outputs``); ``--context`` is the JSON of what the config says about the
models (Table 4's sections). One Python start for all tables: each make_table job costs
~4 s of imports on the demo."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.hashing import sha256_file
from headgeom.heads.paper.inputs import grouped_inputs
from headgeom.heads.paper.outputs import DOCUMENT_TABLES, TABLES
from headgeom.io import write_json, write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tables", nargs="+", required=True, choices=sorted(DOCUMENT_TABLES))
    parser.add_argument(
        "--input", nargs="+", action="append", default=[], metavar=("TABLE:KIND", "PATH"),
        help="a table, an input kind (runs, summaries, ...) and its Parquets",
    )  # fmt: skip
    parser.add_argument("--context", default="{}", help="JSON: models' geometry, sections")
    parser.add_argument("--out-dir", required=True, help="tables/ folder: <table>.md, ...")
    args = parser.parse_args(argv)

    per_table: dict[str, list[list[str]]] = {t: [] for t in args.tables}
    for table_kind, *paths in args.input:
        table, sep, kind = table_kind.partition(":")
        if not sep or table not in per_table:
            parser.error(f"--input {table_kind}: expected TABLE:KIND with TABLE in {args.tables}")
        per_table[table].append([kind, *paths])
    context = json.loads(args.context)
    rendered = {}
    for name in args.tables:  # build every text first: a failure leaves no partial set
        inputs = grouped_inputs(per_table[name])
        table = TABLES[name].function("build")(inputs, context)
        rendered[name] = (table, inputs)
    out = Path(args.out_dir)
    for name, (table, inputs) in rendered.items():
        write_text(out / f"{name}.csv", table.frame.to_csv(index=False))
        write_text(out / f"{name}.md", table.markdown())
        write_text(out / f"{name}.tex", table.latex())
        write_json(
            out / f"{name}.sources.json",
            {
                "table": name,
                "inputs": {p: sha256_file(p) for paths in inputs.values() for p in paths},
                "kinds": inputs,
            },
        )
        print(f"wrote {out / name}.md (+ .csv, .tex, .sources.json)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
