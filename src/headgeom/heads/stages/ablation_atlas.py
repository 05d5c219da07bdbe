"""Means artifact and block ablation atlas of one run (docs §10.6).

    python -m headgeom.heads.stages.ablation_atlas --checkpoint CKPT --manifest MANIFEST \\
        --val-tokens val_tokens.parquet --tasks sva.parquet quote.parquet plural.parquet \\
        --n-mean-windows 64 --n-eval-windows 64 --batch-size 64 --threads 1 \\
        --out-means means.safetensors --out-atlas atlas.parquet

The first n-mean windows of the validation file give each head's mean z, the attention
block's and the MLP's mean output (positions t ≥ 1; the means artifact, which mean-mode head
patching also reads); the next n-eval windows are where every zero and mean ablation is
measured (headgeom.heads.analysis.ablation.block_atlas). Both files record the checkpoint and the
validation file hashes; the atlas records the means artifact's SHA-256.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from headgeom import results
from headgeom.data.corpus import compact, read_tokens
from headgeom.data.task_files import read_task
from headgeom.heads.analysis import ablation
from headgeom.manifest import verified_val_tokens
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import pick_device, set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    p.add_argument("--manifest", required=True, help="its JSON manifest")
    p.add_argument("--val-tokens", required=True, help="val_tokens.parquet (GPT-2 ids)")
    p.add_argument("--tasks", nargs="+", required=True, help="task Parquets (retention)")
    p.add_argument("--n-mean-windows", type=int, required=True, help="windows for the means")
    p.add_argument("--n-eval-windows", type=int, required=True, help="windows for the measures")
    p.add_argument("--batch-size", type=int, required=True, help="windows per forward")
    p.add_argument(
        "--work-mb", type=int, required=True, help="working memory of the stacked forwards and KLs"
    )
    p.add_argument(
        "--n-retention",
        type=int,
        required=True,
        help="first N evaluation prompts per task (0: all)",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out-means", required=True, help="means artifact (.safetensors)")
    p.add_argument("--out-atlas", required=True, help="atlas Parquet")
    args = p.parse_args(argv)
    if args.n_retention < 0:
        p.error(f"--n-retention must be at least 0, got {args.n_retention}")
    for name in ("n_mean_windows", "n_eval_windows", "batch_size", "work_mb"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    model = model.to(pick_device(args.device))  # float32 (docs §0)
    val_sha = verified_val_tokens(args.val_tokens, manifest)
    val_ids = compact(read_tokens(args.val_tokens), vocab)
    mean_windows, eval_windows = ablation.split_windows(
        val_ids, model.cfg.n_ctx, args.n_mean_windows, args.n_eval_windows
    )
    means = ablation.write_means(model, mean_windows, args.batch_size)
    record = ablation.means_record(
        manifest["checkpoint_file_sha256"], val_sha, args.n_mean_windows, model.cfg.n_ctx
    )
    means_sha = ablation.save_means(args.out_means, means, record)
    task_files = [read_task(path, ["evaluation"]) for path in args.tasks]
    task_sha = {task.name: task.file_sha256 for task in task_files}
    tasks = [ablation.task_prompts(task, vocab, args.n_retention) for task in task_files]
    total = ablation.atlas_steps(model, eval_windows, tasks, args.batch_size, args.work_mb * 2**20)
    with tqdm(total=total, desc="ablate", unit="edit", file=sys.stderr) as bar:
        atlas, baseline = ablation.block_atlas(
            model,
            means,
            eval_windows,
            tasks,
            args.batch_size,
            args.work_mb * 2**20,
            progress=bar.update,
        )
    atlas = atlas.assign(model=manifest["model_name"], seed=int(manifest["init_seed"]))
    metadata = {
        **results.file_metadata(
            "ablation_atlas", manifest=manifest, ablation_means_sha256=means_sha
        ),  # fmt: skip
        "val_tokens_sha256": val_sha,
        "mean_windows": record["windows"],
        "eval_windows": f"validation windows {args.n_mean_windows}.."
        f"{args.n_mean_windows + args.n_eval_windows - 1}",
        "task_files_sha256": task_sha,
        "retention_prompts": {t.name: len(t.clean_ids) for t in tasks},
        **baseline,
        "batch_size": args.batch_size,
        "work_mb": args.work_mb,
        "threads": args.threads,
        "dtype": "float32 forward, float64 KL and moments",
    }
    results.ABLATION_ATLAS.write(args.out_atlas, atlas, metadata)
    top = atlas[atlas["ablation"] == "zero"].nlargest(3, "kl")
    largest = list(zip(top["label"], top["kl"].round(3), strict=True))
    print(f"largest zero-ablation KL: {largest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
