"""Validation loss versus N_eff and the rank agreement of N_eff variants (METHODS §12.3, §12.7).

    python src/concentration_loss.py --robustness <robustness Parquets> \\
        --manifests <checkpoint manifests> --models '{"learned": {...}, ...}' \\
        --base-n-head 12 --split evaluation --loss-models '["learned", ...]' \\
        --out-loss loss.parquet --out-spearman spearman.parquet

The loss table has one row per (model, seed): the final validation loss of the checkpoint
manifest (x of paper Figure 4), N_eff per task on the analysis split and their geometric
mean (y), reader type and heads per layer. The Spearman table correlates loss with the
geometric-mean N_eff over the chosen models (all, and those with the base head count: the
paper's six 12-head models), and N_eff with per-example-absolute N_eff over all
(model, seed, task) rows and within each task (scipy.stats.spearmanr).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headgeom.analysis.stats import geometric_mean, spearman
from headgeom.hashing import sha256_file, source_freeze
from headgeom.io import read_json, write_parquet

TASKS = ("sva", "quote", "plural")

LOSS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("display_name", pa.string()),
        ("geometry", pa.string()),
        ("corpus", pa.string()),
        ("reader_type", pa.string()),
        ("n_head", pa.int32()),
        ("index_meaningful", pa.bool_()),
        ("val_loss", pa.float64()),
        *[(f"N_eff_{t}", pa.float64()) for t in TASKS],
        ("N_eff_geomean", pa.float64()),
        ("included", pa.bool_()),
    ]
)
LOSS_DESCRIPTIONS = {
    "display_name": "the paper's name of the configuration",
    "geometry": "read/write geometry (METHODS §6)",
    "corpus": "training corpus of the paper (R or S); null when the study does not say",
    "reader_type": "free (learned W_QKV after the shared LN) or block readers (marker of "
    "paper Figure 4)",
    "n_head": "heads per layer (16-head models are flagged in paper Figure 4)",
    "index_meaningful": "n_head equals the base architecture's (the paper's 12-head models)",
    "val_loss": "validation loss (nats) of the final checkpoint, from its manifest "
    "(val_loss_nats); x of paper Figure 4",
    **{f"N_eff_{t}": f"N_eff on {t}, analysis split" for t in TASKS},
    "N_eff_geomean": "geometric mean of N_eff over the three tasks; y of paper Figure 4",
    "included": "in the loss-versus-N_eff correlation (config concentration.loss_models)",
}
SPEARMAN_SCHEMA = pa.schema(
    [
        ("analysis", pa.string()),
        ("subset", pa.string()),
        ("task", pa.string()),
        ("n", pa.int64()),
        ("rho", pa.float64()),
        ("p_value", pa.float64()),
    ]
)
SPEARMAN_DESCRIPTIONS = {
    "analysis": "loss_vs_N_eff: validation loss vs geometric-mean N_eff over (model, seed) "
    "(METHODS §12.7); N_eff_vs_N_eff_abs: N_eff vs per-example-absolute N_eff (METHODS §12.3)",
    "subset": "all: every included (model, seed) or every (model, seed, task); base_heads: "
    "included models with the base head count; task: the (model, seed) rows of one task",
    "task": "task of a per-task row; null otherwise",
    "n": "points correlated",
    "rho": "Spearman ρ (scipy.stats.spearmanr); null when n < 3 or a variable is constant",
    "p_value": "two-sided p of ρ (scipy); null with ρ",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--robustness", nargs="+", required=True, help="robustness Parquets (src/concentration.py)"
    )
    parser.add_argument("--manifests", nargs="+", required=True)
    parser.add_argument(
        "--models",
        required=True,
        help="JSON {model: {display_name, geometry, corpus, n_head, reader_type}}",
    )
    parser.add_argument("--base-n-head", type=int, required=True)
    parser.add_argument("--split", default="evaluation")
    parser.add_argument("--loss-models", required=True, help="JSON list of models")
    parser.add_argument("--out-loss", required=True)
    parser.add_argument("--out-spearman", required=True)
    return parser.parse_args(argv)


def read_summaries(paths: list[str], split: str) -> pd.DataFrame:
    frames = []
    for path in paths:
        frame = pq.read_table(path).to_pandas()
        frame = frame[frame["split"] == split]
        if frame.empty:
            raise ValueError(f"{path}: no row of the analysis split {split!r}")
        frames.append(frame[["model", "seed", "task", "N_eff", "N_eff_abs"]])
    summary = pd.concat(frames, ignore_index=True)
    if summary.duplicated(["model", "seed", "task"]).any():
        raise ValueError("--robustness files hold some (model, seed, task) more than once")
    return summary


def read_losses(paths: list[str]) -> pd.DataFrame:
    rows = []
    for path in paths:
        manifest = read_json(path)
        missing = [k for k in ("model_name", "init_seed", "val_loss_nats") if k not in manifest]
        if missing:
            raise KeyError(f"{path}: checkpoint manifest lacks {missing}")
        rows.append(
            {
                "model": manifest["model_name"],
                "seed": int(manifest["init_seed"]),
                "val_loss": manifest["val_loss_nats"],
            }
        )
    return pd.DataFrame(rows)


def loss_table(summary, losses, models, base_n_head, included) -> pd.DataFrame:
    wide = summary.pivot(index=["model", "seed"], columns="task", values="N_eff")
    missing_tasks = [t for t in TASKS if t not in wide.columns]
    if missing_tasks:
        raise ValueError(f"summaries lack tasks {missing_tasks}")
    wide = wide[list(TASKS)].add_prefix("N_eff_").reset_index()
    frame = losses.merge(wide, on=["model", "seed"], how="outer", indicator=True)
    unmatched = frame[frame["_merge"] != "both"]
    if not unmatched.empty:
        raise ValueError(
            "manifests and summaries name different (model, seed): "
            + ", ".join(
                f"{m} s{s} ({w})" for m, s, w in unmatched[["model", "seed", "_merge"]].values
            )
        )
    frame = frame.drop(columns="_merge")
    unknown = sorted(set(frame["model"]) - set(models))
    if unknown:
        raise ValueError(f"--models lacks {unknown}")
    for key in ("display_name", "geometry", "corpus", "reader_type", "n_head"):
        frame[key] = [models[m].get(key) for m in frame["model"]]
    frame["n_head"] = frame["n_head"].astype("int32")
    frame["index_meaningful"] = frame["n_head"] == base_n_head
    frame["N_eff_geomean"] = geometric_mean(frame[[f"N_eff_{t}" for t in TASKS]].to_numpy())
    frame["included"] = frame["model"].isin(included)
    return frame.sort_values(["model", "seed"]).reset_index(drop=True)


def spearman_rows(loss: pd.DataFrame, summary: pd.DataFrame) -> list[dict]:
    rows = []
    chosen = loss[loss["included"]]
    for subset, frame in (("all", chosen), ("base_heads", chosen[chosen["index_meaningful"]])):
        rho, p = spearman(frame["val_loss"].to_numpy(), frame["N_eff_geomean"].to_numpy())
        rows.append(_row("loss_vs_N_eff", subset, None, len(frame), rho, p))
    groups = [("all", None, summary)] + [("task", t, summary[summary["task"] == t]) for t in TASKS]
    for subset, task, frame in groups:
        rho, p = spearman(frame["N_eff"].to_numpy(), frame["N_eff_abs"].to_numpy())
        rows.append(_row("N_eff_vs_N_eff_abs", subset, task, len(frame), rho, p))
    return rows


def _row(analysis, subset, task, n, rho, p) -> dict:
    finite = np.isfinite(rho)
    return {
        "analysis": analysis,
        "subset": subset,
        "task": task,
        "n": n,
        "rho": float(rho) if finite else None,
        "p_value": float(p) if finite else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = json.loads(args.models)
    included = json.loads(args.loss_models)
    summary = read_summaries(args.robustness, args.split)
    loss = loss_table(summary, read_losses(args.manifests), models, args.base_n_head, included)
    rows = spearman_rows(loss, summary)
    metadata = {
        "analysis": "concentration_loss",
        "analysis_version": "1",
        "analysis_split": args.split,
        "base_n_head": args.base_n_head,
        "loss_models": included,
        "inputs_sha256": {p: sha256_file(p) for p in [*args.robustness, *args.manifests]},
        "source": source_freeze(),
    }
    write_parquet(args.out_loss, loss, LOSS_SCHEMA, metadata, LOSS_DESCRIPTIONS)
    write_parquet(
        args.out_spearman, pd.DataFrame(rows), SPEARMAN_SCHEMA, metadata, SPEARMAN_DESCRIPTIONS
    )
    for row in rows:
        print(
            f"{row['analysis']} {row['subset']} {row['task'] or ''}: n={row['n']} rho={row['rho']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
