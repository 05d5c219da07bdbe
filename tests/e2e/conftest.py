"""Helpers that run the real Snakemake DAG in a temporary working directory."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LINKED = ("Snakefile", "workflow", "src", "envs")


def make_workdir(root: Path, config: dict) -> Path:
    """A working directory that shares the repository's workflow and scripts."""
    root.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config.yaml", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=1800)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Job counts per rule from a dry run's 'Job stats' table ({} when nothing to do)."""
    text = proc.stdout + proc.stderr
    counts: dict[str, int] = {}
    block = text.split("Job stats:", 1)
    if len(block) < 2:
        return counts
    for line in block[1].splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="session")
def micro_config() -> dict:
    return yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text())


@pytest.fixture(scope="session")
def finished_micro(tmp_path_factory, micro_config) -> Path:
    """The micro study run to the end once per session (about two minutes on 2 cores). Tests
    never touch it: each module works on its own :func:`copy_of` it."""
    work = make_workdir(tmp_path_factory.mktemp("micro") / "w", micro_config)
    snakemake(work, "--cores", "2")
    return work


def copy_of(work: Path, dest: Path) -> Path:
    """A copy of a working directory that Snakemake sees as the same finished run: file
    mtimes and its .snakemake records are kept, the links to the repository stay links."""
    shutil.copytree(work, dest, symlinks=True)
    return dest
