"""Edge patching versus weight-space PK of one run (docs §15.1, Table 7).

    python -m headgeom.heads.stages.edges --checkpoint CKPT --manifest MANIFEST \\
        --task sva.parquet \\
        --split validation --n-examples 16 --dtype float64 --threads 1 \\
        --out-edges edges.parquet --out-summary summary.parquet

The examples are the first ``--n-examples`` of the split in canonical order (ascending
example_id) with a quarter per condition (``task_files.first_per_condition``); their ids are
recorded in the metadata. The model runs in ``--dtype`` (float64 by default: the demo's edge
KLs, ~1e-7..1e-5, sit close to float32's noise; docs §15.1). The ACDC circuit on the same
examples is heads/stages/acdc.py.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.heads.analysis import edges
from headgeom.runtime import pick_device, set_threads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    edges.add_stage_arguments(parser)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-rows", type=int, required=True)
    parser.add_argument("--out-edges", required=True)
    parser.add_argument("--out-summary", required=True)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    stage = edges.stage_inputs(args.checkpoint, args.manifest, args.task, args.split,
                               args.n_examples, args.dtype, pick_device(args.device))  # fmt: skip
    x = stage.inputs
    table = edges.edge_frame(stage.model, x.clean_ids, x.ref_ids, args.batch_size, args.max_rows)
    summary = {**stage.identity, "n_examples": stage.n_examples, **edges.edge_correlations(table)}
    summary = {k: v for k, v in summary.items() if k in results.EDGE_SUMMARY.names}
    results.EDGES.write(args.out_edges, table.assign(**stage.identity), stage.metadata)
    results.EDGE_SUMMARY.write(args.out_summary, pd.DataFrame([summary]), stage.metadata)
    print(f"wrote {len(table)} edges: pooled ρ {summary['pooled_spearman']:.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
