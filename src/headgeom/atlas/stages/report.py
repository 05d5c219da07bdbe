"""The atlas's merged tables: the shards' effects and retention in one file each, the
summary (one row per edit: KL and Δ top-1 averaged over corpora, mean retention over
skills capped at 1) and the Markdown report (headgeom.atlas.report).

    python -m headgeom.atlas.stages.report --effects effects_0.parquet effects_1.parquet \\
        --retention retention_0.parquet retention_1.parquet --profile profile.parquet \\
        --top 15 --out-effects effects.parquet --out-retention retention.parquet \\
        --out-summary summary.parquet --out-report atlas.md
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.atlas import report, sweep
from headgeom.atlas import results as atlas_results
from headgeom.io import read_table, write_text


def _read(paths: list[str]) -> pd.DataFrame:
    return pd.concat([read_table(p).to_pandas() for p in paths], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--effects", nargs="+", required=True)
    p.add_argument("--retention", nargs="+", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--top", type=int, required=True, help="edits in the report's first table")
    p.add_argument("--out-effects", required=True)
    p.add_argument("--out-retention", required=True)
    p.add_argument("--out-summary", required=True)
    p.add_argument("--out-report", required=True)
    args = p.parse_args(argv)
    effects, kept = _read(args.effects), _read(args.retention)
    dupes = effects.duplicated(["edit", "corpus"])
    if dupes.any():
        sys.exit(f"atlas_report: edit {effects[dupes]['edit'].iloc[0]!r} is in two shards")
    summary = sweep.summary(effects, kept)
    meta = {**results.file_metadata("atlas_report"), "shards": len(args.effects)}
    atlas_results.EFFECTS.write(args.out_effects, effects, meta)
    atlas_results.RETENTION.write(args.out_retention, kept, meta)
    atlas_results.SUMMARY.write(args.out_summary, summary, meta)
    profile = read_table(args.profile).to_pandas()
    write_text(args.out_report, "# Edit atlas\n\n" + report.markdown(summary, effects, profile,
                                                                     args.top))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
