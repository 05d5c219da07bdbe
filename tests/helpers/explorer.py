"""A small synthetic study for the explorer's tests: every Parquet the explorer reads, for
two runs of 3 layers × 4 heads, written with the real result schemas, plus its catalog."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom import results
from headgeom.hashing import sha256_file

N_LAYER, N_HEAD = 3, 4
RUNS = [("learned", 42), ("write-common-axis", 43)]
TASKS = ["sva", "quote"]
SPLITS = ["discovery", "evaluation"]


def _fill(table: results.ResultTable, keys: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """``keys`` plus every other column of ``table`` filled with random values of its type."""
    frame = keys.copy()
    n = len(frame)
    for field in table.schema:  # nullable integers (an atlas row's head is null for attn)
        if field.name in frame and pa.types.is_integer(field.type):
            frame[field.name] = frame[field.name].astype("Int64")
    for field in table.schema:
        if field.name in frame:
            continue
        t = field.type
        if pa.types.is_floating(t):
            values = rng.normal(size=n)
            values[rng.random(n) < 0.1] = np.nan  # nulls where a column may have them
            frame[field.name] = values
        elif pa.types.is_integer(t):
            frame[field.name] = rng.integers(0, 50, size=n)
        elif pa.types.is_boolean(t):
            frame[field.name] = rng.random(n) < 0.5
        else:
            frame[field.name] = [f"{field.name}-{i}" for i in range(n)]
    return frame[table.names]


def _grid(**extra) -> list[dict]:
    return [
        {"layer": layer, "head": head, **extra}
        for layer in range(N_LAYER)
        for head in range(N_HEAD)
    ]


def write_study(root: Path, seed: int = 0) -> tuple[dict[str, list[str]], str]:
    """Write the synthetic study under ``root``; (explorer inputs by kind, catalog path)."""
    rng = np.random.default_rng(seed)
    inputs: dict[str, list[str]] = {}

    def put(kind, table, name, keys):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        table.write(path, _fill(table, pd.DataFrame(keys), rng))
        inputs.setdefault(kind, []).append(str(path))

    for model, seed_ in RUNS:
        run = {"model": model, "seed": seed_}
        for task in TASKS:
            cells = [{**run, "task": task, "split": s, **c} for s in SPLITS for c in _grid()]
            put("heads", results.HEADS, f"heads/{model}-{seed_}-{task}.parquet", cells)
            effects = [{**c, "example_id": x} for c in cells for x in range(5)]
            put("effects", results.EFFECTS, f"effects/{model}-{seed_}-{task}.parquet", effects)
            pairs = [
                {**run, "task": task, "split": "evaluation", "source_layer": sl,
                 "source_head": sh, "reader_layer": rl, "reader_head": rh, "read_type": x}
                for sl in range(N_LAYER) for sh in range(N_HEAD)
                for rl in range(sl + 1, N_LAYER) for rh in range(N_HEAD) for x in "QKV"
            ]  # fmt: skip
            put("leakage", results.LEAKAGE, f"leakage/{model}-{seed_}-{task}.parquet", pairs)
        put("geometry", results.GEOMETRY_HEADS, f"geometry/{model}-{seed_}.parquet",
            [{**run, **c} for c in _grid()])  # fmt: skip
        if model == "learned":
            clamps = [
                {**run, "task": t, "split": "evaluation", "rank": r, "layer": r % N_LAYER,
                 "head": r}
                for t in TASKS for r in range(N_HEAD)
            ]  # fmt: skip
            put("clamps", results.CLAMP_PATHS, f"clamps/{model}-{seed_}.parquet", clamps)
            edges = [
                {**run, "task": "sva", "split": "validation", "writer_layer": wl,
                 "writer_head": wh, "reader_layer": rl, "reader_head": rh, "read_type": x}
                for wl in range(N_LAYER) for wh in range(N_HEAD)
                for rl in range(wl + 1, N_LAYER) for rh in range(N_HEAD) for x in "QKV"
            ]  # fmt: skip
            put("edges", results.EDGES, f"edges/{model}-{seed_}.parquet", edges)
            blocks = [
                {**run, "block": b, "layer": layer, "head": h, "ablation": a,
                 "label": f"L{layer}.{b}" if h is None else f"L{layer}.H{h}"}
                for a in ("zero", "mean") for layer in range(N_LAYER)
                for b, h in [("attn", None), ("mlp", None)] + [("head", h) for h in range(N_HEAD)]
            ]  # fmt: skip
            put("atlas", results.ABLATION_ATLAS, f"atlas/{model}-{seed_}.parquet", blocks)
            steps = [{**run, "step": s, "is_final": s == 64} for s in (1, 4, 16, 64)]
            put("timeline", results.TIMELINE, f"timeline/{model}-{seed_}.parquet", steps)
    catalog = root / "catalog.parquet"
    paths = [p for ps in inputs.values() for p in ps]
    rows = pd.DataFrame({"path": paths, "sha256": [sha256_file(p) for p in paths]})
    frame = _fill(results.CATALOG, rows, rng)
    results.CATALOG.write(catalog, frame)
    return inputs, str(catalog)
