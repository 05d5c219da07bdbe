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

TESTS = Path(__file__).resolve().parent
#: Folders whose every test runs the real DAG (tests/e2e) or the DAG through Slurm.
E2E_DIRS = (TESTS / "e2e", TESTS / "slurm")


def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e and tests/slurm, and every ``slow`` test, runs the real DAG:
    marked ``e2e`` like the unit tests that start Snakemake or training in a subprocess, so
    ``-m "not e2e"`` (which replaces the default ``-m``) is the fast tier and nothing more."""
    for item in items:
        parents = Path(str(item.fspath)).resolve().parents
        if any(d in parents for d in E2E_DIRS) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _fixed_global_draws():
    """Every test sees the same global draws (torch.randn, np.random.*, random.*) whatever
    ran before it, so no outcome depends on test order or on luck; tests that need other
    draws make their own seeded generators."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
