"""Shared test set-up."""

import os

# Two cores shared with a running suite: one BLAS/OpenMP thread and one torch intra-op
# thread per test process keep small problems fast (multi-threaded OpenBLAS on tiny
# matrices is ~100x slower here) and results identical to single-threaded workflow jobs.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import random  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e runs the real DAG: marked ``e2e`` like the unit tests that
    start Snakemake or training in a subprocess, so ``-m "not e2e"`` runs the fast tier."""
    for item in items:
        if E2E in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _fixed_global_draws():
    """Every test sees the same global draws (torch.randn, np.random.*, random.*) whatever
    ran before it, so no outcome depends on test order or on luck; tests that need other
    draws make their own seeded generators."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
