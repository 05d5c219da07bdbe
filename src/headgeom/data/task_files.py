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
import pyarrow.parquet as pq

from headgeom.data.corpus import compact
from headgeom.hashing import sha256_file
from headgeom.io import metadata_text, read_parquet_metadata

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
    table = pq.read_table(path)
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
