"""Hand-made result files the paper-table and figure tests read."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from headgeom.io import write_parquet


def train_log(path, model, geometry, seed, n_params=1000, val_loss=3.5, **cfg_extra):
    cfg = {
        "model_name": model,
        "seed": seed,
        "model": {"geometry": geometry, "n_layer": 2, "n_head": 2},
        **cfg_extra,
    }
    frame = pd.DataFrame({"step": [1], "loss": [1.0]})
    schema = pa.schema([("step", pa.int64()), ("loss", pa.float64())])
    meta = {"config": cfg, "n_params": n_params, "val_loss_nats": val_loss}
    write_parquet(path, frame, schema, meta)
    return str(path)


def write_rows(path, rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    schema = pa.Schema.from_pandas(frame, preserve_index=False).remove_metadata()
    write_parquet(path, frame, schema)
    return str(path)


def train_log_s(path, model: str, geometry: str, seed: int = 42) -> str:
    """A corpus-S run of 3 layers × 4 heads (the figure tests' runs)."""
    cfg = {
        "model_name": model,
        "seed": seed,
        "corpus": "S",
        "model": {"geometry": geometry, "n_layer": 3, "n_head": 4},
    }
    schema = pa.schema([("step", pa.int64())])
    meta = {"config": cfg, "n_params": 1, "val_loss_nats": 3.5}
    write_parquet(path, pd.DataFrame({"step": [1]}), schema, meta)
    return str(path)
