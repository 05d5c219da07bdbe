"""Scalar-part ablation of own-lane value maps (docs §14.5).

    python src/scalar_ablation.py --checkpoint model.safetensors --manifest manifest.json \\
        --tasks sva.parquet quote.parquet plural.parquet --layers 1 --draws 5 --seed 1405 \\
        --out scalar_ablation.parquet --out-checkpoints scalar.safetensors random0... \\
        --out-manifests scalar.manifest.json random0...

In every head of --layers, the own-lane map M (the w×w block of W_V^h on the lane's
coordinates) loses its scalar part s·I (s = tr M / w) in the ``scalar`` checkpoint, or an
equal-norm random part s·R (R Haar-random orthogonal, one per head; draw k from numpy
Generator([seed, k])) in ``random<k>``. Each edit is a NEW checkpoint with a manifest naming
its parent; it is reloaded through that manifest and evaluated on the evaluation split of
every task against the unedited checkpoint (the drop in mean logit difference).
"""

from __future__ import annotations

import argparse
import copy
import sys

import numpy as np
import pandas as pd

from headgeom import results
from headgeom.analysis.dynamics import ablate_scalar_part
from headgeom.analysis.evaluation import clean_performance, logit_differences
from headgeom.data.task_files import model_inputs, read_task
from headgeom.hashing import sha256_file
from headgeom.io import write_json
from headgeom.manifest import edited_manifest
from headgeom.model.checkpoint import load_verified, save_checkpoint
from headgeom.runtime import set_threads

SPLIT = "evaluation"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--tasks", nargs="+", required=True, help="task Parquets")
    p.add_argument("--layers", nargs="+", type=int, required=True)
    p.add_argument("--draws", type=int, default=5, help="random controls")
    p.add_argument("--seed", type=int, required=True, help="Haar seed (recorded)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--out-checkpoints", nargs="+", required=True, help="scalar, random0, ...")
    p.add_argument("--out-manifests", nargs="+", required=True)
    args = p.parse_args(argv)
    if not len(args.out_checkpoints) == len(args.out_manifests) == args.draws + 1:
        p.error(f"give {args.draws + 1} --out-checkpoints and --out-manifests (scalar + draws)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    parent, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    tasks = [read_task(path, [SPLIT]) for path in args.tasks]
    inputs = {t.name: model_inputs(t.frame, vocab) for t in tasks}

    def margins(model) -> dict:
        lds = {n: logit_differences(model, x.clean_ids, x.correct, x.incorrect)
               for n, x in inputs.items()}  # fmt: skip
        return {n: clean_performance(ld) for n, ld in lds.items()}

    base = margins(parent)
    rows = []
    edits = [("scalar", None)] + [(f"random{k}", k) for k in range(args.draws)]
    for (name, draw), out_ckpt, out_manifest in zip(edits, args.out_checkpoints,
                                                    args.out_manifests, strict=True):  # fmt: skip
        edited = copy.deepcopy(parent)
        rng = None if draw is None else np.random.default_rng([args.seed, draw])
        heads = ablate_scalar_part(edited, args.layers, "scalar" if draw is None else "random", rng)
        edit = {"name": name, "kind": "scalar" if draw is None else "random", "draw": draw,
                "layers": args.layers, "haar_seed": args.seed,
                "rng": None if draw is None else f"numpy Generator(PCG64)([{args.seed}, {draw}])",
                "heads": heads.to_dict(orient="records")}  # fmt: skip
        save_checkpoint(out_ckpt, edited, vocab, {"edit": name})
        write_json(out_manifest, edited_manifest(manifest, sha256_file(out_ckpt), edit))
        model, _, record = load_verified(out_ckpt, out_manifest)  # measure what was written
        scalar_norm = float((heads["s"].abs() * np.sqrt(heads["w"])).sum())
        for task, perf in margins(model).items():
            rows.append({"model": manifest["model_name"], "seed": int(manifest["init_seed"]),
                         "task": task, "split": SPLIT, "edit": name, "kind": edit["kind"],
                         "draw": draw, "layers": ",".join(map(str, args.layers)),
                         "n_heads_edited": len(heads), "scalar_norm": scalar_norm,
                         "margin_unedited": base[task]["margin"], "margin": perf["margin"],
                         "drop": base[task]["margin"] - perf["margin"],
                         "accuracy": perf["accuracy"], "n": perf["n"],
                         "checkpoint_sha256": record["checkpoint_file_sha256"],
                         "haar_seed": args.seed})  # fmt: skip
    frame = pd.DataFrame(rows)
    metadata = {"analysis": "scalar_ablation", "analysis_version": "1",
                **results.provenance(manifest), "layers": args.layers, "draws": args.draws,
                "haar_seed": args.seed, "threads": args.threads}  # fmt: skip
    results.SCALAR_ABLATION.write(args.out, frame, metadata)
    summary = frame.groupby(["task", "kind"])["drop"].mean().unstack()
    print(f"mean drop by task (scalar vs random):\n{summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
