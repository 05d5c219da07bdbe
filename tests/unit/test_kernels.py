"""The CPU kernel pin: where it applies, that it never overrides the user, and that a bad
choice is named."""

from __future__ import annotations

import platform

import pytest

from headgeom import kernels
from headgeom.kernels import AVX2_PIN, kernel_pin, pin_kernels

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}


def test_the_pin_is_the_avx2_path_of_each_library():
    assert kernel_pin("avx2", AVX2, "x86_64") == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    }
    # an AVX-512 machine is brought down to the same paths
    assert kernel_pin("avx2", AVX512, "x86_64") == kernel_pin("avx2", AVX2, "x86_64")


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
    assert added == {k: v for k, v in AVX2_PIN.items() if k != "MKL_CBWR"}
    assert env == {**AVX2_PIN, "MKL_CBWR": "COMPATIBLE"}
    native = {"HEADGEOM_KERNELS": "native"}
    assert pin_kernels(native, str(info)) == {} and native == {"HEADGEOM_KERNELS": "native"}


def test_cpuinfo_values_are_those_of_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: avx2\n\n"
                    "processor\t: 1\nmodel name\t: Other\n")  # fmt: skip
    assert kernels.cpuinfo_value("model name", str(info)) == "AMD EPYC 7B13"
    assert kernels.cpuinfo_value("bogomips", str(info)) is None
    assert kernels.cpuinfo_value("model name", str(tmp_path / "absent")) is None
