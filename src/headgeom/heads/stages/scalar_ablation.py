"""Scalar-part ablation of own-lane value maps (docs §14.5).

    python -m headgeom.heads.stages.scalar_ablation --checkpoint model.safetensors \\
        --manifest manifest.json \\
        --tasks sva.parquet quote.parquet plural.parquet --layers 1 --draws 5 --seed 1405 \\
        --out scalar_ablation.parquet --out-checkpoints scalar.safetensors random0... \\
        --out-manifests scalar.manifest.json random0...

The ``scalar`` checkpoint and the ``random<k>`` controls of
headgeom.heads.analysis.scalar_ablation, each a NEW checkpoint with a manifest naming its parent,
reloaded through that manifest and evaluated on the evaluation split of every task against
the unedited checkpoint (the drop in mean logit difference).
"""

from __future__ import annotations

import argparse
import sys

from headgeom import results
from headgeom.data.task_files import model_inputs, read_task
from headgeom.hashing import sha256_file
from headgeom.heads.analysis.scalar_ablation import scalar_ablation, scalar_edits
from headgeom.io import write_manifest
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
    p.add_argument("--draws", type=int, required=True, help="random controls")
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
    names = [edit.name for edit in scalar_edits(args.draws)]
    outputs = zip(args.out_checkpoints, args.out_manifests, strict=True)
    paths = dict(zip(names, outputs, strict=True))

    def write_edit(name, edited, edit):
        out_ckpt, out_manifest = paths[name]
        save_checkpoint(out_ckpt, edited, vocab, {"edit": name})
        write_manifest(out_manifest, edited_manifest(manifest, sha256_file(out_ckpt), edit))
        model, _, record = load_verified(out_ckpt, out_manifest)  # measure what was written
        return model, record["checkpoint_file_sha256"]

    frame = scalar_ablation(parent, inputs, args.layers, args.draws, args.seed, write_edit, SPLIT)
    frame = frame.assign(model=manifest["model_name"], seed=int(manifest["init_seed"]))
    metadata = {**results.file_metadata("scalar_ablation", manifest=manifest),
                "layers": args.layers, "draws": args.draws, "haar_seed": args.seed,
                "threads": args.threads}  # fmt: skip
    results.SCALAR_ABLATION.write(args.out, frame, metadata)
    summary = frame.groupby(["task", "kind"])["drop"].mean().unstack()
    print(f"mean drop by task (scalar vs random):\n{summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
