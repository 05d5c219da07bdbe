"""The atlas page (headgeom.atlas.page): one offline HTML file of the model's per-layer
profile, its edits' effects, retention and summary, with the compression table and the
two-checkpoint views where their (optional) tables are given.

    python -m headgeom.atlas.stages.page --model SmolLM2-135M-Instruct \\
        --profile profile.parquet --effects effects.parquet --retention retention.parquet \\
        --summary summary.parquet [--compression compression.parquet] \\
        [--pair base-vs-tuned=atlas/pairs/base-vs-tuned] --out atlas.html
"""

from __future__ import annotations

import argparse
import sys

from headgeom.atlas.page import page
from headgeom.atlas.page.data import AtlasPageInputError


def _pair(text: str) -> tuple[str, str]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"--pair {text!r}: expected NAME=FOLDER")
    return name, folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model's name on the page")
    for table in ("profile", "effects", "retention", "summary"):
        p.add_argument(f"--{table}", required=True, help=f"atlas_{table} Parquet")
    p.add_argument("--compression", help="the compression table (optional)")
    p.add_argument("--pair", type=_pair, action="append", default=[],
                   help="NAME=FOLDER of a pair's tables (optional, repeatable)")  # fmt: skip
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    tables = ("profile", "effects", "retention", "summary", "compression")
    paths = {t: getattr(args, t) for t in tables if getattr(args, t)}
    try:
        size = page.write_page(paths, args.out, args.model, dict(args.pair))
    except AtlasPageInputError as err:
        sys.exit(f"atlas_page: {err}")
    print(f"atlas_page: {args.out} ({size:,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
