"""Render one paper table (Markdown, LaTeX and CSV) from result Parquets, with a sidecar of
input hashes (docs §17).

Inputs come in kinds, one ``--input KIND PATH...`` per kind: the kinds of the table's record
(``headgeom.heads.paper.outputs``)."""

from __future__ import annotations

import argparse
import sys

from headgeom.hashing import sha256_file
from headgeom.heads.paper.inputs import grouped_inputs
from headgeom.heads.paper.outputs import TABLE_JOBS, TABLES
from headgeom.io import write_json, write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", required=True, choices=sorted(TABLE_JOBS))
    parser.add_argument(
        "--input",
        nargs="+",
        action="append",
        required=True,
        metavar=("KIND", "PATH"),
        help="an input kind (runs, eval, summaries, robustness, ...) and its Parquets",
    )
    parser.add_argument("--out-md", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-tex", required=True)
    parser.add_argument("--out-sources", required=True)
    args = parser.parse_args(argv)

    inputs = grouped_inputs(args.input)
    table = TABLES[args.table].function("build")(inputs)
    # build every text first: a failing renderer leaves no partial set of outputs
    csv, markdown, latex = table.frame.to_csv(index=False), table.markdown(), table.latex()
    write_text(args.out_csv, csv)
    write_text(args.out_md, markdown)
    write_text(args.out_tex, latex)
    write_json(
        args.out_sources,
        {
            "table": args.table,
            "inputs": {p: sha256_file(p) for paths in inputs.values() for p in paths},
            "kinds": inputs,
        },
    )
    print(
        f"wrote {args.out_md} (+ .csv, .tex) from {sum(map(len, inputs.values()))} inputs",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
