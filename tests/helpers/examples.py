"""Example pairs and task files the unit tests share."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.helpers.models import N_VOCAB


def random_pairs(n: int, lengths: tuple[int, ...], seed: int = 1):
    rng = np.random.default_rng(seed)
    clean, ref = [], []
    for i in range(n):
        T = lengths[i % len(lengths)]
        x = rng.integers(0, N_VOCAB, T)
        y = x.copy()
        t = int(rng.integers(0, T - 1))
        y[t] = (x[t] + 1 + rng.integers(0, N_VOCAB - 1)) % N_VOCAB
        clean.append(x)
        ref.append(y)
    correct = rng.integers(0, N_VOCAB, n)
    incorrect = (correct + 1 + rng.integers(0, N_VOCAB - 1, n)) % N_VOCAB
    return clean, ref, correct, incorrect


LABEL = pa.dictionary(pa.int32(), pa.string())
TASK_SCHEMA = pa.schema(
    [
        ("example_id", pa.int32()),
        ("split", LABEL),
        ("condition", LABEL),
        ("lexical_group", LABEL),
        ("clean_ids", pa.list_(pa.int32())),
        ("ref_ids", pa.list_(pa.int32())),
        ("diff_position", pa.int32()),
        ("correct_id", pa.int32()),
        ("incorrect_id", pa.int32()),
    ]
)
