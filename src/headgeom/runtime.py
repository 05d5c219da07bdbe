"""Where a stage runs: its CPU threads, its torch device and the machine record.

A Snakemake job is given ``threads``; a stage must not run more than that, or
``snakemake --cores all`` oversubscribes the machine. :func:`set_threads` is called by every
stage script before any torch (or tokenizer) work.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata as importlib_metadata

import numpy as np
import torch
from threadpoolctl import threadpool_info

from headgeom.kernels import cpu_flags, cpuinfo_value, vector_width

#: Packages whose versions can change a result; recorded in every manifest.
TRACKED_PACKAGES = ("torch", "numpy", "pyarrow", "pandas", "safetensors", "tokenizers", "scipy")
#: Environment variables that choose CPU kernels or thread pools (recorded when set).
KERNEL_VARIABLES = (
    "HEADGEOM_KERNELS",  # headgeom.kernels: the pin that sets the variables of its libraries
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_NUM_THREADS",
    "OMP_NUM_THREADS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_NUM_THREADS",
    "NPY_ENABLE_CPU_FEATURES",
    "NPY_DISABLE_CPU_FEATURES",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "KMP_DETERMINISTIC_REDUCTION",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
)


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


def analysis_device(name: str, flag: str = "--device") -> torch.device:
    """The device an analysis runs on: ``auto`` (CUDA when present, :func:`pick_device`),
    ``cpu`` or ``cuda[:N]``; anything else, or a CUDA device torch cannot see, is refused
    with a ``ValueError`` naming ``flag``. On CUDA the matmuls stay exact fp32 (TF32 off, as
    the validation loss and benchmarks/gpu_check.py's analysis sections run): the analyses'
    float32 checks have float32 tolerances. On the CPU nothing else is touched."""
    try:
        device = pick_device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag} {name!r}: not a device here; use {flag} auto, cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{flag} {name}: torch sees no CUDA device on this machine (torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda}); use {flag} auto (CUDA "
                f"when present, else the CPU) or {flag} cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{flag} {name}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s)")  # fmt: skip
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        if device.index is None:  # recorded as cuda:N
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's parameters (the first one's; the CPU when it has none)."""
    first = next(module.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def synchronize(device: torch.device | None) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously): before reading a
    wall clock. A no-op on the CPU (and for None)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    return cpuinfo_value("model name") or platform.processor() or platform.machine()


def _build_line(config: str, pattern: str) -> str | None:
    match = re.search(pattern, config)
    return match[1].strip() if match else None


def numpy_simd() -> list[str]:
    """numpy's SIMD dispatch targets in use in this process (those the build has, the CPU
    runs and ``NPY_ENABLE_CPU_FEATURES``/``NPY_DISABLE_CPU_FEATURES`` leave on), e.g.
    ``["X86_V3"]`` under the pin and ``["X86_V3", "X86_V4", "AVX512_ICL"]`` without it on an
    AVX-512 CPU."""
    core = getattr(np, "_core", None) or np.core  # numpy 1.x: numpy.core
    umath = core._multiarray_umath
    return [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]


def blas_libraries() -> list[dict]:
    """The BLAS libraries numpy and scipy load, and the kernels each runs: library, version,
    the core type a DYNAMIC_ARCH OpenBLAS chose for this CPU (``Haswell``, ``SkylakeX``, …),
    threading layer and threads (read by threadpoolctl from the loaded libraries). scipy's
    is loaded here if no stage has yet, so every record names both."""
    import scipy.linalg  # noqa: F401 (0.4 s, only manifests need it)

    libraries = []
    for lib in threadpool_info():
        if lib.get("user_api") != "blas":
            continue
        folder = os.path.basename(os.path.dirname(lib["filepath"]))
        libraries.append({
            "package": folder.removesuffix(".libs") if folder.endswith(".libs") else folder,
            "library": lib["internal_api"],
            "version": lib.get("version"),
            "core": lib.get("architecture"),
            "threading": lib.get("threading_layer"),
            "threads": lib.get("num_threads"),
        })  # fmt: skip
    return sorted(libraries, key=lambda lib: (lib["package"], lib["library"]))


def machine() -> dict:
    """What picks the kernels a run's arithmetic went through, so two runs' bytes can be
    compared knowing whether the machines could agree: CPU model, vendor, vector width and
    core count, torch's vector capability (``get_cpu_capability``: DEFAULT, AVX2, AVX512,
    ...), torch's BLAS and oneDNN builds, numpy's SIMD targets and numpy's and scipy's BLAS
    with the kernels they chose, the thread pools, the GPU, and every kernel-selecting
    environment variable that is set."""
    config = torch.__config__.show()
    record = {
        "cpu": _cpu_model(),
        "cpu_vendor": cpuinfo_value("vendor_id"),
        "cpu_vector_width": vector_width(cpu_flags()),
        "cpu_count": os.cpu_count(),
        "arch": platform.machine(),
        "os": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": _build_line(config, r"BLAS_INFO=([^,\n]+)"),
        "mkl": _build_line(config, r"Math Kernel Library Version ([^\n]+?) for"),
        "onednn": _build_line(config, r"MKL-DNN (v[^\s]+)"),
        "openmp": _build_line(config, r"OpenMP (\d+)"),
        "numpy_simd": numpy_simd(),
        "blas_libraries": blas_libraries(),
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "kernel_variables": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ},
    }
    return record


def environment() -> dict:
    """Interpreter, key package versions, the accelerator runtime and the :func:`machine`:
    the ``environment`` record of every manifest."""
    env: dict = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            env[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            env[name] = None
    env["cuda"] = torch.version.cuda
    env["machine"] = machine()
    return env
