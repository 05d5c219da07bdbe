"""The ACDC circuit of one run (docs §15.4) on the edge analysis's examples (heads/stages/edges.py:
the first ``--n-examples`` of the split, a quarter per condition, the model in ``--dtype``).

    python -m headgeom.heads.stages.acdc --checkpoint CKPT --manifest MANIFEST --task sva.parquet \\
        --split validation --n-examples 16 --acdc-threshold 0.001 --dtype float64 \\
        --out acdc.parquet

Sampled decisions are recomputed by hooks (``acdc.hooked_metric``); one outside its rounding
tolerance stops the job before anything is written.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.heads.analysis import acdc, edges
from headgeom.runtime import pick_device, set_threads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    edges.add_stage_arguments(parser)
    parser.add_argument("--acdc-threshold", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    stage = edges.stage_inputs(args.checkpoint, args.manifest, args.task, args.split,
                               args.n_examples, args.dtype, pick_device(args.device))  # fmt: skip
    out = acdc.acdc(stage.model, stage.inputs.clean_ids, stage.inputs.ref_ids,
                    args.acdc_threshold)  # fmt: skip
    checks = acdc.checked_decisions(out, args.dtype)
    rows = acdc.circuit_rows(out, stage.identity)
    results.ACDC.write(
        args.out,
        pd.DataFrame(rows, columns=results.ACDC.names),
        {**stage.metadata, "analysis": "acdc", "threshold": args.acdc_threshold,
         "n_decisions": len(out.decisions), "final_kl": out.final_metric, **checks},
    )  # fmt: skip
    print(f"ACDC: {len(rows)} edges kept of {len(out.decisions)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
