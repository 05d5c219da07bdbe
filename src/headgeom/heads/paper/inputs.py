"""What a paper output reads: Parquets by input kind, and the run metadata every table
labels its rows with (docs §17).

A table or figure takes its inputs by kind (``{"runs": [...], "summaries": [...]}``: the
Parquets of one result type each; the kinds of each output are its record's ``inputs``,
:mod:`headgeom.heads.paper.outputs`). Kinds, one file per model × seed × task unless noted:

* ``runs``: ``models/<m>/s<seed>/train_log.parquet``; its metadata (run config, validation
  loss, parameter count) gives display name, repository name, corpus and geometry.
* ``geometry``: ``geometry/<m>/s<seed>/summary.parquet`` (Table 2).
* ``eval``: ``eval/...`` clean accuracy and margin (Table 5).
* ``summaries``: ``concentration/....parquet`` E, N_eff, top-head share per split (Table 6).
* ``robustness``: ``concentration/....robustness.parquet`` decomposition, index null,
  per-example-absolute N_eff (Table 3; docs §12.2–12.4).
* ``lanes``, ``leakage``, ...: the Parquet of that analysis (``headgeom.results``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from headgeom.io import read_parquet_metadata, read_table
from headgeom.model import facts
from headgeom.vocabulary import TASKS

TASK_ORDER = list(TASKS)


TASK_TITLES = {"sva": "SVA", "quote": "Quote", "plural": "Plural"}


Inputs = Mapping[str, Sequence[str]]


def grouped_inputs(groups: list[list[str]]) -> dict[str, list[str]]:
    """``[[kind, path, ...], ...]`` → ``{kind: [path, ...]}`` (a kind may repeat)."""
    inputs: dict[str, list[str]] = {}
    for kind, *paths in groups:
        if not paths:
            raise ValueError(f"--input {kind} names no files")
        inputs.setdefault(kind, []).extend(paths)
    return inputs


def need_kind(inputs: Inputs, kind: str, table: str) -> list[str]:
    paths = list(inputs.get(kind, []))
    if not paths:
        raise ValueError(
            f"{table} needs input Parquets of kind {kind!r}; got kinds {sorted(inputs)}"
        )
    return paths


def read_kind(paths: Sequence[str], columns: Sequence[str], what: str) -> pd.DataFrame:
    """Concatenate Parquets, refusing any that lacks a column ``what`` needs."""
    frames = []
    for path in paths:
        table = read_table(path)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(
                f"{path}: lacks columns {missing} needed by {what} (has {table.column_names})"
            )
        frames.append(table.to_pandas())
    return pd.concat(frames, ignore_index=True)


def _meta_json(meta: dict[str, str], key: str, path: str):
    if key not in meta:
        raise KeyError(f"{path}: Parquet metadata lacks {key!r}")
    return json.loads(meta[key])


def read_runs(paths: Sequence[str]) -> pd.DataFrame:
    """One row per (model, seed) from training logs' metadata, in input (config) order."""
    rows = []
    for path in paths:
        meta = read_parquet_metadata(path)
        cfg = _meta_json(meta, "config", path)
        model = cfg["model"]
        rows.append(
            {
                "model": cfg["model_name"],
                "seed": int(cfg["seed"]),
                "display_name": cfg.get("display_name", cfg["model_name"]),
                "repository_name": cfg.get("repository_name"),
                "corpus": cfg.get("corpus", "—"),
                "geometry": facts.study_geometry(model),  # multiscreen: its own name
                "n_params": int(_meta_json(meta, "n_params", path)),
                "val_loss": float(_meta_json(meta, "val_loss_nats", path)),
            }
        )
    if not rows:
        raise ValueError("no training logs given")
    runs = pd.DataFrame(rows)
    if runs.duplicated(["model", "seed"]).any():
        raise ValueError("more than one training log for a (model, seed)")
    runs["order"] = np.arange(len(runs))
    return label_runs(runs)


def label_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``label`` and ``label_repository`` of each run, unique among ``runs``."""
    runs = runs.copy()
    # "learned (s42)" only where a display name has several seeds on one corpus (paper Table 6)
    several = runs.groupby(["display_name", "corpus"])["seed"].transform("nunique") > 1
    runs["label"] = np.where(
        several, runs["display_name"] + " (s" + runs["seed"].astype(str) + ")", runs["display_name"]
    )
    # a label must name one run: models sharing a display name (on different corpora) get
    # their config key where the table has no corpus column to tell them apart
    clash = runs.duplicated("label", keep=False)
    runs.loc[clash, "label"] = runs["label"] + " [" + runs["model"] + "]"
    # Table 5 names the repository of every checkpoint where the config gives one
    runs["label_repository"] = [
        f"{name} ({repo})" if isinstance(repo, str) else label
        for name, repo, label in zip(
            runs["display_name"], runs["repository_name"], runs["label"], strict=True
        )
    ]
    return runs


def with_runs(frame: pd.DataFrame, runs: pd.DataFrame, what: str) -> pd.DataFrame:
    """Attach run info (label, corpus, order) to result rows; every row needs its run."""
    keys = frame[["model", "seed"]].drop_duplicates()
    known = keys.merge(runs[["model", "seed"]], how="left", indicator=True)
    orphans = known[known["_merge"] == "left_only"]
    if len(orphans):
        raise ValueError(
            f"{what}: no training log given for {orphans[['model', 'seed']].values.tolist()}"
        )
    cols = ["model", "seed", "label", "label_repository", "display_name", "corpus", "order"]
    return frame.merge(runs[cols], on=["model", "seed"], how="left", validate="many_to_one")


def split_rows(frame: pd.DataFrame, split: str, what: str) -> pd.DataFrame:
    rows = frame[frame["split"] == split]
    if rows.empty:
        raise ValueError(
            f"{what}: no rows of split {split!r} (splits: {sorted(set(frame['split']))})"
        )
    return rows


def tidy_order(tidy: pd.DataFrame) -> pd.DataFrame:
    """CSV rows in run (config) order, tasks in paper order."""
    rank = tidy["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    return tidy.assign(_t=rank).sort_values(["order", "_t"]).drop(columns=["order", "_t"])


def widen(tidy: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """(model, seed) rows in run order × (value, task) columns."""
    if tidy.duplicated(["model", "seed", "task"]).any():
        raise ValueError("more than one row for a (model, seed, task)")
    index = ["order", "model", "seed", "label", "label_repository", "corpus"]
    wide = tidy.pivot_table(index=index, columns="task", values=values, aggfunc="first")
    return wide.sort_index(level="order")


def row_keys(wide: pd.DataFrame) -> pd.DataFrame:
    return wide.index.to_frame(index=False).drop(columns="order")


def task_columns(wide: pd.DataFrame, stat: str) -> list[str]:
    return [t for t in TASK_ORDER if (stat, t) in wide.columns]


Context = Mapping[str, Any]


def optional_kind(
    inputs: Inputs, kind: str, columns: Sequence[str], empty: bool = False
) -> pd.DataFrame | None:
    """The Parquets of ``kind``; when the study gives none (an output of an analysis the
    study does not run), None, or with ``empty`` a frame of ``columns`` without rows."""
    paths = list(inputs.get(kind, []))
    if paths:
        return read_kind(paths, columns, kind)
    return pd.DataFrame(columns=list(columns)) if empty else None


def learned_reference(frame: pd.DataFrame, value: str, keys: Sequence[str]) -> pd.Series:
    """Per row, ``value`` of the learned (baseline) run it is compared with: same corpus and
    ``keys`` (e.g. task) and the same seed when one exists, else the mean over that corpus's
    learned seeds (the rule of Table 2's Δ)."""
    learned = frame[frame["geometry"].map(facts.is_baseline)]
    keys = ["corpus", *keys]
    same_seed = learned.set_index([*keys, "seed"])[value]
    mean = learned.groupby(keys)[value].mean()
    ref = same_seed.reindex(pd.MultiIndex.from_frame(frame[[*keys, "seed"]])).to_numpy()
    fallback = mean.reindex(pd.MultiIndex.from_frame(frame[keys])).to_numpy()
    return pd.Series(np.where(np.isnan(ref), fallback, ref), index=frame.index)
