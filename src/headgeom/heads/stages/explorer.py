"""Write the study's explorer: one offline interactive HTML page (docs §19), from the
study's Parquets and the results catalog, headgeom.heads.explorer.

    python -m headgeom.heads.stages.explorer --heads H.parquet ... --effects E.parquet ... \\
        --geometry G.parquet ... [--leakage ...] [--clamps ...] [--edges ...] \\
        [--atlas ...] [--timeline ...] --catalog catalog.parquet --study demo \\
        --out results/demo/explorer.html

Every input must be listed in the catalog; the page cites each by path and SHA-256.
"""

from __future__ import annotations

import argparse
import sys

from headgeom.heads.explorer import page
from headgeom.heads.explorer.data import KINDS, gather


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for kind in KINDS:
        parser.add_argument(f"--{kind}", nargs="*", default=[], help=f"{kind} Parquets")
    parser.add_argument("--catalog", required=True, help="the study's results catalog")
    parser.add_argument("--study", required=True, help="the study's name (the page's title)")
    parser.add_argument("--out", required=True, help="the HTML file")
    args = parser.parse_args(argv)
    data = gather({k: getattr(args, k) for k in KINDS}, args.catalog)
    size = page.write(
        args.out,
        data,
        title=f"headgeom explorer: {args.study}",
        lede=f"{len(data.runs)} runs, tasks {', '.join(data.tasks)}. Every value is read from "
        "the Parquet named under its view; hover a mark for its numbers.",
    )
    print(f"wrote {args.out}: {len(data.runs)} runs, {len(data.sources)} Parquets, "
          f"{size / 1e6:.2f} MB", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
