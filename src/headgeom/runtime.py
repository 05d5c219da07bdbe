"""Where a stage runs: its CPU threads and its torch device.

A Snakemake job is given ``threads``; a stage must not run more than that, or
``snakemake --cores all`` oversubscribes the machine. :func:`set_threads` is called by every
stage script before any torch (or tokenizer) work.
"""

from __future__ import annotations

import os
import sys

import torch


def set_threads(threads: int) -> int:
    """Cap torch's intra-op and inter-op pools and the Rust tokenizer pool at ``threads``.

    The tokenizer reads ``RAYON_NUM_THREADS`` when it first encodes. torch allows setting
    the inter-op pool only before its first parallel work and only once per process (a
    test calls several ``main`` in one process), so a refused change is left as it is; the
    intra-op pool, which does the work, is always set. Returns the thread count.
    """
    threads = int(threads)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # already set, or parallel work has started
            pass
    # in the job's log, so a run shows that no job used more threads than it was given
    print(
        f"torch threads: {torch.get_num_threads()} intra-op, "
        f"{torch.get_num_interop_threads()} inter-op (given {threads})",
        file=sys.stderr,
    )
    return threads


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when present, else CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
