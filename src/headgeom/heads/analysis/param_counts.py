"""Parameter counts of every model of a study with the real constructor (docs §4.4).

Models are built under ``torch.device("meta")`` (shapes only, no memory, no training), so the
paper zoo is counted on a laptop. ``expected_n_params`` is the exact count of docs §6.1
when the model has the paper's size, else null; :func:`count_runs` fails on any difference
([CHECK] §4.4).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd
import torch

from headgeom import checks, results
from headgeom.hashing import content_hash
from headgeom.model import registry, zoo

#: Keys of one run: its study model name, seed, the paper's names, geometry, corpus and the
#: model section of its run config.
RUN_KEYS = (
    "model",
    "seed",
    "repository_name",
    "display_name",
    "geometry",
    "corpus",
    "model_config",
)


def check_runs(runs: object) -> list[dict]:
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
    with torch.device("meta"):
        model = registry.build_model(run["model_config"], n_vocab)
    row["n_params"], row["n_frozen"] = zoo.count_parameters(model)
    family = registry.basis_family(model.cfg)
    row["basis_family_hash"] = family.family_hash if family is not None else None
    return row


def count_runs(runs: Sequence[dict], n_vocab: int) -> pd.DataFrame:
    """``results.PARAM_COUNTS`` rows of ``runs``; refuses counts that differ from §6.1."""
    cache: dict[str, dict] = {}  # seeds share a model: build each model config once
    rows = []
    for run in runs:
        key = content_hash(run["model_config"])
        if key not in cache:
            cache[key] = count(run, n_vocab)
            print(f"{run['model']}: {cache[key]['n_params']} parameters", file=sys.stderr)
        rows.append({**cache[key], **{k: run[k] for k in RUN_KEYS if k != "model_config"}})
    frame = pd.DataFrame(rows, columns=results.PARAM_COUNTS.names)
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
            "check C1 failed: parameter counts differ from docs §6.1 ([CHECK] §4.4):\n"
            + "\n".join(lines)
        )
    return frame


def c1_metadata(frame: pd.DataFrame) -> dict:
    """Check C1 (docs §18) as file metadata: max |n_params − expected_n_params| over the runs
    with a §6.1 integer (null when none has the paper's size)."""
    known = frame.dropna(subset=["n_params", "expected_n_params"])
    residual = None
    if len(known):
        diff = known["n_params"].astype("int64") - known["expected_n_params"].astype("int64")
        residual = int(diff.abs().max())
    note = (f"{len(known)} of {len(frame)} runs have a §6.1 integer (the paper's size and "
            "GPT-2 vocabulary)")  # fmt: skip
    return checks.record("C1", residual, 0, note=note)
