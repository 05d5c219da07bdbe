"""Render one paper figure (PNG + SVG) and its source data (CSV) from result Parquets, with a
sidecar of input hashes (METHODS §17)."""

from __future__ import annotations

import argparse
import sys

from headgeom.figures import FIGURES, save_figure
from headgeom.hashing import sha256_file
from headgeom.io import write_json, write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--figure", required=True, choices=sorted(FIGURES))
    parser.add_argument("--inputs", nargs="+", required=True, help="result Parquets")
    parser.add_argument("--out-png", required=True)
    parser.add_argument("--out-svg", required=True)
    parser.add_argument("--out-csv", required=True, help="the plotted data")
    parser.add_argument("--out-sources", required=True)
    args = parser.parse_args(argv)

    build_data, draw = FIGURES[args.figure]
    data = build_data(args.inputs)
    fig = draw(data)
    save_figure(fig, args.out_png, "png")
    save_figure(fig, args.out_svg, "svg")
    write_text(args.out_csv, data.to_csv(index=False))
    write_json(
        args.out_sources,
        {"figure": args.figure, "inputs": {p: sha256_file(p) for p in args.inputs}},
    )
    print(f"wrote {args.out_png}, {args.out_svg} from {len(args.inputs)} inputs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
