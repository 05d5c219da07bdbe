"""The paper's downstream suite of a Hub family (SAMOE §11, §19.2): HellaSwag, ARC-Easy, PIQA
and WinoGrande through lm-evaluation-harness at the pinned commit, in the family's tokenizer.

    python src/samoe_hub_downstream.py --family smollm2 --downstream-json '{"tasks":[...],
        "harness_commit":"b954..."}' --out downstream.parquet

Not built: the job stops naming what it would need and writes nothing (the toy's suite is
``headgeom.samoe.downstream``, written by samoe_corpus).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--downstream-json", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.downstream_json)
    sys.exit(
        f"samoe_hub_downstream {args.family}: the paper's downstream suite (tasks "
        f"{cfg.get('tasks')} through lm-evaluation-harness at commit "
        f"{cfg.get('harness_commit')}, max_len {cfg.get('max_len')}) is not built yet; "
        f"{args.out} is not written, so samoe_quality of this family cannot run (the corpus, "
        "training and every other analysis can)"
    )


if __name__ == "__main__":
    sys.exit(main())
