"""The atlas's compression view: every compressed variant of the config's ``compression``
block (int8/int4/int2 per tensor group and all together, low rank, vocabulary pruning, mixed
precision) loaded into the model as simulated weights, scored on the sweep's scored windows
and probes against the original model's distributions (kept once), and the original weights
put back (their SHA-256 checked) (:mod:`headgeom.atlas.compression_view`).

    python -m headgeom.atlas.stages.compression --config-json '{"model":{...},
        "corpora":[...],"compression":{...},"sweep":{...}}' --windows windows.parquet \\
        --probes probes.parquet --threads 1 --out compression.parquet --out-report compression.md

The report prints the mean rows beside the article's reference numbers
(``headgeom/atlas/references.yaml``: Gemma 4 E2B/E4B, not reproducible without the weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd
from tqdm import tqdm

from headgeom import datafile, results
from headgeom.atlas import artifacts, corpora
from headgeom.atlas import compression_view as view
from headgeom.atlas import results as atlas_results
from headgeom.atlas.model_source import load_tokenizer
from headgeom.atlas.tensor_groups import Weights
from headgeom.runtime import pick_device, set_threads


def count_tokens(model_spec: dict, corpus: dict, n_tokens: int, n_vocab: int) -> np.ndarray:
    """Token counts of the first ``n_tokens`` tokens of a corpus's documents, encoded with
    the model's tokenizer (as the inputs stage cuts windows)."""
    encode = load_tokenizer(model_spec).encode
    (spec,) = corpora.specs_from_config([corpus])
    ids: list[int] = []
    for text in corpora.documents(spec):
        ids.extend(encode(text))
        if len(ids) >= n_tokens:
            break
    return view.comp.token_counts([ids[:n_tokens]], n_vocab)


def report(frame: pd.DataFrame, references: dict) -> str:
    """Markdown: the mean rows (size, KL, Δ top-1, retention), then the article's numbers."""
    mean = frame[frame["corpus"] == "mean"]
    lines = ["# Compression view", "",
             "Mean over the scoring corpora (mixed precision: over every corpus but its "
             "sensitivity corpus). Bytes: the group compressed / at 16 bits.", "",
             "| method | group | setting | bytes | 16-bit bytes | ratio | KL | Δ top-1 (pt) | "
             "retention |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in mean.itertuples():
        lines.append(f"| {r.method} | {r.group} | {r.setting} | {r.bytes:,} | "
                     f"{r.bytes_original:,} | {r.bytes / r.bytes_original:.3f} | {r.kl:.4g} | "
                     f"{r.delta_top1:+.2f} | {r.retention:.4f} |")  # fmt: skip
    lines += ["", "## The article's numbers (not reproducible without the weights)", "",
              f"{references['why']}.", "", "| model | method | group | setting | article |",
              "|---|---|---|---|---|"]  # fmt: skip
    for ref in references["records"]:
        lines.append(f"| {ref['model']} | {ref['method']} | {ref['group']} | {ref['setting']} | "
                     f"{ref['value']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.compression_config()")
    p.add_argument("--windows", required=True, help="atlas_windows Parquet")
    p.add_argument("--probes", required=True, help="atlas_probes Parquet")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True)
    p.add_argument("--out-report", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    run, c = cfg["sweep"], cfg["compression"]
    set_threads(args.threads)
    started = time.perf_counter()
    model, source = artifacts.load_model(cfg["model"], pick_device(run["device"]))
    _, scored, windows_meta = artifacts.read_windows(args.windows)
    skills = artifacts.read_skills(args.probes)
    weights = Weights.of(model.hf)
    before = view.state_sha256(model.hf)
    counts = None
    if c["prune"]["ns"]:
        by_name = {x["name"]: x for x in cfg["corpora"]}
        n_vocab = int(model.hf.get_input_embeddings().weight.shape[0])
        counts = count_tokens(cfg["model"], by_name[c["prune"]["counting_corpus"]],
                              c["prune"]["count_tokens"], n_vocab)  # fmt: skip
    scorer = view.Scorer(model, scored, skills, run["batch_size"], run["kl_chunk"],
                         run["probe_rows"])  # fmt: skip
    todo = list(view.variants(weights, c, counts))
    scores = {}
    if c["mixed"]["n_sensitive"]:
        chosen = c["mixed"]["sensitivity_corpus"]
        if chosen not in scored:
            p.error(f"compression.mixed.sensitivity_corpus {chosen!r} has no scored windows")
        scores = view.layer_sensitivity(model, weights, scorer, view.present(weights, c["groups"]),
                                        c["mixed"]["bits"], chosen)  # fmt: skip
        others = [name for name in scored if name != chosen]
        todo += list(view.mixed_variants(weights, c, scores, others))
    with tqdm(total=len(todo), desc="compression", unit="variant", file=sys.stderr) as bar:
        rows = view.run(model, weights, todo, scorer, progress=lambda v: bar.update(1))
    after = view.state_sha256(model.hf)
    if after != before:
        raise RuntimeError(f"the original weights were not restored ({before} → {after})")
    frame = pd.DataFrame(rows, columns=atlas_results.COMPRESSION.names)
    positions = {name: int(w.shape[0] * (w.shape[1] - 1)) for name, w in scored.items()}
    metadata = {
        **results.file_metadata("atlas_compression"),
        "model_source": source,
        "windows_corpora": windows_meta.get("corpora"),
        "scored_positions": positions,
        "weights_sha256_before": before,
        "weights_sha256_after": after,
        "layer_sensitivity": {str(k): v for k, v in scores.items()},
        "variants": len(todo),
        "threads": args.threads,
        "dtype": "simulated weights in the model's dtype (float32), float64 KL",
    }
    atlas_results.COMPRESSION.write(args.out, frame, metadata)
    references = datafile.read("headgeom.atlas", "references.yaml")
    with open(args.out_report, "w", encoding="utf-8") as f:
        f.write(report(frame, references))
    print(f"{len(todo)} variants in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
