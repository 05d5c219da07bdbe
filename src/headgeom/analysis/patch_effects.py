"""The effects table of one model on one task: every head patched on every example of the
requested splits (docs §10.1), one row per (split, example, layer, head).

The engines live in :mod:`headgeom.analysis.patching`; this module runs one over each split
and lays the result out as the tidy ``results.EFFECTS`` rows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from headgeom.analysis.effects import drops_columns
from headgeom.analysis.patching import (
    length_batches,
    patch_all_heads,
    patch_all_heads_fast,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.data.task_files import TaskSplits, model_inputs

ENGINES = ("fast", "plain")


def engine_paths(model: torch.nn.Module, engine: str) -> str:
    """What the engine actually did for this model (recorded in the file metadata)."""
    if engine == "plain" or not supports_fast(model):
        return "plain: one full forward per head"
    if supports_prefix_reuse(model):
        return "fast: layer resumption, clean-prefix KV reuse, stacked heads, answer logits"
    return "fast: layer resumption, stacked heads, answer logits (no prefix reuse)"


def patch_task(
    model: torch.nn.Module,
    vocab: np.ndarray,
    task: TaskSplits,
    splits: Sequence[str],
    batch_size: int,
    max_rows: int,
    engine: str,
) -> pd.DataFrame:
    """Effects rows (without model/seed/task columns) of every head on every example of
    ``splits``, split by split; ``engine`` is ``fast`` or ``plain``."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    frames = []
    for split in splits:
        rows = task.frame[task.frame["split"] == split].reset_index(drop=True)
        inputs = model_inputs(rows, vocab)
        n_batches = len(length_batches([len(x) for x in inputs.clean_ids], batch_size))
        with tqdm(
            total=n_batches * n_layer * n_head, desc=f"patch {split}", unit="head", file=sys.stderr
        ) as bar:
            arrays = (inputs.clean_ids, inputs.ref_ids, inputs.correct, inputs.incorrect)
            if engine == "fast":
                clean_ld, patched_ld = patch_all_heads_fast(
                    model, *arrays, batch_size, bar.update, max_rows=max_rows
                )
            else:
                clean_ld, patched_ld = patch_all_heads(model, *arrays, batch_size, bar.update)
        grid = drops_columns(clean_ld, patched_ld)
        example = grid.pop("example")
        frames.append(
            pd.DataFrame(
                {
                    "split": split,
                    "example_id": rows["example_id"].to_numpy()[example],
                    "condition": rows["condition"].astype(str).to_numpy()[example],
                    "lexical_group": rows["lexical_group"].astype(str).to_numpy()[example],
                    **grid,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)
