"""The dependency lock (requirements/lock.txt) is what pyproject.toml, the README commands and
the conda environment use, and pyproject.toml bounds every range below the next major."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [
    req
    for req in [Requirement(r) for r in PYPROJECT["dependencies"]]
    + [Requirement(r) for extra in PYPROJECT["optional-dependencies"].values() for r in extra]
    if req.name != PYPROJECT["name"]  # `headgeom[hf]` in [dev]: our own extra, not a package
]


def pins(path: Path) -> dict[str, Version]:
    """name -> version of every `name==version` line of a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if match:
            out[canonicalize_name(match[1])] = Version(match[2])
    return out


LOCK = pins(ROOT / "requirements" / "lock.txt")
CUDA = pins(ROOT / "requirements" / "cuda.txt")


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_every_range_has_an_upper_bound_below_the_next_major(req):
    uppers = [s for s in req.specifier if s.operator in ("<", "<=", "==", "~=")]
    assert uppers, f"pyproject.toml: {req} has no upper bound"
    # the bound admits no release of the major after the locked one (0.x: nothing from 1.0)
    pinned = LOCK[canonicalize_name(req.name)]
    nxt = Version(f"{pinned.major + 1}")
    assert not req.specifier.contains(nxt, prereleases=True), (
        f"pyproject.toml: {req} admits {nxt}, the next major after the locked {pinned}"
    )


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_the_lock_pins_every_requirement_inside_its_range(req):
    name = canonicalize_name(req.name)
    assert name in LOCK, f"requirements/lock.txt does not pin {req.name}"
    assert req.specifier.contains(LOCK[name], prereleases=True), (
        f"requirements/lock.txt pins {req.name}=={LOCK[name]}, outside pyproject's {req}"
    )


def test_torch_is_pinned_without_a_build_label():
    # `torch==2.13.0` takes the CPU wheel where pip is given one, PyPI's build elsewhere
    assert LOCK["torch"].local is None
    assert not set(CUDA) & set(LOCK), "cuda.txt adds packages only; it repins none"


def test_the_conda_environment_uses_the_locked_versions():
    env = yaml.safe_load((ROOT / "envs" / "headgeom.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    env_pins = {canonicalize_name(n): Version(v) for n, v in (p.split("==") for p in pip)}
    locked = {**LOCK, **CUDA}
    assert {n: v for n, v in env_pins.items() if locked.get(n) != v} == {}
    runtime = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["dependencies"]}
    assert runtime <= set(env_pins), f"missing from envs/headgeom.yaml: {runtime - set(env_pins)}"


def test_both_readme_commands_install_with_the_lock():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("pip install -e ")]
    assert len(commands) >= 2
    for command in commands:
        assert "-c requirements/lock.txt" in command, command
