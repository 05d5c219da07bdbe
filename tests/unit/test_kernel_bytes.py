"""The same bytes on any x86-64 CPU with AVX2 (docs §2.7): every numpy/scipy linear-algebra
step on the demos' paths (tests/helpers/kernel_bytes.py: the Haar draws of every geometry,
the subspace SVDs, N_eff's float64 exp, the bootstrap GEMM, the SA-MoE probes' L-BFGS-B,
SVD and QR), each run in a fresh process, since the libraries read their kernel variables
when they load.

A process under the pin as the workflow sets it (``headgeom.kernels.pin_kernels`` on the
environment a job inherits) must give the bytes of a process on an AVX2-only machine, whose
libraries pick their kernels by themselves: OpenBLAS its ``Zen`` (AMD EPYC Zen 2/3) or
``Haswell`` (Intel) core, numpy its AVX2 level. On an AVX-512 CPU the libraries' own picks
(OpenBLAS ``SkylakeX``, numpy ``X86_V4``) give other bytes, which the last test shows, so
the first one can fail there.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from headgeom import kernels

ROOT = Path(__file__).resolve().parents[2]
FLAGS = kernels.cpu_flags()
AVX2_CPU = platform.machine() == "x86_64" and kernels.AVX2_FLAGS <= FLAGS
pytestmark = pytest.mark.skipif(not AVX2_CPU, reason="the pin applies to x86-64 CPUs with AVX2")
#: Every variable a pin or a user could have set for numpy's and scipy's libraries.
BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "NPY_ENABLE_CPU_FEATURES", "NPY_DISABLE_CPU_FEATURES")


def job_environment(**settings: str) -> dict[str, str]:
    """The environment a workflow job would inherit from this shell with ``settings`` (a
    user's own kernel variables, or HEADGEOM_KERNELS) in place of the session's."""
    env = {k: v for k, v in os.environ.items() if k not in (*BLAS_VARIABLES, kernels.CHOICE)}
    env.update(settings)
    kernels.pin_kernels(env)
    return env


def step_bytes(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "tests.helpers.kernel_bytes"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    assert a.keys() == b.keys()
    return sorted(k for k in a if a[k] != b[k])


@pytest.fixture(scope="module")
def pinned() -> dict[str, str]:
    return step_bytes(job_environment())


@pytest.mark.parametrize("core", ["Zen", "Haswell"])
def test_the_pinned_bytes_are_those_of_an_avx2_only_machine(pinned, core):
    avx2_only = job_environment(
        OPENBLAS_CORETYPE=core,
        NPY_ENABLE_CPU_FEATURES=kernels.numpy_avx2(kernels.installed_numpy()),
    )
    assert differing(pinned, step_bytes(avx2_only)) == []


@pytest.mark.skipif("avx512f" not in FLAGS, reason="only an AVX-512 CPU picks other kernels")
def test_without_the_pin_an_avx512_cpu_gives_other_bytes(pinned):
    """What the pin is for: this CPU's own picks change the Haar draws, the SVDs, the
    probes and N_eff (so the test above can fail here)."""
    native = step_bytes(job_environment(HEADGEOM_KERNELS="native"))
    changed = differing(pinned, native)
    assert "init write-rotated-s42" in changed and "probe fit" in changed, changed
