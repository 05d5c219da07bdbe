"""Edge patching versus weight-space PK of one run (docs §15.1, Table 7), and optionally the
ACDC circuit (docs §15.4) on the same examples.

    python src/edges.py --checkpoint CKPT --manifest MANIFEST --task sva.parquet \\
        --split validation --n-examples 16 --threads 1 \\
        --out-edges edges.parquet --out-summary summary.parquet [--out-acdc acdc.parquet]

The first ``--n-examples`` examples of the split in file order (canonical order) are used.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.analysis import acdc, edges
from headgeom.data.task_files import model_inputs, read_task
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--split", default="validation")
    parser.add_argument("--n-examples", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-rows", type=int, default=2048)
    parser.add_argument("--acdc-threshold", type=float, default=0.001)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-edges", help="with --out-summary: the edge analysis")
    parser.add_argument("--out-summary")
    parser.add_argument("--out-acdc", default=None, help="run ACDC and write its circuit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    model = model.to(pick_device(args.device)).eval()
    task = read_task(args.task, [args.split])
    frame = task.frame.head(args.n_examples)
    if len(frame) < args.n_examples:
        raise ValueError(
            f"{args.task}: split {args.split!r} has {len(frame)} examples, "
            f"--n-examples asks for {args.n_examples}"
        )
    inputs = model_inputs(frame, vocab)
    identity = {
        "model": manifest["model_name"],
        "seed": int(manifest["init_seed"]),
        "task": task.name,
        "split": args.split,
    }
    metadata = {
        "analysis": "edges",
        "analysis_version": "1",
        **results.provenance(manifest, task_dataset_sha256=task.dataset_sha256),
        "kl": "KL(P_clean || P_patched), full vocabulary, final position",
    }
    if args.out_edges and args.out_summary:
        table = edges.edge_frame(
            model, inputs.clean_ids, inputs.ref_ids, args.batch_size, args.max_rows
        )
        summary = {**identity, "n_examples": len(frame), **edges.edge_correlations(table)}
        summary = {k: v for k, v in summary.items() if k in results.EDGE_SUMMARY.names}
        results.EDGES.write(args.out_edges, table.assign(**identity), metadata)
        results.EDGE_SUMMARY.write(args.out_summary, pd.DataFrame([summary]), metadata)
        print(
            f"wrote {len(table)} edges: pooled ρ {summary['pooled_spearman']:.3f}", file=sys.stderr
        )
    if args.out_acdc:
        out = acdc.acdc(model, inputs.clean_ids, inputs.ref_ids, args.acdc_threshold)
        worst = max((abs(a - b) for _, a, b in out.checks), default=0.0)
        if worst > 1e-5:  # float32 round-off of two routes to the same KL
            raise AssertionError(f"ACDC decisions differ from the hooked recomputation by {worst}")
        before = {(s, d): (b, a) for s, d, b, a, _ in out.decisions}
        rows = [
            {
                **identity,
                "source_kind": s[0],
                "source_layer": s[1],
                "source_head": s[2],
                "target_kind": d[0],
                "target_layer": d[1],
                "target_head": d[2],
                "kl_if_removed": before[(s, d)][1],
                "kl_before": before[(s, d)][0],
            }
            for s, d in out.kept
        ]
        results.ACDC.write(
            args.out_acdc,
            pd.DataFrame(rows, columns=results.ACDC.names),
            {
                **metadata,
                "analysis": "acdc",
                "threshold": args.acdc_threshold,
                "n_decisions": len(out.decisions),
                "final_kl": out.final_metric,
                "check_decisions_sampled": len(out.checks),
                "check_decisions_max_abs_kl_residual": worst,
            },
        )
        print(f"ACDC: {len(rows)} edges kept of {len(out.decisions)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
