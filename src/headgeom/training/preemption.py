"""Preemption of a training job (docs §7.3): a cluster's warning signal ends training at the
next step boundary with the resumable state written, so the resubmitted job redoes nothing.

Slurm sends SIGTERM at a time limit or preemption (then SIGKILL after its grace time,
``KillWait``), and the signal a job asks for with ``--signal=USR1@<seconds>`` that long before
the limit. :func:`on_signals` turns either into a flag the training loop reads after every
update; the loop then writes its state and raises :class:`Preempted`, and ``heads/stages/train.py``
exits with :data:`EXIT_PREEMPTED`, which Snakemake treats as a failure and resubmits
(``retries`` in the Slurm profile) or the user reruns.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The signals that stop training at a step boundary.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Exit status of a preempted job: "temporary failure, try again" (sysexits.h EX_TEMPFAIL).
EXIT_PREEMPTED = os.EX_TEMPFAIL


class Preempted(RuntimeError):
    """Training stopped after update ``step`` on ``signal_name``; its state is at ``state``."""

    def __init__(self, step: int, signal_name: str, state: Path | None) -> None:
        where = f"resumable state at {state}" if state else "no resumable state (no --resume-dir)"
        super().__init__(
            f"{signal_name} received: stopped after step {step}, {where}; "
            "rerun the job to continue from it"
        )
        self.step, self.signal_name, self.state = step, signal_name, state


class StopFlag:
    """The name of the first stop signal received (None until one arrives); call it to read."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self) -> str | None:
        return self.signal

    def _handle(self, signum: int, frame) -> None:
        self.signal = self.signal or signal.Signals(signum).name


@contextmanager
def on_signals(signals=SIGNALS) -> Iterator[StopFlag]:
    """While inside, ``signals`` set the yielded :class:`StopFlag` instead of ending the
    process; the previous handlers come back on exit. Call from the main thread."""
    flag = StopFlag()
    previous = {sig: signal.signal(sig, flag._handle) for sig in signals}
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
