"""Generate one behavioural task dataset (METHODS §8): SVA, Quote or Plural.

    python src/make_tasks.py --task sva --config-json '{"seed":101,"splits":{"discovery":300,
        "validation":240,"evaluation":240,"holdout":32},"prepend_eot":false}' \\
        --out results/demo/tasks/sva.parquet

One row per example (clean/reference GPT-2 ids, answer ids, split, condition, lexical group).
The file metadata carries the generator seed, config and its hash, the lexicon partition and
``dataset_sha256`` (canonical JSON of the example records), which downstream records cite.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa

from headgeom.data import tasks
from headgeom.data.lexicon import GROUP_SLOT, SPLITS
from headgeom.data.tokenizer import load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash
from headgeom.io import write_parquet

_LABEL = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema(
    [
        ("example_id", pa.int32()),
        ("split", _LABEL),
        ("condition", _LABEL),
        ("lexical_group", _LABEL),
        ("clean_ids", pa.list_(pa.int32())),
        ("ref_ids", pa.list_(pa.int32())),
        ("diff_position", pa.int32()),
        ("correct_id", pa.int32()),
        ("incorrect_id", pa.int32()),
        ("correct_text", pa.string()),
        ("incorrect_text", pa.string()),
        ("clean_text", pa.string()),
        ("ref_text", pa.string()),
    ]
)
DESCRIPTIONS = {
    "example_id": "example id, unique within the task file (0-based)",
    "split": f"split: one of {', '.join(SPLITS)}; lexical items never shared across splits",
    "condition": "one of the task's 4 balanced conditions, defined by the clean prompt",
    "lexical_group": "lexical group (SVA subject pair, Quote first variable, Plural noun)",
    "clean_ids": "GPT-2 ids of the clean prompt; its last token is the prediction position",
    "ref_ids": "GPT-2 ids of the reference prompt: same length, one token differs",
    "diff_position": "index of the single token where clean_ids and ref_ids differ",
    "correct_id": "GPT-2 id of the correct answer for the clean prompt",
    "incorrect_id": "GPT-2 id of the incorrect answer for the clean prompt (correct for ref)",
    "correct_text": "text of correct_id",
    "incorrect_text": "text of incorrect_id",
    "clean_text": "clean prompt text (decodes clean_ids exactly)",
    "ref_text": "reference prompt text (decodes ref_ids exactly)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=tasks.TASKS)
    parser.add_argument("--config-json", default="{}", help="the task's config block as JSON")
    parser.add_argument("--out", required=True, type=Path, help="output Parquet")
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config_json)
    except json.JSONDecodeError as err:
        parser.error(f"--config-json is not valid JSON ({err})")

    cfg = tasks.resolve_task_config(args.task, raw)
    df, partition = tasks.generate_task(args.task, load_gpt2_tokenizer(), cfg)
    dataset_sha256 = tasks.dataset_sha256(df)
    write_parquet(
        args.out,
        df,
        SCHEMA,
        metadata={
            "task": args.task,
            "generator_seed": cfg["seed"],
            "config": cfg,
            "config_hash": content_hash(cfg),
            "conditions": list(tasks.CONDITIONS[args.task]),
            "lexical_group_slot": GROUP_SLOT[args.task],
            "lexicon_partition": partition,
            "prepend_eot": cfg["prepend_eot"],
            "tokenizer_files_sha256": tokenizer_files_sha256(),
            "n_examples": len(df),
            "dataset_sha256": dataset_sha256,
        },
        descriptions=DESCRIPTIONS,
    )
    print(
        f"{args.task}: {len(df)} examples, dataset_sha256 {dataset_sha256[:12]} -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
