"""Reading the held-out pools and the downstream suite into a model's ids (SAMOE §3.2): a
pool role (or the intervention subset) as an (S, T) id tensor with its sequence ids and
domains, every GPT-2 id mapped through the run's compact vocabulary."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headgeom.data.corpus import compact
from headgeom.io import read_table
from headgeom.samoe import results
from headgeom.samoe.ledger import Targets
from headgeom.samoe.rankings import as_targets


@dataclass(frozen=True)
class Pool:
    ids: torch.Tensor  # (S, T) model ids
    seq_ids: list[str]
    domains: list[str]


def read_pools(path: str | os.PathLike) -> pd.DataFrame:
    return read_table(path, results.POOLS.names).to_pandas()


def pool(frame: pd.DataFrame, role: str, vocab: np.ndarray, intervention: bool = False) -> Pool:
    """The ``role`` pool (only its intervention subset with ``intervention``), in file order."""
    rows = frame[frame["role"] == role]
    if intervention:
        rows = rows[rows["intervention"]]
    if rows.empty:
        raise ValueError(f"the pools hold no {role!r} sequences"
                         f"{' in the intervention subset' if intervention else ''}")  # fmt: skip
    ids = np.stack([compact(np.asarray(t), vocab) for t in rows["tokens"]])
    return Pool(torch.as_tensor(ids, dtype=torch.long), rows["seq_id"].tolist(),
                rows["domain"].tolist())  # fmt: skip


def gpt2_tokens(frame: pd.DataFrame, role: str, intervention: bool = False) -> np.ndarray:
    """(S, T) GPT-2 ids of a pool (what target selection reads: no model involved)."""
    rows = frame[frame["role"] == role]
    if intervention:
        rows = rows[rows["intervention"]]
    return np.stack([np.asarray(t) for t in rows["tokens"]])


def intervention_targets(
    frame: pd.DataFrame, targets_path: str | os.PathLike, vocab: np.ndarray
) -> tuple[Pool, pd.DataFrame, Targets]:
    """The intervention subset (model ids), the target registry's rows and its targets,
    refusing a registry whose rows name other sequences than the subset's (another pool)."""
    sub = pool(frame, "final", vocab, intervention=True)
    rows = read_table(targets_path, results.TARGETS.names).to_pandas()
    index = rows["seq_index"].to_numpy()
    if (
        (index < 0).any()
        or (index >= len(sub.seq_ids)).any()
        or [sub.seq_ids[i] for i in index] != rows["seq_id"].tolist()
    ):
        raise ValueError(f"{targets_path}: its sequences are not the pools' intervention subset "
                         "in order (rerun samoe_targets)")  # fmt: skip
    return sub, rows, as_targets(rows)
