"""The effects table of one model on one task: every head patched on every example of the
requested splits (docs §10.1), one row per (split, example, layer, head).

The engines live in :mod:`headgeom.heads.analysis.patching`; this module runs one over each split
and lays the result out as the tidy ``results.EFFECTS`` rows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from headgeom import results
from headgeom.data.task_files import TaskSplits, model_inputs
from headgeom.heads.analysis.batching import length_batches
from headgeom.heads.analysis.effects import drops_columns
from headgeom.heads.analysis.patching import (
    patch_all_heads,
    patch_all_heads_fast,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.vocabulary import MODES

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
    mode: str,
    z_means: torch.Tensor | None = None,
) -> pd.DataFrame:
    """Effects rows (without model/seed/task columns) of every head on every example of
    ``splits``, split by split; ``engine`` is ``fast`` or ``plain``; ``mode`` one of
    :data:`MODES` (``mean`` needs ``z_means`` (L, H, d_head))."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    replacement = mode_replacement(model, mode, z_means)
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
                    model, *arrays, batch_size, bar.update, max_rows=max_rows,
                    replacement=replacement,
                )  # fmt: skip
            else:
                clean_ld, patched_ld = patch_all_heads(
                    model, *arrays, batch_size, bar.update, replacement
                )
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


def mode_replacement(
    model: torch.nn.Module, mode: str, z_means: torch.Tensor | None
) -> torch.Tensor | None:
    """The engines' ``replacement`` for an ablation mode: None (resample), the per-head
    means (mean) or zeros (zero), shape (L, H, d_head)."""
    if mode not in MODES:
        raise ValueError(f"patching mode must be one of {MODES}, got {mode!r}")
    if mode == "resample":
        return None
    shape = (model.cfg.n_layer, model.cfg.n_head, model.cfg.d_head)
    if mode == "zero":
        return torch.zeros(shape)
    if z_means is None:
        raise ValueError("patching mode 'mean' needs the head means (--means)")
    return z_means


#: What each mode replaces z^{l,h} by (the effects files' ``patch_site`` metadata).
MODE_SITES = {
    "resample": "blocks.{l}.attn.hook_z, head h, all positions (docs §10.1)",
    "mean": "blocks.{l}.attn.hook_z, head h, all positions, set to the head's mean z over "
    "held-out validation positions t >= 1 (docs §10.6)",
    "zero": "blocks.{l}.attn.hook_z, head h, all positions, set to 0 (docs §10.6)",
}


@dataclass(frozen=True)
class EffectsRun:
    """Whose effects a file holds (run, seed, task, splits) and how the engine computed them;
    recorded in the file's metadata."""

    model_name: str
    seed: int
    task_name: str
    splits: Sequence[str]
    batch_size: int
    max_rows: int
    engine: str
    threads: int


def effects_metadata(
    model, manifest, task, run: EffectsRun, device, mode: str = "resample", means=None
) -> dict:
    """File metadata of an effects Parquet (heads/stages/patch_heads.py,
    heads/stages/patch_modes.py): the provenance (with the mode and, for mean ablation, the
    means artifact's SHA-256), the run, task, splits and shape, and how the engine ran."""
    return {
        **results.file_metadata(
            "patch_heads",
            manifest=manifest,
            task_dataset_sha256=task.dataset_sha256,
            task_file_sha256=task.file_sha256,
            patch_mode=mode,
            ablation_means_sha256=None if means is None else means.sha256,
        ),
        "model": run.model_name,
        "seed": run.seed,
        "task": run.task_name,
        "splits": list(run.splits),
        "n_layers": model.cfg.n_layer,
        "n_heads": model.cfg.n_head,
        "patch_site": MODE_SITES[mode],
        "batch_size": run.batch_size,
        "max_rows": run.max_rows,
        "engine": run.engine,
        "engine_paths": engine_paths(model, run.engine),
        "device": str(device),
        "threads": run.threads,
        "dtype": "float32 forward, float64 logit differences",
    }
