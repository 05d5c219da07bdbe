"""docs/performance.md is generated from benchmarks/performance.yaml (headgeom.performance):
the committed file is current, every benchmark script has one entry, and an entry is one row."""

from __future__ import annotations

import pytest
import yaml

from headgeom import performance

SCRIPTS = sorted(p.name for p in (performance.ROOT / "benchmarks").glob("*.py"))


def test_the_committed_performance_doc_is_current():
    assert performance.DOC.read_text() == performance.render(performance.load())
    assert performance.main(["--check"]) == 0


def test_every_benchmark_script_has_one_entry():
    commands = [e["command"] for e in performance.load()]
    for script in SCRIPTS:
        hits = [c for c in commands if f"benchmarks/{script}" in c]
        assert len(hits) == 1, (script, hits)


def test_an_entry_is_one_row_and_repeats_are_refused(tmp_path):
    entry = dict.fromkeys(performance.FIELDS, "x")
    entry.update(name="toy", command="python benchmarks/toy.py", figure="1 s | 2 s")
    data = tmp_path / "performance.yaml"
    data.write_text(yaml.safe_dump({"benchmarks": [entry]}))
    out = tmp_path / "performance.md"
    assert performance.main(["--data", str(data), "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| toy |")]
    assert rows == ["| toy | `python benchmarks/toy.py` | x | 1 s \\| 2 s | x | x |"]
    assert performance.main(["--data", str(data), "--out", str(out), "--check"]) == 0
    data.write_text(yaml.safe_dump({"benchmarks": [entry, entry]}))
    with pytest.raises(ValueError, match="repeated: \\['toy'\\]"):
        performance.load(data)
    data.write_text(yaml.safe_dump({"benchmarks": [{**entry, "commit": "8fcb995"}]}))
    with pytest.raises(ValueError, match="exactly the fields"):
        performance.load(data)
