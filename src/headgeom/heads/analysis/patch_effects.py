"""The effects table of one model on one task: every head patched on every example of the
requested splits (docs §10.1), one row per (split, example, layer, head); and the same for
the key/value heads of a grouped-query model, one row per (split, example, layer, kv head).

The engines live in :mod:`headgeom.heads.analysis.patching` and
:mod:`headgeom.heads.analysis.kv_patching`; this module runs one over each split and lays the
result out as the tidy ``results.EFFECTS`` / ``results.KV_EFFECTS`` rows.
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
from headgeom.heads.analysis.kv_patching import patch_kv_heads
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
        frames.append(_split_frame(split, rows, clean_ld, patched_ld))
    return pd.concat(frames, ignore_index=True)


def _split_frame(split, rows, clean_ld, patched_ld) -> pd.DataFrame:
    """The tidy rows of one split: (example, layer, head) of ``drops_columns``."""
    grid = drops_columns(clean_ld, patched_ld)
    example = grid.pop("example")
    return pd.DataFrame(
        {
            "split": split,
            "example_id": rows["example_id"].to_numpy()[example],
            "condition": rows["condition"].astype(str).to_numpy()[example],
            "lexical_group": rows["lexical_group"].astype(str).to_numpy()[example],
            **grid,
        }
    )


def patch_kv_task(
    model: torch.nn.Module,
    vocab: np.ndarray,
    task: TaskSplits,
    splits: Sequence[str],
    batch_size: int,
    max_rows: int,
    engine: str,
) -> pd.DataFrame:
    """``results.KV_EFFECTS`` rows (without model/seed/task columns) of every key/value head
    (``kv_patching.patch_kv_heads``: its k and v projection outputs, all positions, reference
    values) on every example of ``splits``; ``query_heads`` names the query heads that read
    each (``model.cfg.kv_groups``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    n_layer, n_kv = model.cfg.n_layer, model.cfg.n_kv_head
    frames = []
    for split in splits:
        rows = task.frame[task.frame["split"] == split].reset_index(drop=True)
        inputs = model_inputs(rows, vocab)
        n_batches = len(length_batches([len(x) for x in inputs.clean_ids], batch_size))
        with tqdm(
            total=n_batches * n_layer * n_kv, desc=f"kv {split}", unit="head", file=sys.stderr
        ) as bar:
            clean_ld, patched_ld = patch_kv_heads(
                model, inputs.clean_ids, inputs.ref_ids, inputs.correct, inputs.incorrect,
                batch_size, engine=engine, progress=bar.update, max_rows=max_rows,
            )  # fmt: skip
        frame = _split_frame(split, rows, clean_ld, patched_ld).rename(columns={"head": "kv_head"})
        groups = [list(g) for g in model.cfg.kv_groups]
        frame.insert(frame.columns.get_loc("kv_head") + 1, "query_heads",
                     [groups[j] for j in frame["kv_head"]])  # fmt: skip
        frames.append(frame)
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


#: What key/value-head patching replaces (the kv effects files' ``patch_site`` metadata).
KV_SITE = (
    "blocks.{l}.attn.hook_k and attn.hook_v, key/value head j, all positions: its k and v "
    "projection outputs set to their reference values, before the k-norm (Qwen3, Gemma 3) "
    "and the rotary, which then act on them (docs §10.1)"
)

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


def kv_effects_metadata(model, manifest, task, run: EffectsRun, device) -> dict:
    """File metadata of a key/value-head effects Parquet (heads/stages/patch_kv_heads.py): those of
    :func:`effects_metadata` for resample patching, with the key/value head count, the query
    heads of each and what the engine did."""
    meta = effects_metadata(model, manifest, task, run, device)
    meta["analysis"] = "patch_kv_heads"
    paths = engine_paths(model, run.engine)
    meta.update(
        n_kv_heads=model.cfg.n_kv_head,
        kv_groups=[list(g) for g in model.cfg.kv_groups],
        patch_site=KV_SITE,
        engine_paths=paths.replace("per head", "per key/value head").replace(
            "stacked heads", "stacked key/value heads"
        ),
    )
    return meta
