"""Checkpoint B of a pair made here: A (one of our checkpoints, verified) after a few AdamW
updates on one task's prompts toward its correct or incorrect answer token
(:func:`headgeom.atlas.fine_tune.fine_tune`; config ``pairs[].fine_tune``), written as a run
folder: ``model.safetensors`` and a sealed ``manifest.json`` that names A's checkpoint and
the fine-tune (:func:`headgeom.manifest.edited_manifest`), so B is read verified like any of
our checkpoints.

    python -m headgeom.atlas.stages.pair_fine_tune --config-json '{"a":{..},"fine_tune":{..},
        "task_seed":101}' --threads 1 --out-checkpoint tuned/model.safetensors \\
        --out-manifest tuned/manifest.json

The training items are the first ``n_items`` of the task's discovery split, built with A's
tokenizer and the probes' task seed: the lexicon partition is the probes', the items come
from another split.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from headgeom.atlas.fine_tune import fine_tune
from headgeom.atlas.model_source import checkpoint_paths, load_tokenizer, read_checkpoint
from headgeom.data.tasks import SPLITS, build_task
from headgeom.hashing import content_hash, load_manifest, sha256_file
from headgeom.io import write_manifest
from headgeom.manifest import edited_manifest
from headgeom.model.checkpoint import save_checkpoint
from headgeom.runtime import set_threads

#: The split the training items come from (the probes are the evaluation split's).
SPLIT = "discovery"


def training_items(a: dict, task: str, n_items: int, seed: int, answer: str):
    """(prompts, answer ids, item records) of the task in A's vocabulary."""
    tokenizer = load_tokenizer(a)
    splits = {**{s: 0 for s in SPLITS}, SPLIT: n_items}
    built = build_task(task, tokenizer.text_tokenizer, {"seed": seed, "splits": splits})
    frame = built.frame[built.frame["split"] == SPLIT]
    prompts = [tokenizer.to_model(ids) for ids in frame["clean_ids"]]
    column = "correct_id" if answer == "correct" else "incorrect_id"
    answers = tokenizer.to_model(frame[column].tolist())
    return (
        prompts,
        answers,
        [{"prompt": p, "answer": t} for p, t in zip(prompts, answers, strict=True)],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.pair_fine_tune_config(pair)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out-checkpoint", required=True)
    p.add_argument("--out-manifest", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    ft = cfg["fine_tune"]
    set_threads(args.threads)
    started = time.perf_counter()
    model, vocab, source = read_checkpoint(cfg["a"])
    prompts, answers, items = training_items(cfg["a"], ft["task"], int(ft["n_items"]),
                                             int(cfg["task_seed"]), ft["answer"])  # fmt: skip
    tuned, losses = fine_tune(
        model, prompts, answers, steps=int(ft["steps"]), lr=float(ft["lr"]),
        batch_size=int(ft["batch_size"]), weight_decay=float(ft["weight_decay"]),
        seed=int(ft["seed"]),
    )  # fmt: skip
    save_checkpoint(args.out_checkpoint, tuned, vocab, {"fine_tune": ft})
    parent = load_manifest(checkpoint_paths(cfg["a"]["path"])[1])
    edit = {
        "name": f"fine_tune-{ft['task']}-{ft['answer']}",
        "kind": "fine_tune",
        **ft,
        "task_seed": int(cfg["task_seed"]),
        "split": SPLIT,
        "items_sha256": content_hash(items),
        "losses": [round(float(x), 6) for x in losses],
        "source": source,
    }
    record = edited_manifest(parent, sha256_file(args.out_checkpoint), edit)
    write_manifest(args.out_manifest, record)
    print(f"fine-tune {edit['name']}: loss {np.mean(losses[:5]):.3f} → {np.mean(losses[-5:]):.3f} "
          f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
