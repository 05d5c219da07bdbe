"""Render one paper table (Markdown + CSV) from result Parquets, with a sidecar of input hashes."""

from __future__ import annotations

import argparse

from headgeom.hashing import sha256_file
from headgeom.io import write_json, write_text
from headgeom.tables import BUILDERS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--inputs", nargs="+", required=True, help="result Parquets")
    parser.add_argument("--out-md", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-sources", required=True)
    args = parser.parse_args(argv)

    frame, markdown = BUILDERS[args.table](args.inputs)
    write_text(args.out_csv, frame.to_csv(index=False))
    write_text(args.out_md, markdown)
    write_json(
        args.out_sources,
        {"table": args.table, "inputs": {p: sha256_file(p) for p in args.inputs}},
    )


if __name__ == "__main__":
    main()
