"""Edge patching versus weight-space PK of one run (docs §15.1, Table 7), and optionally the
ACDC circuit (docs §15.4) on the same examples.

    python src/edges.py --checkpoint CKPT --manifest MANIFEST --task sva.parquet \\
        --split validation --n-examples 16 --dtype float64 --threads 1 \\
        --out-edges edges.parquet --out-summary summary.parquet [--out-acdc acdc.parquet]

The examples are the first ``--n-examples`` of the split in canonical order (ascending
example_id) with a quarter per condition (``task_files.first_per_condition``); their ids are
recorded in the metadata. The model runs in ``--dtype`` (float64 by default: the demo's edge
KLs, ~1e-7..1e-5, sit close to float32's noise; docs §15.1).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from headgeom import results
from headgeom.analysis import acdc, edges
from headgeom.data.task_files import first_per_condition, model_inputs, read_task
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads

DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    parser.add_argument(
        "--dtype", choices=tuple(DTYPES), default="float64", help="dtype the model runs in"
    )
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
    # converted after the verified load, so the checkpoint's hash is of the stored weights
    model = model.to(device=pick_device(args.device), dtype=DTYPES[args.dtype]).eval()
    task = read_task(args.task, [args.split])
    frame = first_per_condition(task, args.split, args.n_examples, args.task)
    inputs = model_inputs(frame, vocab)
    identity = {
        "model": manifest["model_name"],
        "seed": int(manifest["init_seed"]),
        "task": task.name,
        "split": args.split,
    }
    metadata = {
        "analysis": "edges",
        "analysis_version": "2",  # 2: the exact KL and the examples by condition
        **results.provenance(manifest, task_dataset_sha256=task.dataset_sha256),
        "kl": "KL(P_clean || P_patched) = sum_v p_v (log p_v - log q_v), full vocabulary, "
        "final position, float64 log-softmax of the final-position logits",
        "dtype": args.dtype,
        "logit_rounding_bound": edges.logit_rounding(model),
        "example_selection": "first n/4 of each condition by ascending example_id",
        "example_ids": [int(i) for i in frame["example_id"]],
        "examples_per_condition": {
            str(c): int(k) for c, k in frame["condition"].value_counts(sort=False).items()
        },
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
        # Each check's tolerance is 2·kl_rounding_bound: the two routes' logits are each
        # within δ = 4·(L+1)·eps(dtype)·logit_scale (a weight bound on |logit|) of the exact
        # ones, and the KL moves by at most δ·(‖q − p‖₁ + E_p|log p/q − KL|) + 2δ² (§15.4).
        worst = max((abs(a - b) for _, a, b, _ in out.checks), default=0.0)
        ratio = max((abs(a - b) / t for _, a, b, t in out.checks), default=0.0)
        if ratio > 1:
            i, a, b, t = max(out.checks, key=lambda c: abs(c[1] - c[2]) / c[3])
            raise AssertionError(
                f"ACDC decision {i}: engine KL {a:.6e}, hooked recomputation {b:.6e}, "
                f"difference {abs(a - b):.2e} above its rounding tolerance {t:.2e} ({args.dtype})"
            )
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
                "check_decisions_max_residual_over_tolerance": ratio,
            },
        )
        print(f"ACDC: {len(rows)} edges kept of {len(out.decisions)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
