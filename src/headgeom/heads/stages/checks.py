"""Collect every numerical acceptance check of the study into one table (docs §18).

    python -m headgeom.heads.stages.checks \\
        --files-json '[{"kind": "summary", "path": "...", "model": ...,
        "seed": ..., "task": ...}, ...]' --runs-json '[{"model": ..., "seed": ...,
        "geometry": ..., "corpus": ...}]' --out results/demo/checks.parquet

Each file's logged checks (Parquet metadata or a JSON artifact's ``checks``; the fixed format
of headgeom.checks) become rows; C16 and the §7.3 loss ordering are computed here. A file
that lacks a check its kind carries, or an enforced check that failed, stops the job.
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import checks, results
from headgeom.heads.paper import cross_run_checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files-json", required=True, help="JSON list of logged artifacts")
    parser.add_argument("--runs-json", required=True, help="JSON list of the study's runs")
    parser.add_argument("--out", required=True, help="output Parquet")
    args = parser.parse_args(argv)
    files, runs = json.loads(args.files_json), json.loads(args.runs_json)
    rows = checks.collect(files)
    rows += cross_run_checks.cross_run_checks(cross_run_checks.loss_runs(files, runs))
    frame = checks.table(rows)
    failed = checks.failures(frame)
    if len(failed):
        lines = [f"  {checks.describe(row)}" for _, row in failed.iterrows()]
        raise SystemExit("enforced checks failed (docs §18):\n" + "\n".join(lines))
    results.CHECKS.write(args.out, frame, {**results.file_metadata("checks"),
                                           "n_files": len(files)})  # fmt: skip
    print(f"{checks.summary_line(frame)} (from {len(files)} files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
