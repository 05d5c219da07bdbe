"""Directional leakage of real patch perturbations into later readers (docs §9.5, §11.2–11.3).

    python -m headgeom.heads.stages.leakage --checkpoint CKPT --manifest MANIFEST \\
        --task tasks/sva.parquet tasks/quote.parquet --effects sva.parquet quote.parquet \\
        --split evaluation --threads 1 --out leakage/sva.parquet leakage/quote.parquet

Per task (one job per run for every task: the checkpoint is verified and loaded once), one
row per (source head, later reader head, X ∈ {Q, K, V}): leakage L, isotropic expectation ρ
and L/ρ, with checks C8 and C9 in the file metadata (either failing stops the run before
that task's file is written); headgeom.heads.analysis.leakage.leakage_table. ``--task``,
``--effects`` and ``--out`` are parallel lists.
"""

from __future__ import annotations

import argparse
import sys

from headgeom import checks, results
from headgeom.data.task_files import model_inputs, read_task
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import leakage
from headgeom.heads.analysis.leakage import require_free_readers
from headgeom.io import read_table
from headgeom.model import registry
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--task", nargs="+", required=True, help="task Parquets (make_tasks)")
    parser.add_argument(
        "--effects", nargs="+", required=True, help="effects Parquet per --task (patch_heads)"
    )
    parser.add_argument("--split", required=True)
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", nargs="+", required=True, help="leakage Parquet per --task")
    args = parser.parse_args(argv)
    for name in ("effects", "out"):
        if len(getattr(args, name)) != len(args.task):
            parser.error(f"{len(args.task)} --task files but {len(getattr(args, name))} "
                         f"--{name} (one per task)")  # fmt: skip
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    require_free_readers(model, args.checkpoint)
    device = pick_device(args.device)
    model = model.to(device)
    for task_path, effects, out in zip(args.task, args.effects, args.out, strict=True):
        leakage_of_task(model, vocab, manifest, device, task_path, effects, out, args)
    return 0


def leakage_of_task(model, vocab, manifest, device, task_path, effects, out_path, args) -> None:
    """The leakage table of one task (its effects file) written to ``out_path``."""
    task = read_task(task_path, [args.split])
    results.require_same_run(effects, manifest, task.dataset_sha256)
    identity, e_stored = leakage.stored_effects(
        read_table(effects).to_pandas(),
        args.split,
        task.frame["example_id"].to_numpy(),
        (model.cfg.n_layer, model.cfg.n_head),
        effects,
    )
    inputs = model_inputs(task.frame, vocab)
    out = leakage.leakage_table(model, inputs, e_stored, args.batch_size, device, effects)

    table = out.table.assign(**identity, split=args.split)
    metadata = {
        **results.file_metadata(
            "leakage",
            manifest=manifest,
            task_dataset_sha256=task.dataset_sha256,
            task_file_sha256=task.file_sha256,
        ),
        **identity,
        "split": args.split,
        "n_examples": len(task.frame),
        "n_layers": model.cfg.n_layer,
        "n_heads": model.cfg.n_head,
        "effects_sha256": sha256_file(effects),
        **checks.record("C8", out.c8.value, out.c8.tolerance),
        **checks.record("C9", out.c9.value, out.c9.tolerance),
        **read_space_metadata(registry.heads_of(model)),
        "rho_definition": "PK(U, R) / dim U (isotropic expectation, docs §9.5)",
        "device": str(device),
        "threads": args.threads,
    }
    results.LEAKAGE.write(out_path, table, metadata)
    checked = ", ".join(
        f"{name} {r.value:.2g} ≤ {r.tolerance:.2g}" for name, r in (("C8", out.c8), ("C9", out.c9))
    )
    print(f"wrote {len(table)} rows to {out_path} ({checked})", file=sys.stderr)


def read_space_metadata(heads) -> dict:
    """How the read spaces were taken (docs §9.2, §11.8), and what the pass could not compute."""
    return {
        "read_space": "folded: Im(P_c diag(gamma) W_X^T), gamma the gain of the norm before "
        "the projections, P_c its centring (identity for an RMSNorm) (docs §9.2, §11.8)",
        "kv_attribution": (
            "K/V read spaces and responses of a shared key/value head, attributed to every "
            "query head of its group (docs §11.8)"
            if heads.n_kv_head < heads.n_head
            else "none: one key/value head per query head"
        ),
        "tv": (
            "recomputed from hook_q/hook_k (docs §11.6)"
            if heads.attention_from_sites
            else "null: attention is not softmax(q.k/sqrt(d)) of the projections' outputs "
            "(rotary positions, q/k norms act after them; docs §11.8)"
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
