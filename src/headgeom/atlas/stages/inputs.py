"""The atlas's inputs: each scoring corpus cut into windows with the model's own tokenizer
(the first ``n_mean`` for Average's means and the profile, the next ``n_scored`` scored),
and the skills' probe items (the workspace's tasks built with the same tokenizer).

    python -m headgeom.atlas.stages.inputs --config-json '{"model":{...},"corpora":[...],
        "windows":{...},"skills":{...}}' --out-windows windows.parquet --out-probes probes.parquet

Only the tokenizer is read (hash-gated, ``headgeom.atlas.model_source.load_tokenizer``; one of
our checkpoints: GPT-2's BPE and the vocabulary map of the verified file), never the weights.
Both files record the tokenizer's source record and every corpus's SHA-256.
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd

from headgeom import results
from headgeom.atlas import corpora
from headgeom.atlas import results as atlas_results
from headgeom.atlas.model_source import ModelTokenizer, load_tokenizer
from headgeom.data.tasks import SPLITS, build_task
from headgeom.hashing import content_hash

#: The split a skill's items come from (the tasks' held-out evaluation split).
SPLIT = "evaluation"


def windows_frame(cfg: dict, tokenizer: ModelTokenizer) -> tuple[pd.DataFrame, dict]:
    """(rows of atlas_windows, per corpus its record and SHA-256s)."""
    w = cfg["windows"]
    rows, records = [], {}
    for spec in corpora.specs_from_config(cfg["corpora"]):
        cut = corpora.tokenize_windows(
            spec, tokenizer.encode, int(w["n_ctx"]), int(w["n_mean"]) + int(w["n_scored"]),
            tokenizer.bos_id, tokenizer.eos_id, tokenizer.sha256,
        )  # fmt: skip
        means, scored = corpora.split_windows(cut, int(w["n_mean"]), int(w["n_scored"]))
        for role, part, first in (("means", means, 0), ("scored", scored, len(means))):
            rows += [{"corpus": spec.name, "role": role, "window": first + i, "ids": ids}
                     for i, ids in enumerate(part.ids.tolist())]  # fmt: skip
        records[spec.name] = {**cut.record, "means_sha256": means.sha256,
                              "scored_sha256": scored.sha256}  # fmt: skip
    return pd.DataFrame(rows), records


def probes_frame(
    skills: dict, tokenizer: ModelTokenizer, split: str = SPLIT
) -> tuple[pd.DataFrame, dict]:
    """(rows of atlas_probes, per task its dataset hash and what the tokenizer changed): the
    first ``skills['n_items']`` items of ``split``, in the model's ids."""
    rows, records = [], {}
    sizes = {s: 0 for s in SPLITS}
    for i, task in enumerate(skills["tasks"]):
        splits = {**sizes, split: int(skills["n_items"])}
        built = build_task(task, tokenizer.text_tokenizer,
                           {"seed": int(skills["seed"]) + i, "splits": splits})  # fmt: skip
        frame = built.frame[built.frame["split"] == split]
        model = tokenizer.to_model  # the task's ids in the model's vocabulary
        items = [{"skill": task, "item": item, "prompt": model(ex.clean_ids),
                  "candidates": model([ex.correct_id, ex.incorrect_id]), "answer": 0}
                 for item, ex in enumerate(frame.itertuples())]  # fmt: skip
        rows += items
        records[task] = {"seed": int(skills["seed"]) + i, "split": split, "n_items": len(items),
                         "items_sha256": content_hash(items),
                         "tokenizer_fit": built.fit.counts()}  # fmt: skip
    columns = atlas_results.PROBES.names
    return pd.DataFrame(rows, columns=columns), records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.inputs_config()")
    p.add_argument("--out-windows", required=True)
    p.add_argument("--out-probes", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    tokenizer = load_tokenizer(cfg["model"])
    windows, corpus_records = windows_frame(cfg, tokenizer)
    common = {"tokenizer_source": tokenizer.record, "tokenizer_sha256": tokenizer.sha256}
    atlas_results.WINDOWS.write(args.out_windows, windows, {
        **results.file_metadata("atlas_windows"), **common, "corpora": corpus_records,
        "windows": cfg["windows"]})  # fmt: skip
    probes, task_records = probes_frame(cfg["skills"], tokenizer)
    atlas_results.PROBES.write(args.out_probes, probes, {
        **results.file_metadata("atlas_probes"), **common, "skills": task_records})  # fmt: skip
    sizes = ", ".join(f"{k} {len(windows[windows['corpus'] == k])}" for k in corpus_records)
    print(f"windows: {sizes}; probe items: {len(probes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
