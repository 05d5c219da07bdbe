"""The error of every model import (hf-gpt2, tl-gpt2): its own module, so that the format modules
(``importing`` for hf-gpt2, ``importing_tl`` for tl-gpt2) import it without a cycle."""

from __future__ import annotations


class ModelImportError(ValueError):
    """The directory cannot be imported as a GPT-2 model."""
