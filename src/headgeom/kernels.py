"""The CPU kernel pin: one set of kernel paths on every x86-64 machine with AVX2, so a CPU
run's bytes do not depend on whether its machine also has AVX-512 (docs/methods.md §2.7).

Five libraries pick a code path for the CPU they find, each when it loads:

* torch's own vectorised kernels (layer norm, softmax, GELU, AdamW, reductions):
  ``ATEN_CPU_CAPABILITY``;
* MKL's BLAS and LAPACK (every float32 matmul of torch): ``MKL_CBWR``, its conditional
  numerical reproducibility, which also makes a result independent of its operands' memory
  alignment (what two forwards compared bit for bit need);
* oneDNN: ``ONEDNN_MAX_CPU_ISA``;
* the OpenBLAS that numpy and scipy each bundle (the QR of every Haar draw, every SVD of a
  subspace basis, scipy's L-BFGS-B): built for every CPU (DYNAMIC_ARCH), it runs its
  ``SkylakeX`` kernels on AVX-512 and its ``Haswell`` ones on AVX2, and the two give other
  bytes for the same QR: ``OPENBLAS_CORETYPE``;
* numpy's own SIMD loops (float64 ``exp``, ``log``, ``log1p``, ``expm1``, ``power`` and
  ``arctan`` have AVX-512 versions that round differently): ``NPY_ENABLE_CPU_FEATURES``.

Each is pinned to its AVX2 path, the widest that every x86-64 CPU of the last decade has
(Intel since Haswell, AMD since Zen). Pinning to the portable paths instead (torch's
``default``, MKL's ``COMPATIBLE``) doubles the demo's training time.

The workflow pins before any job starts (``workflow/heads/common.smk``) and the test session
before torch or numpy loads (``tests/conftest.py``); jobs inherit the variables, locally and
through Slurm, and every manifest records them (``headgeom.runtime.machine``). A library
whose variable the user has set is left as the user set it; ``HEADGEOM_KERNELS=native`` pins
nothing (each library's fastest path on this CPU).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, MutableMapping
from importlib import metadata

#: The variable that chooses the pin: "avx2" (the default where the CPU has it) or "native".
CHOICE = "HEADGEOM_KERNELS"
CHOICES = ("avx2", "native")
#: Each library's AVX2 path, by the variable that selects it. numpy's is by version
#: (:func:`numpy_avx2`).
AVX2_PIN = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
NUMPY_FEATURES = "NPY_ENABLE_CPU_FEATURES"
#: Variables a user may have set for the same library instead: that library is left alone
#: (numpy refuses to start with both of its variables set).
SAME_LIBRARY = {
    "ONEDNN_MAX_CPU_ISA": ("DNNL_MAX_CPU_ISA",),
    NUMPY_FEATURES: ("NPY_DISABLE_CPU_FEATURES",),
}
#: What the AVX2 paths execute: a CPU without both would stop on an illegal instruction.
AVX2_FLAGS = frozenset({"avx2", "fma"})
#: MKL's conditional numerical reproducibility: set (to any path, ``AUTO`` included), MKL's
#: results do not depend on memory alignment, so two forwards of the same numbers through
#: differently placed tensors agree bit for bit. Unset, they agree to rounding only.
CNR = "MKL_CBWR"


def numpy_avx2(version: str | None) -> str:
    """numpy's dispatch targets at the AVX2 level, in the names of ``version``: numpy 2.4
    groups them as the x86-64 level ``X86_V3``; earlier releases name each feature (and warn
    about a name they do not know, so each release gets its own)."""
    major, minor = (int(part) for part in (version or "0.0").split(".")[:2])
    if (major, minor) >= (2, 4):
        return "X86_V3"
    return "SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2"


def installed_numpy() -> str | None:
    """numpy's version from its metadata, without importing it (the pin precedes numpy)."""
    try:
        return metadata.version("numpy")
    except metadata.PackageNotFoundError:
        return None


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


def vector_width(flags: frozenset[str]) -> int | None:
    """The widest x86 vector registers the CPU has, in bits (512: AVX-512; 256: AVX/AVX2;
    128: SSE); None where ``flags`` name none of them (not x86, or no /proc/cpuinfo)."""
    for width, flag in ((512, "avx512f"), (256, "avx"), (128, "sse2")):
        if flag in flags:
            return width
    return None


def kernel_pin(
    choice: str, flags: frozenset[str], arch: str, numpy_version: str | None = None
) -> dict[str, str]:
    """The variables ``choice`` sets on a CPU with ``flags`` and architecture ``arch``:
    the AVX2 pin on x86-64 with AVX2 and FMA, nothing otherwise or for ``native``."""
    if choice not in CHOICES:
        raise ValueError(f"{CHOICE}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "native" or arch not in ("x86_64", "AMD64") or not AVX2_FLAGS <= flags:
        return {}
    return {**AVX2_PIN, NUMPY_FEATURES: numpy_avx2(numpy_version or installed_numpy())}


def pin_kernels(
    environ: MutableMapping[str, str] = os.environ, cpuinfo: str = "/proc/cpuinfo"
) -> dict[str, str]:
    """Set the pin's variables in ``environ`` where the user has set none for that library;
    return those it set. A library reads its variable when it loads: call this before torch
    and numpy are imported, or for processes started afterwards."""
    pin = kernel_pin(environ.get(CHOICE, "avx2"), cpu_flags(cpuinfo), platform.machine())
    user_set = {
        k for k in pin if k in environ or any(o in environ for o in SAME_LIBRARY.get(k, ()))
    }
    added = {k: v for k, v in pin.items() if k not in user_set}
    environ.update(added)
    return added


def alignment_independent(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether MKL runs in its reproducible mode here (:data:`CNR` set): what a comparison
    of two CPU forwards bit for bit needs."""
    return bool(environ.get(CNR))


def bitwise_requirement(environ: Mapping[str, str] = os.environ) -> str:
    """What a failed bit-for-bit comparison of two CPU forwards should tell the user about
    the setting it relies on (docs §2.7)."""
    if alignment_independent(environ):
        return (f"bitwise under {CNR}={environ[CNR]} (alignment-independent MKL): a real "
                "difference")  # fmt: skip
    return (
        f"bitwise equality of two forwards needs MKL's conditional numerical reproducibility, "
        f"which {CNR} turns on and the kernel pin sets (docs §2.7); {CNR} is unset here "
        f"({CHOICE}={environ.get(CHOICE, 'unset')}): unset {CHOICE}, or set {CNR}=AUTO to keep "
        "this CPU's own MKL path"
    )
