"""No comment, docstring, schema description or heading points at a ticket number: the code
says what it does and cites the docs section (``docs §10.6``) it implements, so that a reader
finds the paper section without the project's history."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The folders and files walked, relative to the repository root.
SCOPE = (
    "src",
    "workflow",
    "benchmarks",
    "config",
    "slurm",
    "envs",
    "docs",
    "tests",
    "Snakefile",
    "README.md",
)
SUFFIXES = {".py", ".smk", ".yaml", ".yml", ".md", ".toml", ".txt"}
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".snakemake"}

#: A ticket reference: the word, an optional plural and '#', a number.
MARKER = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)

#: Files whose markers are left here on purpose (file -> why); none today.
ALLOWED: dict[str, str] = {}


def text_files(root: Path) -> list[Path]:
    """Every text file of SCOPE under root (Snakefile by name), *.egg-info and caches left out."""
    out = []
    for name in SCOPE:
        path = root / name
        if path.is_file():
            out.append(path)
            continue
        for file in sorted(path.rglob("*")):
            parts = file.relative_to(root).parts
            if any(p.endswith(".egg-info") or p in SKIPPED_DIRS for p in parts):
                continue
            if file.is_file() and (file.suffix in SUFFIXES or file.name == "Snakefile"):
                out.append(file)
    return out


def markers(root: Path) -> list[str]:
    """'file:line: text' of every ticket marker under root outside ALLOWED."""
    found = []
    for file in text_files(root):
        rel = file.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if MARKER.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_the_walk_covers_the_scope():
    files = {f.relative_to(ROOT).as_posix() for f in text_files(ROOT)}
    assert {"Snakefile", "README.md", "config/config.yaml", "src/headgeom/heads/study.py"} <= files
    assert "workflow/schemas/heads.schema.yaml" in files
    assert not any(".egg-info/" in f for f in files)
    assert set(ALLOWED) <= files, "an allow-list entry names a file that no longer exists"


def test_the_pattern_finds_markers():
    number = "12"  # built here so that this file carries no marker itself
    for text in (
        f"# issue {number}: x",
        f"(Issue {number})",
        f"issues {number}-13",
        f"issue#{number}",
    ):
        assert MARKER.search(text), text
    assert not MARKER.search(f"tissue {number}") and not MARKER.search("the issue's goal")


def test_no_ticket_markers():
    found = markers(ROOT)
    assert not found, "ticket markers (say what the code does, cite docs §):\n" + "\n".join(found)
