"""Reading a task file (data/tasks.py writes it): the examples of the chosen splits with
their identity, and their token ids in a model's vocabulary."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom.data.corpus import compact
from headgeom.data.tasks import CONDITIONS
from headgeom.hashing import sha256_file
from headgeom.io import metadata_text, read_parquet_metadata, read_table

# --- reading a task file ------------------------------------------------------------------------
#: Columns of a task Parquet that patching and evaluation read.
TASK_COLUMNS = (
    "example_id",
    "split",
    "condition",
    "lexical_group",
    "clean_ids",
    "ref_ids",
    "correct_id",
    "incorrect_id",
)


@dataclass(frozen=True)
class TaskSplits:
    """Examples of the requested splits of a task file, in file order within each split."""

    frame: pd.DataFrame  # TASK_COLUMNS, one row per example
    schema: pa.Schema  # the task file's schema (column types are carried into results)
    dataset_sha256: str
    file_sha256: str
    name: str  # the task (file metadata ``task``; the file stem when absent)


def read_task(path: str | os.PathLike, splits: Sequence[str] | None = None) -> TaskSplits:
    """Read a task Parquet, keeping ``splits`` (in that order; every split must be present),
    or every example in file order when ``splits`` is None."""
    table = read_table(path)
    missing = [c for c in TASK_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: task file lacks columns {missing}")
    frame = table.select(list(TASK_COLUMNS)).to_pandas()
    available = list(pd.unique(frame["split"]))
    if splits is None:
        if frame.empty:
            raise ValueError(f"{path}: task file has no examples")
        parts = [frame]
        check = [frame[frame["split"] == s] for s in available]
    else:
        absent = [s for s in splits if s not in available]
        if absent or not splits:
            raise ValueError(
                f"{path}: splits {absent or list(splits)} requested, file has {available}"
            )
        if len(set(splits)) != len(splits):
            raise ValueError(f"splits {list(splits)} name a split twice")
        parts = check = [frame[frame["split"] == s] for s in splits]
    for part in check:
        if part["example_id"].duplicated().any():
            raise ValueError(f"{path}: duplicate example_id within split {part['split'].iloc[0]!r}")
    metadata = read_parquet_metadata(path)
    return TaskSplits(
        frame=pd.concat(parts, ignore_index=True),
        schema=table.schema,
        dataset_sha256=metadata_text(metadata, "dataset_sha256", path),
        file_sha256=sha256_file(path),
        name=metadata.get("task", Path(path).stem),
    )


def first_per_condition(
    task: TaskSplits,
    split: str,
    n: int,
    path: str | os.PathLike,
    conditions: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The first ``n`` examples of ``split`` in canonical order (ascending ``example_id``)
    with n/4 per condition: the first n/4 of each of the task's conditions (default
    ``tasks.CONDITIONS[task.name]``), kept in canonical order (docs §15.1 CHOICE: the 16
    examples of Table 7 and ACDC). Refuses, naming ``path``, the split and the counts, an
    ``n`` that the conditions do not divide, a condition with fewer than n/4 examples and
    an example whose condition is not the task's."""
    if conditions is None:
        if task.name not in CONDITIONS:
            raise ValueError(f"{path}: task {task.name!r} has no known conditions")
        conditions = CONDITIONS[task.name]
    conditions = list(conditions)
    if n < 1 or n % len(conditions):
        raise ValueError(
            f"{path}: {n} examples cannot be split evenly over the {len(conditions)} "
            f"conditions {conditions}"
        )
    part = task.frame[task.frame["split"] == split].sort_values("example_id", kind="stable")
    counts = {c: int((part["condition"] == c).sum()) for c in conditions}
    unknown = sorted(set(part["condition"]) - set(conditions))
    if unknown:
        raise ValueError(f"{path}: split {split!r} has conditions {unknown} not in {conditions}")
    short = {c: k for c, k in counts.items() if k < n // len(conditions)}
    if short:
        raise ValueError(
            f"{path}: split {split!r} has too few examples of condition(s) {sorted(short)} for "
            f"{n // len(conditions)} per condition (counts {counts})"
        )
    chosen = part.groupby("condition", sort=False).head(n // len(conditions))
    return chosen.reset_index(drop=True)


@dataclass(frozen=True)
class PatchInputs:
    """Model-id inputs of a task's examples, one entry per example."""

    clean_ids: list[np.ndarray]
    ref_ids: list[np.ndarray]
    correct: np.ndarray
    incorrect: np.ndarray


def model_inputs(frame: pd.DataFrame, vocab: np.ndarray) -> PatchInputs:
    """Map a task frame's GPT-2 ids to model ids with the checkpoint's vocabulary map."""

    def ids(column: str) -> list[np.ndarray]:
        return [np.asarray(compact(np.asarray(x, dtype=np.int64), vocab)) for x in frame[column]]

    return PatchInputs(
        clean_ids=ids("clean_ids"),
        ref_ids=ids("ref_ids"),
        correct=np.asarray(compact(frame["correct_id"].to_numpy(np.int64), vocab)),
        incorrect=np.asarray(compact(frame["incorrect_id"].to_numpy(np.int64), vocab)),
    )
