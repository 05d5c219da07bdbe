"""Effects tables ↔ (layer, head) arrays: the one conversion every analysis uses.

Patching writes tidy rows (one per example × layer × head, column ``effect``); the
concentration stage writes one row per (layer, head) (column ``e``). Analyses work on arrays:
per-example drops d (N, L, H) and mean effects e (L, H), indexed ``[example, layer, head]``.
Every conversion requires a complete grid, each cell exactly once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def drops_array(
    effects: pd.DataFrame, n_layers: int | None = None, n_heads: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example drops of one split of an effects table as ``(example_ids, d (N, L, H))``.

    ``effects`` holds the rows of ``heads/stages/patch_heads.py`` for a single split (columns
    example_id, layer, head, effect). Examples keep their order of first appearance. The
    table must be complete: exactly one row per (example, layer, head).
    """
    if effects.empty:
        raise ValueError("no effect rows")
    n_layers = int(effects["layer"].max()) + 1 if n_layers is None else n_layers
    n_heads = int(effects["head"].max()) + 1 if n_heads is None else n_heads
    example_ids = pd.unique(effects["example_id"])
    if effects.duplicated(["example_id", "layer", "head"]).any():
        raise ValueError("effects name some (example, layer, head) more than once")
    if len(effects) != len(example_ids) * n_layers * n_heads:
        raise ValueError(
            f"effects are incomplete: {len(effects)} rows for {len(example_ids)} examples × "
            f"{n_layers} layers × {n_heads} heads"
        )
    layer, head = effects["layer"].to_numpy(np.int64), effects["head"].to_numpy(np.int64)
    if layer.min() < 0 or layer.max() >= n_layers or head.min() < 0 or head.max() >= n_heads:
        raise ValueError(f"effects name layers/heads outside the {n_layers}×{n_heads} model")
    example = pd.Index(example_ids).get_indexer(effects["example_id"])
    d = np.full((len(example_ids), n_layers, n_heads), np.nan)
    d[example, layer, head] = effects["effect"].to_numpy(np.float64)
    if np.isnan(d).any():
        raise ValueError("effects contain NaN drops")
    return np.asarray(example_ids), d


def effect_matrix(
    rows: pd.DataFrame, value: str = "e", where: str = "per-head effects"
) -> np.ndarray:
    """(L, H) matrix of column ``value`` indexed [layer, head] from one group of per-head
    rows; the grid (from the largest layer and head) must be covered exactly once."""
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    if len(rows) != n_layers * n_heads or rows.duplicated(["layer", "head"]).any():
        raise ValueError(
            f"{where}: expected one row per (layer, head) of a {n_layers}×{n_heads} grid"
        )
    e = np.full((n_layers, n_heads), np.nan)
    e[rows["layer"].to_numpy(), rows["head"].to_numpy()] = rows[value].to_numpy(np.float64)
    return e


def matrix_columns(matrix: np.ndarray) -> dict[str, np.ndarray]:
    """``layer``, ``head`` and ``value`` columns of an (L, H) matrix, row-major (layer
    first): the inverse of :func:`effect_matrix`."""
    n_layers, n_heads = matrix.shape
    return {
        "layer": np.repeat(np.arange(n_layers), n_heads),
        "head": np.tile(np.arange(n_heads), n_layers),
        "value": np.asarray(matrix).reshape(-1),
    }


def drops_columns(clean_ld: np.ndarray, patched_ld: np.ndarray) -> dict[str, np.ndarray]:
    """Tidy columns of per-example patching results, one row per (example, layer, head) in
    example-major order: the inverse of :func:`drops_array`.

    ``clean_ld`` (N,) and ``patched_ld`` (N, L, H) give ``example`` (row index of the
    example), ``layer``, ``head``, ``clean_ld``, ``patched_ld`` and the drop
    ``effect = clean_ld − patched_ld``.
    """
    n, n_layers, n_heads = patched_ld.shape
    per_example = n_layers * n_heads
    return {
        "example": np.repeat(np.arange(n), per_example),
        "layer": np.tile(np.repeat(np.arange(n_layers), n_heads), n),
        "head": np.tile(np.arange(n_heads), n * n_layers),
        "clean_ld": np.repeat(clean_ld, per_example),
        "patched_ld": patched_ld.reshape(-1),
        "effect": (clean_ld[:, None, None] - patched_ld).reshape(-1),
    }


def single_identity(
    frame: pd.DataFrame, path: str, columns: tuple[str, ...] = ("model", "seed", "task")
) -> dict:
    """The one (model, seed, task) that the rows of ``frame`` (read from ``path``) are of, as
    plain Python values; an error naming the file if a column holds several."""
    identity = {}
    for column in columns:
        values = pd.unique(frame[column])
        if len(values) != 1:
            raise ValueError(f"{path}: expected one {column}, found {list(values)}")
        identity[column] = values[0].item() if isinstance(values[0], np.generic) else values[0]
    return identity
