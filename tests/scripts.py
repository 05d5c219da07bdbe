"""Import a stage script ``src/<name>.py`` as a module, so tests call its ``main(argv)``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def load_script(name: str):
    # A private module name: `leakage` or `lanes` would otherwise read as library modules.
    spec = importlib.util.spec_from_file_location(f"_script_{name}", SRC / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
