"""The layers of headgeom only point down (.importlinter, checked by import-linter): the
contracts hold (the core below the two study wings, each wing's own layers, no stage script
importing another, no import cycle), and an import that goes up, across wings or round in a
cycle breaks them, a type-only one included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT), "--config", str(REPO / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, env=env, cwd=REPO)  # fmt: skip


def test_the_layers_only_point_down():
    done = lint(REPO / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    for contract in (
        "Layers only point down",
        "The head-geometry wing's layers only point down",
        "The SA-MoE wing's layers only point down",
        "A stage script imports no other stage script",
        "No import cycles",
    ):
        assert f"{contract} KEPT" in done.stdout, contract  # fmt: skip


def _with(tmp_path, module: str, line: str) -> subprocess.CompletedProcess:
    """The contracts over a copy of the library with ``line`` added to ``module``."""
    shutil.copytree(REPO / "src" / "headgeom", tmp_path / "headgeom")
    path = tmp_path / "headgeom" / module
    path.write_text(path.read_text() + line)
    return lint(tmp_path)


def test_an_import_from_a_layer_above_breaks_the_contract(tmp_path):
    # the results contract (the core) asking the head-geometry study (a wing) for its tasks
    done = _with(tmp_path, "results.py", "\nfrom headgeom.heads.study import Study  # noqa\n")
    assert done.returncode == 1, done.stdout
    assert "Layers only point down BROKEN" in done.stdout
    assert "headgeom.results -> headgeom.heads.study" in done.stdout


def test_a_type_only_import_across_wings_breaks_the_contract(tmp_path):
    line = (
        "\nfrom typing import TYPE_CHECKING  # noqa\nif TYPE_CHECKING:\n"
        "    from headgeom.heads.study import Study  # noqa\n"
    )
    done = _with(tmp_path, "samoe/study.py", line)
    assert done.returncode == 1, done.stdout
    assert "Layers only point down BROKEN" in done.stdout
    assert "headgeom.samoe.study -> headgeom.heads.study" in done.stdout


def test_a_cycle_within_a_layer_breaks_the_contract(tmp_path):
    # the comparison's context asking the comparison (which imports it) for a name
    line = (
        "\nfrom typing import TYPE_CHECKING  # noqa\nif TYPE_CHECKING:\n"
        "    from headgeom.heads.paper.comparison import Reference  # noqa\n"
    )
    done = _with(tmp_path, "heads/paper/context.py", line)
    assert done.returncode == 1, done.stdout
    assert "No import cycles BROKEN" in done.stdout
