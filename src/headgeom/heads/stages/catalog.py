"""Write the results catalog of a study: one row per artifact (path, rule, wildcards,
SHA-256, the checkpoint manifest of its run), headgeom.catalog.

    python -m headgeom.heads.stages.catalog --results results/demo \\
        --templates '{"results/demo/...": "rule"}' \\
        --models '["learned", ...]' --out results/demo/catalog.parquet
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import results
from headgeom.catalog import catalog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="the study's results folder")
    parser.add_argument("--templates", required=True, help="JSON {output template: rule}")
    parser.add_argument("--models", required=True, help="JSON list of the study's models")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    frame = catalog(args.results, json.loads(args.templates), json.loads(args.models),
                    skip=[args.out])  # fmt: skip
    results.CATALOG.write(args.out, frame, results.file_metadata("catalog"))
    print(f"catalogued {len(frame)} artifacts of {frame['rule'].nunique()} rules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
