"""The CPU kernel pin: one set of kernel paths on every x86-64 machine with AVX2, so a CPU
run's bytes do not depend on whether its machine also has AVX-512 (docs/methods.md §2.7).

Three libraries pick a code path for the CPU they find: torch's own vectorised kernels
(layer norm, softmax, GELU, AdamW, reductions: ``ATEN_CPU_CAPABILITY``), MKL's BLAS (every
float32 matmul: ``MKL_CBWR``, its conditional numerical reproducibility) and oneDNN
(``ONEDNN_MAX_CPU_ISA``). Each is pinned to its AVX2 path, the widest that every x86-64 CPU
of the last decade has (Intel since Haswell, AMD since Zen). Pinning to the portable paths
instead (torch's ``default``, MKL's ``COMPATIBLE``) doubles the demo's training time.

The workflow pins before any job starts (``workflow/rules/common.smk``); the jobs inherit
the variables, locally and through Slurm, and every manifest records them
(``headgeom.runtime.machine``). A variable the user has set is left as it is;
``HEADGEOM_KERNELS=native`` pins nothing (each library's fastest path on this CPU).
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

#: The variable that chooses the pin: "avx2" (the default where the CPU has it) or "native".
CHOICE = "HEADGEOM_KERNELS"
CHOICES = ("avx2", "native")
#: Each library's AVX2 path.
AVX2_PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
#: What the AVX2 paths execute: a CPU without both would stop on an illegal instruction.
AVX2_FLAGS = frozenset({"avx2", "fma"})


def cpuinfo_value(key: str, cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The value of ``key`` for the first CPU in ``cpuinfo`` (None off Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the first CPU in ``cpuinfo`` (empty off Linux)."""
    return frozenset((cpuinfo_value("flags", cpuinfo) or "").split())


def kernel_pin(choice: str, flags: frozenset[str], arch: str) -> dict[str, str]:
    """The variables ``choice`` sets on a CPU with ``flags`` and architecture ``arch``:
    the AVX2 pin on x86-64 with AVX2 and FMA, nothing otherwise or for ``native``."""
    if choice not in CHOICES:
        raise ValueError(f"{CHOICE}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "native" or arch not in ("x86_64", "AMD64") or not AVX2_FLAGS <= flags:
        return {}
    return dict(AVX2_PIN)


def pin_kernels(
    environ: MutableMapping[str, str] = os.environ, cpuinfo: str = "/proc/cpuinfo"
) -> dict[str, str]:
    """Set the pin's variables in ``environ`` where unset; return those it set."""
    pin = kernel_pin(environ.get(CHOICE, "avx2"), cpu_flags(cpuinfo), platform.machine())
    added = {k: v for k, v in pin.items() if k not in environ}
    environ.update(added)
    return added
