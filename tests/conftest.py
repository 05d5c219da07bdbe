"""Shared test set-up."""

import os
import sys

from headgeom import kernels

# The workflow's CPU kernel pin (headgeom.kernels), here before torch or numpy loads: each
# library reads its variable once, when it loads, so the tests run on the kernel paths the
# workflow's jobs run on. HEADGEOM_KERNELS=native (or a library's own variable) is honoured.
_LOADED = sorted(m for m in ("torch", "numpy", "scipy") if m in sys.modules)
_PINNED = kernels.pin_kernels()
if _PINNED and _LOADED:
    raise RuntimeError(
        f"tests/conftest.py: {', '.join(_LOADED)} loaded before the kernel pin could be set "
        f"({', '.join(_PINNED)}); a pytest plugin imports it: set the variables in the shell "
        "or disable that plugin"
    )

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

# scipy's OpenBLAS loads now, under the pin, and not later inside a test that has unset the
# pin's variables (to test the machine record)
import scipy.linalg  # noqa: E402, F401

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


def pytest_runtest_setup(item):
    """A test marked ``kernel_pin`` compares two CPU forwards bit for bit, which MKL
    guarantees only in its reproducible mode (``MKL_CBWR``, set by the pin): without it the
    test is skipped, saying which variable it needs."""
    if item.get_closest_marker("kernel_pin") and not kernels.alignment_independent():
        pytest.skip(f"bitwise forwards need {kernels.CNR} (the kernel pin, docs §2.7); unset here")


@pytest.fixture(autouse=True)
def _fixed_global_draws():
    """Every test sees the same global draws (torch.randn, np.random.*, random.*) whatever
    ran before it, so no outcome depends on test order or on luck; tests that need other
    draws make their own seeded generators."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
