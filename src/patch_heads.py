"""Single-head activation patching of every head on every example (METHODS §10.1).

    python src/patch_heads.py --checkpoint CKPT --manifest MANIFEST --task TASK.parquet \\
        --splits discovery,validation,evaluation,holdout --batch-size 128 --max-rows 4096 \\
        --model-name learned --seed 42 --task-name sva --out effects.parquet

Writes one row per (split, example, layer, head) with the clean and patched logit
differences and the drop ``effect = clean_ld − patched_ld``. The checkpoint is verified
against its manifest before anything else is read; the file metadata names the checkpoint's
SHA-256 and its manifest's content hash.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from tqdm import tqdm

from headgeom.analysis.patching import (
    length_batches,
    model_inputs,
    patch_all_heads,
    patch_all_heads_fast,
    read_task,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.hashing import content_hash, source_freeze
from headgeom.io import write_parquet
from headgeom.model.checkpoint import load_verified

DESCRIPTIONS = {
    "model": "model configuration name (display name, e.g. learned, write-common-axis)",
    "seed": "training (initialisation) seed of the model",
    "task": "behavioural task (sva, quote, plural)",
    "split": "task split the example belongs to",
    "example_id": "example id in the task file",
    "condition": "task condition of the example",
    "lexical_group": "lexical group of the example (METHODS §8.1)",
    "layer": "layer l of the patched head, 0-based",
    "head": "head index h within the layer, 0-based",
    "clean_ld": "logit(correct) − logit(incorrect) at the final position, clean prompt",
    "patched_ld": "the same with z^{l,h} replaced by its reference value at all positions",
    "effect": "drop d_{l,h}(x) = clean_ld − patched_ld (positive: the patch hurts)",
}


def effects_schema(task_schema: pa.Schema) -> pa.Schema:
    """Result schema; example_id keeps the task file's type."""
    return pa.schema(
        [
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("split", pa.string()),
            ("example_id", task_schema.field("example_id").type),
            ("condition", pa.string()),
            ("lexical_group", pa.string()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("clean_ld", pa.float64()),
            ("patched_ld", pa.float64()),
            ("effect", pa.float64()),
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--task", required=True, help="task Parquet (src/make_tasks.py)")
    parser.add_argument(
        "--splits",
        default="discovery,validation,evaluation,holdout",
        help="comma-separated splits",
    )
    parser.add_argument("--batch-size", type=int, default=128, help="examples per batch")
    parser.add_argument(
        "--max-rows",
        type=int,
        default=4096,
        help="fast engine: head patches × examples per forward (bounds memory)",
    )
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's training seed")
    parser.add_argument("--task-name", required=True)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument(
        "--engine",
        choices=("fast", "plain"),
        default="fast",
        help="patching engine: fast (layer resumption, clean-prefix reuse, stacked heads, "
        "answer logits only; equal within 1e-5) or plain (one full forward per head)",
    )
    parser.add_argument("--out", required=True, help="effects Parquet")
    args = parser.parse_args(argv)
    args.splits = [s for s in args.splits.split(",") if s]
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.max_rows < 1:
        parser.error(f"--max-rows must be at least 1, got {args.max_rows}")
    return args


def engine_paths(model: torch.nn.Module, engine: str) -> str:
    """What the engine actually did for this model (recorded in the file metadata)."""
    if engine == "plain" or not supports_fast(model):
        return "plain: one full forward per head"
    if supports_prefix_reuse(model):
        return "fast: layer resumption, clean-prefix KV reuse, stacked heads, answer logits"
    return "fast: layer resumption, stacked heads, answer logits (no prefix reuse)"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device)  # analyses run in float32 (METHODS §0)
    task = read_task(args.task, args.splits)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head

    frames = []
    for split in args.splits:
        rows = task.frame[task.frame["split"] == split].reset_index(drop=True)
        inputs = model_inputs(rows, vocab)
        n_batches = len(length_batches([len(x) for x in inputs.clean_ids], args.batch_size))
        with tqdm(
            total=n_batches * n_layer * n_head, desc=f"patch {split}", unit="head", file=sys.stderr
        ) as bar:
            arrays = (inputs.clean_ids, inputs.ref_ids, inputs.correct, inputs.incorrect)
            if args.engine == "fast":
                clean_ld, patched_ld = patch_all_heads_fast(
                    model, *arrays, args.batch_size, bar.update, max_rows=args.max_rows
                )
            else:
                clean_ld, patched_ld = patch_all_heads(model, *arrays, args.batch_size, bar.update)
        n = len(rows)
        per_row = n_layer * n_head
        frames.append(
            pd.DataFrame(
                {
                    "split": split,
                    "example_id": np.repeat(rows["example_id"].to_numpy(), per_row),
                    "condition": np.repeat(rows["condition"].astype(str).to_numpy(), per_row),
                    "lexical_group": np.repeat(
                        rows["lexical_group"].astype(str).to_numpy(), per_row
                    ),
                    "layer": np.tile(np.repeat(np.arange(n_layer), n_head), n),
                    "head": np.tile(np.arange(n_head), n * n_layer),
                    "clean_ld": np.repeat(clean_ld, per_row),
                    "patched_ld": patched_ld.reshape(-1),
                    "effect": (clean_ld[:, None, None] - patched_ld).reshape(-1),
                }
            )
        )
    effects = pd.concat(frames, ignore_index=True)
    effects.insert(0, "task", args.task_name)
    effects.insert(0, "seed", args.seed)
    effects.insert(0, "model", args.model_name)

    write_parquet(
        args.out,
        effects,
        effects_schema(task.schema),
        metadata={
            "analysis": "patch_heads",
            "analysis_version": "1",
            "model": args.model_name,
            "seed": args.seed,
            "task": args.task_name,
            "splits": args.splits,
            "n_layers": n_layer,
            "n_heads": n_head,
            "checkpoint_sha256": manifest["checkpoint_file_sha256"],
            "manifest_content_hash": content_hash(manifest),
            "checkpoint_manifest_sha256": content_hash(manifest),
            "task_dataset_sha256": task.dataset_sha256,
            "task_file_sha256": task.file_sha256,
            "patch_site": "blocks.{l}.attn.hook_z, head h, all positions (METHODS §10.1)",
            "batch_size": args.batch_size,
            "max_rows": args.max_rows,
            "engine": args.engine,
            "engine_paths": engine_paths(model, args.engine),
            "device": str(device),
            "dtype": "float32 forward, float64 logit differences",
            "source": source_freeze(),
        },
        descriptions=DESCRIPTIONS,
    )
    print(f"wrote {len(effects)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
