"""The layers of headgeom only point down (.importlinter, checked by import-linter): the
contract holds, and a module that imports from a layer above its own breaks it."""

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
    assert "Layers only point down KEPT" in done.stdout


def test_an_import_from_a_layer_above_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "src" / "headgeom", tmp_path / "headgeom")
    results = tmp_path / "headgeom" / "results.py"
    # the results contract (a low layer) asking the study (a high one) for its tasks
    results.write_text(results.read_text() + "\nfrom headgeom.study import Study  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Layers only point down BROKEN" in done.stdout
    assert "headgeom.results -> headgeom.study" in done.stdout
