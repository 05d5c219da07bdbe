"""Validation loss versus N_eff and the rank agreement of N_eff variants (docs §12.3, §12.7).

    python -m headgeom.heads.stages.concentration_loss --robustness <robustness Parquets> \\
        --manifests <checkpoint manifests> --models '{"learned": {...}, ...}' \\
        --base-n-head 12 --split evaluation --loss-models '["learned", ...]' \\
        --out-loss loss.parquet --out-spearman spearman.parquet

The loss table has one row per (model, seed): the final validation loss of the checkpoint
manifest (x of paper Figure 4), N_eff per task on the analysis split and their geometric
mean (y), reader type and heads per layer. The Spearman table correlates loss with the
geometric-mean N_eff over the chosen models (all, and those with the base head count: the
paper's six 12-head models), and N_eff with per-example-absolute N_eff over the paper's
(model, task) pairs (``--paper-runs``: no multiscreen control) and within each task over the
Figure 3 models (``--figure3-runs``), plus every run (headgeom.heads.analysis.concentration).
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import results
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import concentration as conc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--robustness",
        nargs="+",
        required=True,
        help="robustness Parquets (heads/stages/concentration.py)",
    )
    parser.add_argument("--manifests", nargs="+", required=True)
    parser.add_argument(
        "--models",
        required=True,
        help="JSON {model: {display_name, geometry, corpus, n_head, reader_type}}",
    )
    parser.add_argument("--base-n-head", type=int, required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--loss-models", required=True, help="JSON list of models")
    parser.add_argument(
        "--paper-runs", help="JSON [[model, seed], ...] of §12.3's pooled Spearman (default: all)"
    )
    parser.add_argument(
        "--figure3-runs", help="JSON [[model, seed], ...] of §12.3's per-task Spearman"
    )
    parser.add_argument("--out-loss", required=True)
    parser.add_argument("--out-spearman", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = json.loads(args.models)
    included = json.loads(args.loss_models)
    summary = conc.read_summaries(args.robustness, args.split)
    losses = conc.read_losses(args.manifests)
    loss = conc.loss_table(summary, losses, models, args.base_n_head, included)
    paper_runs = json.loads(args.paper_runs) if args.paper_runs else None
    figure3_runs = json.loads(args.figure3_runs) if args.figure3_runs else None
    spearman = conc.spearman_rows(loss, summary, paper_runs, figure3_runs)
    metadata = {
        **results.file_metadata("concentration_loss"),
        "analysis_split": args.split,
        "base_n_head": args.base_n_head,
        "loss_models": included,
        "inputs_sha256": {p: sha256_file(p) for p in [*args.robustness, *args.manifests]},
    }
    results.LOSS.write(args.out_loss, loss, metadata)
    results.SPEARMAN.write(args.out_spearman, spearman, metadata)
    for row in spearman.to_dict("records"):
        print(
            f"{row['analysis']} {row['subset']} {row['task'] or ''}: n={row['n']} rho={row['rho']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
