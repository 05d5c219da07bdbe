"""Optional dependencies: the packages only some studies need, the pyproject extra that
installs them, and the one error a missing one raises.

The default study (embedded corpus, toy models) needs neither ``datasets`` nor
``transformers``, so ``pip install -e .`` leaves them out (a fifth of the install's time).
A corpus read from the Hub or local files and the SA-MoE paper study's Hub models and
tokenizers need them (the ``transformers`` export writes its directory without it);
``pip install -e ".[hf]"`` adds both (``[dev]`` too).
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: module -> the pyproject extra that installs it
EXTRAS = {"datasets": "hf", "transformers": "hf", "gguf": "hf"}


class MissingExtra(ImportError):
    """An optional package a configured feature needs is not installed."""


def install_hint(module: str) -> str:
    extra = EXTRAS[module]
    return f'pip install -e ".[{extra}]" -c requirements/lock.txt'


def require(module: str, needed_for: str) -> ModuleType:
    """Import ``module`` (a key of :data:`EXTRAS`), or raise :class:`MissingExtra` naming
    what needed it and the command that installs it. An import error inside an installed
    package (one of its own dependencies missing) is raised as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise MissingExtra(
            f"{needed_for} needs {module}, which is not installed (it is in the optional "
            f"'{EXTRAS[module]}' extra, not in the default install): {install_hint(module)}"
        ) from None
