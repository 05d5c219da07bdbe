"""Count every model's parameters with the real constructor, on the meta device (METHODS §4.4).

    python src/param_counts.py --runs-json '[{"model": "learned", "seed": 42, ...}]' \\
        [--vocab vocab.parquet] --out results/demo/models/param_counts.parquet

Each run gives its study model name, seed, repository and display names, geometry, corpus
and the model section of its run config. Models are built under ``torch.device("meta")``
(shapes only, no memory, no training), so the paper zoo is counted on a laptop. The
vocabulary size is the row count of ``--vocab`` (a compacted demo vocabulary) or, without
it, GPT-2's 50,257. ``expected_n_params`` is the exact count of METHODS §6.1 when the model
has the paper's size, else null; any difference fails the job ([CHECK] §4.4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from headgeom.data.tokenizer import VOCAB_SIZE
from headgeom.hashing import content_hash
from headgeom.io import write_parquet
from headgeom.model import zoo
from headgeom.model.geometries import basis_family

SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int32()),
        ("repository_name", pa.string()),
        ("display_name", pa.string()),
        ("geometry", pa.string()),
        ("corpus", pa.string()),
        ("n_params", pa.int64()),
        ("expected_n_params", pa.int64()),
        ("n_frozen", pa.int64()),
        ("n_vocab", pa.int64()),
        ("basis_family_hash", pa.string()),
        ("note", pa.string()),
    ]
)
DESCRIPTIONS = {
    "repository_name": "the paper's repository name of this (model, seed), e.g. plain-learned42 "
    "(null when the study config gives none)",
    "display_name": "the paper's display name, e.g. all-rotated-self",
    "geometry": "read/write geometry (headgeom.model.geometries.GEOMETRIES or a multiscreen "
    "control)",
    "corpus": "training corpus R (200M tokens, with replacement) or S (1.07B, read once); "
    "null when the study does not say",
    "n_params": "trainable parameters of the real constructor, tied embedding counted once, "
    "frozen buffers excluded (METHODS §4.4); null if the model cannot be built",
    "expected_n_params": "exact count of METHODS §6.1 when the model has the paper's size; "
    "null where the paper gives no number (other sizes)",
    "n_frozen": "elements of the frozen buffers (write maps, read blocks); not parameters",
    "n_vocab": "vocabulary size the model was built with",
    "basis_family_hash": "content hash of the Kerdock ⊗ Haar basis family record (METHODS "
    "§5.7) the frozen maps come from; null when none is used",
    "note": "why n_params is null, if it is",
}
RUN_KEYS = (
    "model",
    "seed",
    "repository_name",
    "display_name",
    "geometry",
    "corpus",
    "model_config",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-json", required=True, help="JSON list of runs (see the docstring)")
    p.add_argument("--vocab", default=None, help="vocab.parquet; default: GPT-2's 50,257 ids")
    p.add_argument("--out", required=True, type=Path, help="output Parquet")
    return p.parse_args(argv)


def read_runs(text: str) -> list[dict]:
    runs = json.loads(text)
    if not isinstance(runs, list) or not runs:
        raise ValueError("--runs-json must be a non-empty JSON list")
    for i, run in enumerate(runs):
        missing = set(RUN_KEYS) - set(run)
        if missing:
            raise ValueError(f"--runs-json item {i} lacks {sorted(missing)}")
    return runs


def count(run: dict, n_vocab: int) -> dict:
    """One row: the model built on the meta device with the real constructor."""
    row = {k: run[k] for k in RUN_KEYS if k != "model_config"}
    row.update(n_params=None, n_frozen=None, basis_family_hash=None, note=None, n_vocab=n_vocab)
    row["expected_n_params"] = zoo.expected_n_params(run["geometry"], run["model_config"], n_vocab)
    try:
        with torch.device("meta"):
            model = zoo.build_model(run["model_config"], n_vocab)
    except RuntimeError as err:  # e.g. headgeom.model.multiscreen unavailable
        row["note"] = str(err)
        return row
    row["n_params"], row["n_frozen"] = zoo.count_parameters(model)
    family = basis_family(model.cfg) if hasattr(model.cfg, "geometry_params") else None
    row["basis_family_hash"] = family.family_hash if family is not None else None
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = read_runs(args.runs_json)
    n_vocab = pq.read_metadata(args.vocab).num_rows if args.vocab else VOCAB_SIZE
    cache: dict[str, dict] = {}  # seeds share a model: build each model config once
    rows = []
    for run in runs:
        key = content_hash(run["model_config"])
        if key not in cache:
            cache[key] = count(run, n_vocab)
            print(f"{run['model']}: {cache[key]['n_params']} parameters", file=sys.stderr)
        rows.append({**cache[key], **{k: run[k] for k in RUN_KEYS if k != "model_config"}})
    frame = pd.DataFrame(rows, columns=SCHEMA.names)
    for column in ("n_params", "expected_n_params", "n_frozen"):
        frame[column] = frame[column].astype("Int64")

    known = frame.dropna(subset=["n_params", "expected_n_params"])
    wrong = known[known["n_params"] != known["expected_n_params"]]
    if not wrong.empty:
        lines = [
            f"  {r.model} (seed {r.seed}, {r.geometry}): {r.n_params:,} != {r.expected_n_params:,}"
            for r in wrong.itertuples()
        ]
        raise SystemExit(
            "parameter counts differ from METHODS §6.1 ([CHECK] §4.4):\n" + "\n".join(lines)
        )
    write_parquet(
        args.out,
        frame,
        SCHEMA,
        metadata={"runs_hash": content_hash(runs), "n_vocab": n_vocab},
        descriptions=DESCRIPTIONS,
    )
    print(frame.drop(columns=["basis_family_hash", "note"]).to_string(index=False), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
