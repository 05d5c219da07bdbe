"""The explorer (docs §19): the data each view embeds is the Parquet's rows, its one derived
number (a head's interval) against a hand computation, the page is self-contained, and
bad inputs are refused. The browser test is tests/unit/test_explorer_browser.py."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from headgeom.heads.explorer import page, views
from headgeom.heads.explorer.data import (
    COLUMNS,
    ExplorerInputError,
    gather,
    head_intervals,
    mark_top_pairs,
)
from headgeom.io import read_table
from tests.helpers import explorer as synthetic
from tests.helpers.webpage import Scripts


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("explorer")
    inputs, catalog = synthetic.write_study(root)
    data = gather(inputs, catalog)
    html = page.render(data, "headgeom explorer: test", "a synthetic study")
    parser = Scripts()
    parser.feed(html)
    return inputs, catalog, data, html, parser


def _as_rows(columns: dict) -> pd.DataFrame:
    decoded = {
        name: c if isinstance(c, list) else [c["levels"][i] for i in c["codes"]]
        for name, c in columns.items()
    }
    return pd.DataFrame(decoded)


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b)) or b is pd.NA
    return a == b


@pytest.mark.parametrize("view", ["heads", "geometry", "leakage", "clamps", "edges", "atlas"])
def test_each_run_embeds_its_parquet_rows_exactly(study, view):
    inputs, _, data, _, parser = study
    table, cols = COLUMNS[view]
    for i, (model, seed) in enumerate(synthetic.RUNS):
        embedded = json.loads(parser.blocks[f"run-{i}"].replace("<\\/", "</"))
        expected = pd.concat(
            [read_table(p).to_pandas() for p in inputs.get(view, [])], ignore_index=True
        )
        expected = expected[(expected["model"] == model) & (expected["seed"] == seed)]
        if expected.empty:
            assert view not in embedded
            continue
        got = _as_rows(embedded[view])
        assert len(got) == len(expected)
        for col in cols:
            for a, b in zip(expected[col].tolist(), got[col].tolist(), strict=True):
                assert _same(a, b), (view, col, a, b)


def test_the_timeline_is_the_parquet_rows(study):
    inputs, _, _, _, parser = study
    meta = json.loads(parser.blocks["explorer-meta"].replace("<\\/", "</"))
    expected = read_table(inputs["timeline"][0]).to_pandas()
    assert len(meta["timeline"]) == len(expected)
    for row, (_, want) in zip(meta["timeline"], expected.iterrows(), strict=True):
        for col in COLUMNS["timeline"][1]:
            assert _same(want[col], row[col]), (col, want[col], row[col])


def test_every_view_cites_its_parquets_with_the_catalog_sha256(study):
    inputs, catalog, _, _, parser = study
    meta = json.loads(parser.blocks["explorer-meta"].replace("<\\/", "</"))
    digests = read_table(catalog).to_pandas().set_index("path")["sha256"]
    cited = {s["path"]: s["sha256"] for s in meta["sources"]}
    assert set(cited) == {p for paths in inputs.values() for p in paths}
    assert all(cited[p] == digests[p] for p in cited)
    # each view with a section on the page has a sources block naming its view
    for view in ("heads", "geometry", "leakage", "clamps", "edges", "atlas", "timeline"):
        assert re.search(rf'class="sources" data-view="[^"]*\b{view}\b', study[3])


def test_the_page_is_self_contained(study):
    *_, html, parser = study
    assert parser.links == []  # no <script src>, <link href>, <img src>, <a href>
    assert "vegaEmbed" in parser.blocks["anonymous-0"]  # the inlined library
    assert len(html) < 3_000_000


def test_a_heads_interval_is_the_student_t_interval_of_its_drops():
    drops = [0.5, 1.5, 4.0]  # mean 2, sample sd = sqrt(((1.5)² + 0.5² + 2²)/2) = sqrt(3.25)
    effects = pd.DataFrame(
        {"task": "sva", "split": "evaluation", "layer": 0, "head": 1, "effect": drops}
    )
    out = head_intervals(effects).iloc[0]
    half = 4.3026527297494 * math.sqrt(3.25) / math.sqrt(3)  # t_{0.975, 2}
    assert out["n"] == 3
    assert out["ci_low"] == pytest.approx(2.0 - half, rel=1e-11)
    assert out["ci_high"] == pytest.approx(2.0 + half, rel=1e-11)
    one = head_intervals(effects.iloc[:1]).iloc[0]
    assert np.isnan(one["ci_low"]) and np.isnan(one["ci_high"])


def test_top_pairs_are_a_sources_largest_leakages():
    frame = pd.DataFrame(
        {
            "task": "sva", "split": "evaluation", "source_layer": 0,
            "source_head": [0, 0, 0, 0, 1], "leakage": [0.1, 0.9, np.nan, 0.5, 0.2],
        }
    )  # fmt: skip
    marked = mark_top_pairs(frame, k=2)["top_pair"].tolist()
    assert marked == [False, True, False, True, True]


def test_an_input_missing_from_the_catalog_is_refused(tmp_path):
    inputs, catalog = synthetic.write_study(tmp_path)
    stray = tmp_path / "stray.parquet"
    stray.write_bytes(open(inputs["heads"][0], "rb").read())
    inputs["heads"].append(str(stray))
    with pytest.raises(ExplorerInputError, match="stray.parquet: not in the results catalog"):
        gather(inputs, catalog)


def test_a_parquet_changed_after_the_catalog_is_refused(tmp_path):
    inputs, catalog = synthetic.write_study(tmp_path)
    changed = inputs["atlas"][0]
    synthetic.write_study(tmp_path / "other", seed=1)  # same layout, other values
    other = str(tmp_path / "other" / changed[len(str(tmp_path)) + 1 :])
    open(changed, "wb").write(open(other, "rb").read())
    with pytest.raises(ExplorerInputError, match="differs from .* in the results catalog"):
        gather(inputs, catalog)


def test_unknown_kinds_are_refused(tmp_path):
    with pytest.raises(ExplorerInputError, match="unknown explorer input kinds"):
        gather({"heatmap": []}, tmp_path / "catalog.parquet")


def test_the_charts_are_valid_vega_lite():
    specs = views.specs()  # altair validates each against the Vega-Lite schema
    assert set(specs) == {"grid", "leakage", "clamps", "edges-in", "edges-out", "atlas", "timeline"}
    schema = "https://vega.github.io/schema/vega-lite/"
    assert all(s["$schema"].startswith(schema) for s in specs.values())
