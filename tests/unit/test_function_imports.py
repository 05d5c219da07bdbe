"""An import inside a function of src/ says on its line why it is not at the top of its module
(an optional dependency, or start-up cost the workflow or a job avoids: docs/extending.md);
every other import is at the top, where the layer contract (.importlinter) sees it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def function_level_imports(text: str) -> list[tuple[int, str]]:
    """(line number, first line) of every import inside a function of the module ``text``."""
    lines = text.splitlines()
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child.lineno, lines[child.lineno - 1]))
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            walk(child, in_function or inner)

    walk(ast.parse(text), False)
    return found


def without_reason(text: str) -> list[int]:
    """Lines of the function-level imports of ``text`` with no comment on their first line."""
    return [n for n, line in function_level_imports(text) if "#" not in line]


def test_every_function_level_import_says_why():
    missing = [f"{path.relative_to(SRC)}:{n}" for path in sorted(SRC.rglob("*.py"))
               for n in without_reason(path.read_text())]  # fmt: skip
    assert missing == [], "move the import to the top, or say on its line why it is here"


def test_an_import_without_its_reason_is_named():
    text = (
        "import os\n"  # the top: not counted
        "\n"
        "def f():\n"
        "    import json\n"  # 4: no reason
        "    from x import (\n"  # 5: the reason must be on the first line
        "        y,  # a comment elsewhere does not count\n"
        "    )\n"
        "    import re  # optional: a reason\n"  # 8
        "    return lambda: __import__('os')\n"
    )
    assert [n for n, _ in function_level_imports(text)] == [4, 5, 8]
    assert without_reason(text) == [4, 5]
