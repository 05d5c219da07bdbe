"""Every paper table and figure has its own caption in the snakemake report (the
requirement: "every table and figure has a current caption"), not the generic fallback; the
caption files are written from the records (headgeom.paper.captions) and are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headgeom.paper import captions as caption_files
from headgeom.paper import outputs

REPORT = Path(__file__).resolve().parents[2] / "workflow" / "report"


def captions(kind: str) -> dict[str, str]:
    text = (REPORT / f"{kind}.rst").read_text()
    block = text[: text.index("} %}")]
    return dict(re.findall(r'^\s*"(\w+)":\s*"(.+)",?\s*$', block, flags=re.M))


@pytest.mark.parametrize(
    "kind, names",
    [("tables", outputs.TABLE_JOBS), ("figures", tuple(outputs.FIGURES))],
)
def test_every_output_has_its_own_caption(kind, names):
    about = captions(kind)
    missing = [n for n in names if n not in about]
    assert not missing, f"workflow/report/{kind}.rst has no caption for {missing}"
    stale = sorted(set(about) - set(names))
    assert not stale, f"workflow/report/{kind}.rst captions outputs that do not exist: {stale}"
    assert all(len(c) > 40 for c in about.values())


def test_document_tables_have_caption_files():
    for table in outputs.DOCUMENT_TABLES:
        path = REPORT / "document" / f"{table}.rst"
        assert path.is_file() and len(path.read_text().strip()) > 40, path


def test_the_caption_files_are_written_from_the_records(tmp_path):
    assert caption_files.main(["--check"]) == 0, "run: python -m headgeom.paper.captions"
    record = outputs.TABLES["table7"]
    assert record.caption in caption_files.caption_files()["tables.rst"]
    assert caption_files.main(["--report", str(tmp_path), "--check"]) == 1  # none written yet
    (tmp_path / "document").mkdir()
    (tmp_path / "document" / "gone.rst").write_text("a caption of no output")
    assert caption_files.main(["--report", str(tmp_path)]) == 0
    assert caption_files.main(["--report", str(tmp_path), "--check"]) == 0
    assert not (tmp_path / "document" / "gone.rst").exists()
