"""The CPU kernel pin: where it applies, that it never overrides the user, and that a bad
choice is named."""

from __future__ import annotations

import os
import platform

import pytest

from headgeom import kernels
from headgeom.kernels import AVX2_PIN, kernel_pin, pin_kernels

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}


def test_the_pin_is_the_avx2_path_of_each_library():
    assert kernel_pin("avx2", AVX2, "x86_64", numpy_version="2.4.6") == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_ENABLE_CPU_FEATURES": "X86_V3",
    }
    # an AVX-512 machine is brought down to the same paths
    assert kernel_pin("avx2", AVX512, "x86_64") == kernel_pin("avx2", AVX2, "x86_64")


@pytest.mark.parametrize(
    "version, features",
    [
        ("2.4.6", "X86_V3"),  # numpy 2.4 names the x86-64 levels
        ("3.0.0", "X86_V3"),
        ("2.3.5", "SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2"),  # each feature by name
        ("1.26.4", "SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2"),
        ("2.5.0rc1", "X86_V3"),
    ],
)
def test_numpys_avx2_level_is_named_as_its_release_names_it(version, features):
    assert kernels.numpy_avx2(version) == features


@pytest.mark.skipif(platform.machine() != "x86_64" or not kernels.AVX2_FLAGS <= kernels.cpu_flags(),
                    reason="numpy's x86 dispatch targets on an AVX2 CPU")  # fmt: skip
def test_numpy_takes_its_avx2_level_without_a_warning():
    """In a fresh process numpy runs exactly its AVX2-level targets under the pin's value (a
    name numpy does not know would warn, and be ignored, at import)."""
    import subprocess
    import sys

    env = {**os.environ, "NPY_ENABLE_CPU_FEATURES": kernels.numpy_avx2(kernels.installed_numpy())}
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    code = ("import numpy as np; from headgeom.runtime import numpy_simd; "
            "print(' '.join(numpy_simd()))")  # fmt: skip
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    enabled = out.stdout.split()
    assert enabled and not any("512" in t or t == "X86_V4" for t in enabled), enabled


@pytest.mark.parametrize(
    "choice, flags, arch",
    [
        ("native", AVX512, "x86_64"),  # the user asks for the fastest paths
        ("avx2", frozenset({"sse4_2", "avx"}), "x86_64"),  # AVX2 code would not run
        ("avx2", AVX2 - {"fma"}, "x86_64"),
        ("avx2", frozenset({"asimd"}), "aarch64"),  # not x86: nothing to pin
    ],
)
def test_no_pin(choice, flags, arch):
    assert kernel_pin(choice, flags, arch) == {}


def test_a_bad_choice_is_named():
    expected = r"HEADGEOM_KERNELS='avx512': expected one of avx2, native"
    with pytest.raises(ValueError, match=expected):
        kernel_pin("avx512", AVX2, "x86_64")


def test_cpu_flags_come_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test\nflags\t\t: fpu sse avx2 fma\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")  # fmt: skip
    assert kernels.cpu_flags(str(info)) == {"fpu", "sse", "avx2", "fma"}
    assert kernels.cpu_flags(str(tmp_path / "absent")) == frozenset()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the pin applies to x86-64")
def test_pin_sets_only_what_the_user_left_unset(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t: avx2 fma\n")
    env = {"MKL_CBWR": "COMPATIBLE"}
    added = pin_kernels(env, str(info))
    numpy_level = {"NPY_ENABLE_CPU_FEATURES": kernels.numpy_avx2(kernels.installed_numpy())}
    assert added == {k: v for k, v in AVX2_PIN.items() if k != "MKL_CBWR"} | numpy_level
    assert env == {**AVX2_PIN, "MKL_CBWR": "COMPATIBLE", **numpy_level}
    native = {"HEADGEOM_KERNELS": "native"}
    assert pin_kernels(native, str(info)) == {} and native == {"HEADGEOM_KERNELS": "native"}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the pin applies to x86-64")
@pytest.mark.parametrize(
    "user, left_alone",
    [
        ({"NPY_DISABLE_CPU_FEATURES": "X86_V4"}, "NPY_ENABLE_CPU_FEATURES"),  # numpy: never both
        ({"DNNL_MAX_CPU_ISA": "SSE41"}, "ONEDNN_MAX_CPU_ISA"),  # oneDNN's older name
        ({"OPENBLAS_CORETYPE": "SkylakeX"}, "OPENBLAS_CORETYPE"),
    ],
)
def test_a_library_the_user_has_set_is_left_alone(tmp_path, user, left_alone):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t: avx2 fma avx512f\n")
    env = dict(user)
    added = pin_kernels(env, str(info))
    assert left_alone not in added and env.items() >= user.items()
    assert {"ATEN_CPU_CAPABILITY", "MKL_CBWR"} <= added.keys()


def test_bitwise_comparisons_name_the_setting_they_rely_on():
    assert not kernels.alignment_independent({})
    assert kernels.alignment_independent({"MKL_CBWR": "AUTO"})
    off = kernels.bitwise_requirement({"HEADGEOM_KERNELS": "native"})
    assert "MKL_CBWR is unset here (HEADGEOM_KERNELS=native)" in off and "MKL_CBWR=AUTO" in off
    assert "MKL_CBWR=AVX2" in kernels.bitwise_requirement({"MKL_CBWR": "AVX2"})


@pytest.mark.parametrize(
    "flags, width",
    [(AVX512, 512), (AVX2, 256), (frozenset({"sse2"}), 128), (frozenset({"asimd"}), None)],
)
def test_the_vector_width_is_the_widest_register_the_cpu_has(flags, width):
    assert kernels.vector_width(flags) == width


def test_the_test_session_runs_under_the_workflows_pin():
    """tests/conftest.py pins before torch loads: torch reports the capability the pin asks
    for (AVX2 on any AVX2 CPU), unless the caller chose the kernels."""
    import torch

    want = os.environ.get("ATEN_CPU_CAPABILITY")
    pinnable = platform.machine() == "x86_64" and kernels.AVX2_FLAGS <= kernels.cpu_flags()
    if pinnable and os.environ.get("HEADGEOM_KERNELS") != "native":
        assert want, "the session has no ATEN_CPU_CAPABILITY: the pin did not run"
    if want in ("avx2", "default"):
        assert torch.backends.cpu.get_cpu_capability() == want.upper()


def test_cpuinfo_values_are_those_of_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: avx2\n\n"
                    "processor\t: 1\nmodel name\t: Other\n")  # fmt: skip
    assert kernels.cpuinfo_value("model name", str(info)) == "AMD EPYC 7B13"
    assert kernels.cpuinfo_value("bogomips", str(info)) is None
    assert kernels.cpuinfo_value("model name", str(tmp_path / "absent")) is None
