"""Every paper table and figure has its own caption in the snakemake report (the
requirement: "every table and figure has a current caption"), not the generic fallback; the
caption files are written from the records (headgeom.heads.paper.record_files) and are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headgeom.heads.paper import outputs, record_files

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


def test_the_files_written_from_the_records_are_current(tmp_path):
    assert record_files.main(["--check"]) == 0, "run: python -m headgeom.heads.paper.record_files"
    written = record_files.written_files()
    report = record_files.ROOT / "workflow" / "report"
    assert outputs.TABLES["table7"].caption in written[report / "tables.rst"]
    assert outputs.TABLES["table4"].caption in written[report / "document" / "table4.rst"]
    map_md = written[record_files.ROOT / "docs" / "map.md"]
    assert "| table7 (table) | App. B | `make_table` | `paper.edges.table7` |" in map_md
    assert "acdc → `edges/{model}/s{seed}/acdc.parquet` (acdc)" in map_md
    # a copy of the repository's files: stale after an edit, current once written
    for path in written:
        copy = tmp_path / path.relative_to(record_files.ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
    (tmp_path / "workflow" / "report" / "tables.rst").write_text("old")
    (tmp_path / "workflow" / "report" / "document" / "gone.rst").write_text("no output's")
    assert record_files.main(["--root", str(tmp_path), "--check"]) == 1
    assert record_files.main(["--root", str(tmp_path)]) == 0
    assert record_files.main(["--root", str(tmp_path), "--check"]) == 0
    assert not (tmp_path / "workflow" / "report" / "document" / "gone.rst").exists()
