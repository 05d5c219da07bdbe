"""Render one paper figure (PNG + SVG) and its source data (CSV) from result Parquets, with a
sidecar of input hashes (docs §17).

Inputs come in kinds, one ``--input KIND PATH...`` per kind (the kinds of the figure's record,
``headgeom.heads.paper.outputs``); ``--models`` restricts a figure drawn from a cross-model Parquet
(Figure 4) to those models."""

from __future__ import annotations

import argparse
import sys

from headgeom.hashing import sha256_file
from headgeom.heads.paper.inputs import grouped_inputs
from headgeom.heads.paper.outputs import FIGURES
from headgeom.io import write_json, write_text
from headgeom.plotting import save_figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--figure", required=True, choices=sorted(FIGURES))
    parser.add_argument(
        "--input",
        nargs="+",
        action="append",
        required=True,
        metavar=("KIND", "PATH"),
        help="an input kind (runs, heads, lanes, eval, robustness, loss, pk, geometry) and "
        "its Parquets",
    )
    parser.add_argument("--models", nargs="+", help="figure4: the models to plot, in order")
    parser.add_argument("--out-png", required=True)
    parser.add_argument("--out-svg", required=True)
    parser.add_argument("--out-csv", required=True, help="the plotted data")
    parser.add_argument("--out-sources", required=True)
    args = parser.parse_args(argv)

    inputs = grouped_inputs(args.input)
    record = FIGURES[args.figure]
    build_data, draw = record.function("build"), record.function("draw")
    if args.models is not None and not record.plots_models:
        told = [n for n, o in FIGURES.items() if o.plots_models]
        parser.error(f"--models applies to {', '.join(told)} only")
    data = build_data(inputs, models=args.models) if args.models else build_data(inputs)
    fig = draw(data)
    save_figure(fig, args.out_png, "png")
    save_figure(fig, args.out_svg, "svg")
    write_text(args.out_csv, data.to_csv(index=False))
    write_json(
        args.out_sources,
        {
            "figure": args.figure,
            "inputs": {p: sha256_file(p) for paths in inputs.values() for p in paths},
            "kinds": inputs,
            "models": args.models,
        },
    )
    n_inputs = sum(map(len, inputs.values()))
    print(f"wrote {args.out_png}, {args.out_svg} from {n_inputs} inputs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
