"""docs/results.md's column tables are generated from the results contract
(headgeom.results_doc): the committed file is current, every result table is in it once,
and a table is rendered from its schema and descriptions, by hand here."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headgeom import results, results_doc
from headgeom.studies import KINDS, ROOT

#: The head-geometry study's reference (the SA-MoE study's: docs/samoe.md).
DOC = ROOT / KINDS["heads"].results_doc


def test_the_committed_reference_is_current():
    text = DOC.read_text()
    assert results_doc.render(text) == text, "run: python -m headgeom.results_doc"
    assert results_doc.main(["--check"]) == 0


def test_a_table_is_its_schema_and_descriptions():
    table = results.ResultTable(
        "toy",
        pa.schema([("model", pa.string()), ("share", pa.float64()),
                   ("label", pa.dictionary(pa.int32(), pa.string())),
                   ("ids", pa.list_(pa.int32()))]),
        {"share": "|e|/E of the head", "label": "a label", "ids": "token ids"},
        "model",
    )  # fmt: skip
    assert results_doc.column_table(table) == (
        "| Column | Type | Description |\n"
        "|---|---|---|\n"
        f"| `model` | string | {results.STANDARD_DESCRIPTIONS['model']} |\n"
        "| `share` | float64 | \\|e\\|/E of the head |\n"
        "| `label` | dictionary<string> | a label |\n"
        "| `ids` | list<int32> | token ids |\n"
    )


def test_a_stale_unknown_or_missing_table_is_named(tmp_path):
    text = DOC.read_text()
    stale = text.replace("| `E_ratio` | float64 |", "| `E_ratio` | float32 |")
    assert stale != text
    doc = tmp_path / "results.md"
    doc.write_text(stale)
    assert results_doc.main(["--doc", str(doc), "--check"]) == 1
    assert results_doc.main(["--doc", str(doc)]) == 0 and doc.read_text() == text
    with pytest.raises(ValueError, match="no result table 'nosuch'"):
        results_doc.render(text + "<!-- columns: nosuch -->\n<!-- /columns -->\n")
    with pytest.raises(ValueError, match="repeated: \\['lanes'\\], missing: none"):
        results_doc.render(text + "<!-- columns: lanes -->\n<!-- /columns -->\n")
    without = results_doc.BLOCK.sub("", text, count=1)
    with pytest.raises(ValueError, match="repeated: none, missing: \\['tokens'\\]"):
        results_doc.render(without)
