"""Clean task performance (METHODS §8.6, paper Table 5): accuracy and mean logit margin.

    python src/evaluate_clean.py --checkpoint model.safetensors --manifest manifest.json \\
        --task tasks/sva.parquet --out eval/sva.parquet

The checkpoint is verified against its manifest first. One output row per split in the task
file; the paper reports the evaluation split (Table 5) and the discovery split (the "base"
LD of Figure 5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from headgeom.analysis.evaluation import clean_performance, logit_differences
from headgeom.data.corpus import compact
from headgeom.hashing import manifest_hash, sha256_file
from headgeom.io import read_parquet_metadata, write_parquet
from headgeom.model.checkpoint import load_verified

TASK_COLUMNS = ["split", "clean_ids", "correct_id", "incorrect_id"]
SPLIT_ORDER = ("discovery", "validation", "evaluation", "holdout")
SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
        ("n", pa.int64()),
        ("accuracy", pa.float64()),
        ("margin", pa.float64()),
    ]
)
DESCRIPTIONS = {
    "model": "model configuration name (the {model} wildcard)",
    "seed": "initialisation seed",
    "task": "task name",
    "split": "task split",
    "n": "examples in the split",
    "accuracy": "fraction of clean prompts with LD = logit(correct) - logit(incorrect) > 0",
    "margin": "mean clean LD over the split (logits, final prompt position)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint .safetensors")
    p.add_argument("--manifest", required=True, help="its checkpoint manifest.json")
    p.add_argument("--task", required=True, help="task dataset tasks/<task>.parquet")
    p.add_argument("--out", required=True, help="output .parquet")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per forward pass")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return p.parse_args(argv)


def read_task(path: str) -> tuple[pd.DataFrame, dict[str, str]]:
    schema = pq.read_schema(path)
    missing = [c for c in TASK_COLUMNS if c not in schema.names]
    if missing:
        raise ValueError(f"{path}: task file lacks columns {missing}")
    table = pq.read_table(path, columns=TASK_COLUMNS).to_pandas()
    if table.empty:
        raise ValueError(f"{path}: task file has no examples")
    table["split"] = table["split"].astype(str)
    return table, read_parquet_metadata(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    examples, task_meta = read_task(args.task)
    task = task_meta.get("task", Path(args.task).stem)

    lengths = examples["clean_ids"].map(len).to_numpy()
    flat = compact(np.concatenate(examples["clean_ids"].to_list()), vocab)
    ids = np.split(flat, np.cumsum(lengths)[:-1])
    correct = compact(examples["correct_id"].to_numpy(), vocab)
    incorrect = compact(examples["incorrect_id"].to_numpy(), vocab)
    ld = logit_differences(model, ids, correct, incorrect, batch_size=args.batch_size)

    present = examples["split"].unique().tolist()
    splits = [s for s in SPLIT_ORDER if s in present] + sorted(set(present) - set(SPLIT_ORDER))
    rows = []
    for split in splits:
        mask = (examples["split"] == split).to_numpy()
        perf = clean_performance(ld[mask])
        rows.append(
            {
                "model": manifest["model_name"],
                "seed": manifest["init_seed"],
                "task": task,
                "split": split,
                **perf,
            }
        )
        print(
            f"{task}/{split}: n={perf['n']} acc={perf['accuracy']:.3f} "
            f"margin={perf['margin']:+.3f}",
            file=sys.stderr,
        )

    write_parquet(
        args.out,
        pd.DataFrame(rows),
        SCHEMA,
        metadata={
            "config_id": manifest["config_id"],
            "config_hash": manifest["config_hash"],
            "checkpoint_manifest_sha256": manifest_hash(args.manifest),
            "checkpoint_file_sha256": manifest["checkpoint_file_sha256"],
            "task": task,
            "task_dataset_sha256": task_meta.get("dataset_sha256"),  # null when not recorded
            "task_file_sha256": sha256_file(args.task),
        },
        descriptions=DESCRIPTIONS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
