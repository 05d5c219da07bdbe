"""A pair of checkpoints in Markdown (:mod:`headgeom.atlas.pair_report`): the blend dial, where
the probes switch, the KL between the ends, the largest drifts, the grafts and whether the
change is low-rank.

    python -m headgeom.atlas.stages.pair_report --name base-vs-tuned --blend blend.parquet \\
        --probes probes.parquet --drift drift.parquet [--grafts grafts.parquet] \\
        [--lowrank lowrank.parquet] --out pair.md
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import datafile
from headgeom.atlas import pair_report
from headgeom.io import read_parquet_metadata, read_table, write_text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="the pair's name")
    for table in ("blend", "probes", "drift"):
        p.add_argument(f"--{table}", required=True, help=f"atlas_pair_{table} Parquet")
    p.add_argument("--grafts", help="atlas_pair_grafts Parquet (optional)")
    p.add_argument("--lowrank", help="atlas_pair_lowrank Parquet (optional)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    frames = {t: read_table(getattr(args, t)).to_pandas() if getattr(args, t) else None
              for t in ("blend", "probes", "drift", "grafts", "lowrank")}  # fmt: skip
    sources = json.loads(read_parquet_metadata(args.drift)["sources"])
    references = datafile.read("headgeom.atlas", "references.yaml")
    text = pair_report.markdown(args.name, sources, frames["blend"], frames["probes"],
                                frames["drift"], frames["grafts"], frames["lowrank"],
                                references=references)  # fmt: skip
    write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
