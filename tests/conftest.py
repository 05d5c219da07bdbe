"""Shared test set-up."""

import os

# Two cores shared with a running suite: one BLAS/OpenMP thread and one torch intra-op
# thread per test process keep small problems fast (multi-threaded OpenBLAS on tiny
# matrices is ~100x slower here) and results identical to single-threaded workflow jobs.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

torch.set_num_threads(1)
