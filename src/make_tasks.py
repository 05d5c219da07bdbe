"""Generate one behavioural task dataset (docs §8): SVA, Quote or Plural.

    python src/make_tasks.py --task sva --config-json '{"seed":101,"splits":{"discovery":300,
        "validation":240,"evaluation":240,"holdout":32},"prepend_eot":false}' \\
        --out results/demo/tasks/sva.parquet

One row per example (clean/reference GPT-2 ids, answer ids, split, condition, lexical group).
The file metadata carries the generator seed, config and its hash, the lexicon partition and
``dataset_sha256`` (canonical JSON of the example records), which downstream records cite,
and check C7 (equal lengths, one differing token, single-token answers) rerun on the stored
examples; a violation fails the job.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom import checks, results
from headgeom.data import tasks
from headgeom.data.lexicon import GROUP_SLOT
from headgeom.data.tokenizer import load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash


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
    tokenizer = load_gpt2_tokenizer()
    df, partition = tasks.generate_task(args.task, tokenizer, cfg)
    c7 = checks.enforce("C7", tasks.c7_mismatches(df, tokenizer), 0, "count", where=args.out,
                        note=f"examples of {len(df)} violating docs §8.1")  # fmt: skip
    dataset_sha256 = tasks.dataset_sha256(df)
    results.TASK.write(
        args.out,
        df,
        {
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
            **c7,
            **results.provenance(),
        },
    )
    print(
        f"{args.task}: {len(df)} examples, dataset_sha256 {dataset_sha256[:12]} -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
