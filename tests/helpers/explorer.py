"""A synthetic study for the explorer's tests and its size benchmark: every Parquet the
explorer reads, written with the real result schemas (values random, of each column's
type), plus its catalog. :data:`SMALL` is the tests' two runs of 3 layers × 4 heads;
benchmarks/explorer_scale.py builds the paper's shape."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom import results
from headgeom.hashing import sha256_file


@dataclass(frozen=True)
class Shape:
    runs: tuple[tuple[str, int], ...]
    n_layer: int
    n_head: int
    tasks: tuple[str, ...]
    splits: tuple[str, ...]
    examples: int  # per split, in the effects
    leakage: int  # the first this many runs have leakage, ...
    clamps: int
    edges: int
    atlas: int
    timeline: int


SMALL = Shape(
    runs=(("learned", 42), ("write-common-axis", 43)), n_layer=3, n_head=4,
    tasks=("sva", "quote"), splits=("discovery", "evaluation"), examples=5,
    leakage=2, clamps=1, edges=1, atlas=1, timeline=1,
)  # fmt: skip
RUNS, N_LAYER, N_HEAD = SMALL.runs, SMALL.n_layer, SMALL.n_head


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


def _pairs(shape: Shape, a: str, b: str) -> pd.DataFrame:
    """Every (head a in layer l, head b in a later layer, read type) of the shape."""
    L, H = shape.n_layer, shape.n_head
    rows = [
        (sl, sh, rl, rh, x)
        for sl in range(L) for sh in range(H)
        for rl in range(sl + 1, L) for rh in range(H) for x in "QKV"
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=[f"{a}_layer", f"{a}_head", f"{b}_layer", f"{b}_head",
                                       "read_type"])  # fmt: skip


def write_study(
    root: Path, seed: int = 0, shape: Shape = SMALL
) -> tuple[dict[str, list[str]], str]:
    """Write the synthetic study under ``root``; (explorer inputs by kind, catalog path)."""
    rng = np.random.default_rng(seed)
    inputs: dict[str, list[str]] = {}
    L, H = shape.n_layer, shape.n_head
    grid = pd.DataFrame([(la, h) for la in range(L) for h in range(H)], columns=["layer", "head"])

    def put(kind, table, name, keys: pd.DataFrame, **constant):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        table.write(path, _fill(table, keys.assign(**constant), rng))
        inputs.setdefault(kind, []).append(str(path))

    for i, (model, seed_) in enumerate(shape.runs):
        run = {"model": model, "seed": seed_}
        for task in shape.tasks:
            cells = pd.concat([grid.assign(split=s) for s in shape.splits], ignore_index=True)
            put("heads", results.HEADS, f"heads/{model}-{seed_}-{task}.parquet", cells, **run,
                task=task)  # fmt: skip
            examples = cells.loc[cells.index.repeat(shape.examples)].reset_index(drop=True)
            examples["example_id"] = np.tile(np.arange(shape.examples), len(cells))
            put("effects", results.EFFECTS, f"effects/{model}-{seed_}-{task}.parquet", examples,
                **run, task=task)  # fmt: skip
            if i < shape.leakage:
                put("leakage", results.LEAKAGE, f"leakage/{model}-{seed_}-{task}.parquet",
                    _pairs(shape, "source", "reader"), **run, task=task,
                    split="evaluation")  # fmt: skip
        put("geometry", results.GEOMETRY_HEADS, f"geometry/{model}-{seed_}.parquet", grid, **run)
        if i < shape.clamps:
            ranks = pd.DataFrame(
                [(t, r, r % L, r % H) for t in shape.tasks for r in range(5)],
                columns=["task", "rank", "layer", "head"],
            )
            put("clamps", results.CLAMP_PATHS, f"clamps/{model}-{seed_}.parquet", ranks, **run,
                split="evaluation")  # fmt: skip
        if i < shape.edges:
            put("edges", results.EDGES, f"edges/{model}-{seed_}.parquet",
                _pairs(shape, "writer", "reader"), **run, task="sva",
                split="validation")  # fmt: skip
        if i < shape.atlas:
            blocks = pd.DataFrame(
                [
                    (a, b, la, h, f"L{la}.{b}" if h is None else f"L{la}.H{h}")
                    for a in ("zero", "mean") for la in range(L)
                    for b, h in [("attn", None), ("mlp", None)] + [("head", h) for h in range(H)]
                ],
                columns=["ablation", "block", "layer", "head", "label"],
            )  # fmt: skip
            put("atlas", results.ABLATION_ATLAS, f"atlas/{model}-{seed_}.parquet", blocks, **run)
        if i < shape.timeline:
            steps = pd.DataFrame({"step": [1, 4, 16, 64], "is_final": [False] * 3 + [True]})
            put("timeline", results.TIMELINE, f"timeline/{model}-{seed_}.parquet", steps, **run)
    catalog = root / "catalog.parquet"
    paths = [p for ps in inputs.values() for p in ps]
    rows = pd.DataFrame({"path": paths, "sha256": [sha256_file(p) for p in paths]})
    results.CATALOG.write(catalog, _fill(results.CATALOG, rows, rng))
    return inputs, str(catalog)
