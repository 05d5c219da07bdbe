"""The atlas page: built from the atlas's Parquets (tests/helpers/atlas_tables.py: the results
contract's tables written through their ResultTables), the data it embeds is the tables' rows
exactly, it is one file that fetches nothing, an optional table
that is absent (no pair, no compression, no PLE) leaves its view out, and a table it cannot
show is refused naming the file and the column. The clicks are in
tests/unit/test_atlas_page_browser.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from headgeom.atlas.page import data as data_module
from headgeom.atlas.page import page, views
from headgeom.atlas.page.data import AtlasPageInputError, gather
from headgeom.atlas.stages import page as page_stage
from headgeom.hashing import sha256_file
from tests.helpers import atlas_tables as synthetic
from tests.helpers.webpage import Scripts


def _embedded(html: str) -> tuple[dict, Scripts]:
    parser = Scripts()
    parser.feed(html)
    return json.loads(parser.blocks["atlas-data"].replace("<\\/", "</")), parser


def _rows(columns: dict) -> pd.DataFrame:
    # object columns: a null stays None (a numeric column would turn it into NaN)
    return pd.DataFrame(
        {
            name: pd.Series(
                c if isinstance(c, list) else [c["levels"][i] for i in c["codes"]], dtype=object
            )
            for name, c in columns.items()
        }
    )


def _same(a, b) -> bool:
    """Parquet value ``a`` and the page's JSON value ``b`` (null for a missing number)."""
    if a is None or a is pd.NA or (isinstance(a, float) and math.isnan(a)):
        return b is None
    return a == b and isinstance(a, bool) == isinstance(b, bool)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas-page")
    written = synthetic.write_atlas(root)
    out = root / "page.html"
    size = page.write_page(synthetic.model_paths(root), out, synthetic.MODEL, synthetic.pairs(root))
    html = out.read_text(encoding="utf-8")
    return root, written, size, html, *_embedded(html)


def test_the_page_is_one_file_that_fetches_nothing(built):
    _, _, size, html, data, parser = built
    assert size == len(html.encode("utf-8"))
    assert parser.links == []  # no <script src>, <link href>, <img src>, <a href>
    assert "vegaEmbed" in parser.blocks["anonymous-0"]  # the inlined library
    assert "chartDrawer" in html and "renderProfile" in html  # the shared and the page script
    assert data["model"] == synthetic.MODEL


def test_the_embedded_tables_are_the_parquet_rows_exactly(built):
    _, written, _, _, data, _ = built
    for (table, pair), frame in written.items():
        if pair is None:
            embedded = data["tables"][table]
        else:
            (entry,) = [p for p in data["pairs"] if p["name"] == pair]
            embedded = entry["tables"][table]
        got = _rows(embedded)
        columns = [name for name in synthetic.SCHEMAS[table].names if name != "pair"]
        assert list(got.columns) == columns, table
        assert len(got) == len(frame), table
        for column in columns:
            want = [v.item() if isinstance(v, np.generic) else v for v in frame[column].tolist()]
            for a, b in zip(want, got[column].tolist(), strict=True):
                assert _same(a, b), (table, column, a, b)


def test_every_table_is_cited_with_its_sha256(built):
    root, written, _, _, data, _ = built
    cited = {(s["table"], s["pair"]): s for s in data["sources"]}
    assert set(cited) == set(written)
    for (table, pair), source in cited.items():
        path = (
            synthetic.model_paths(root)[table]
            if pair is None
            else synthetic.pairs(root)[pair] / f"{table}.parquet"
        )
        assert source["path"] == str(path)
        assert source["sha256"] == sha256_file(path)


def test_the_charts_are_valid_vega_lite(built):
    *_, data, _ = built
    schema = "https://vega.github.io/schema/vega-lite/"
    assert set(data["specs"]) == {
        "profile", "heat", "compression-chart", "blend-chart", "drift-layers", "drift-other",
    }  # fmt: skip
    assert all(s["$schema"].startswith(schema) for s in data["specs"].values())
    # one profile panel per quantity: write size, constant part, volume knob, old state, KL
    assert len(data["specs"]["profile"]["vconcat"]) == 5


def test_the_profile_lists_the_blocks_drawn(built):
    *_, data, _ = built
    bars = data["specs"]["profile"]["vconcat"][0]["layer"][1]
    # attention, MLP, PLE and the layer skip's "layer"; not the token embedding (no layer)
    assert bars["encoding"]["color"]["scale"]["domain"] == ["attn", "mlp", "ple", "layer"]


def test_the_layer_step_fits_the_profile_in_about_900_pixels():
    assert views.layer_step(30) == 30  # SmolLM2: 900 / 30
    assert views.layer_step(4) == 64  # capped: a few layers do not fill the page
    assert views.layer_step(200) == 18


def test_without_a_pair_the_page_has_no_two_checkpoint_data(tmp_path):
    synthetic.write_atlas(tmp_path, pair=False)
    data, _ = _embedded(page.render(gather(synthetic.model_paths(tmp_path), synthetic.MODEL)))
    assert data["pairs"] == []
    assert all(s["pair"] is None for s in data["sources"])


def test_optional_tables_absent_leave_their_views_out(tmp_path):
    synthetic.write_atlas(tmp_path, skip=("retention", "compression", "probes", "drift"))
    data, _ = _embedded(
        page.render(
            gather(synthetic.model_paths(tmp_path), synthetic.MODEL, synthetic.pairs(tmp_path))
        )
    )
    assert set(data["tables"]) == {"profile", "effects", "summary"}
    assert set(data["pairs"][0]["tables"]) == {"blend", "grafts", "lowrank"}


def test_a_model_without_ple_or_post_norms(tmp_path):
    synthetic.write_atlas(tmp_path, ple=False, volume_knob=False, pair=False)
    data, _ = _embedded(page.render(gather(synthetic.model_paths(tmp_path), synthetic.MODEL)))
    effects = _rows(data["tables"]["effects"])
    assert "ple" not in set(effects["target"])
    # rows→mean is still there, on the token embedding
    assert set(effects.loc[effects["kind"] == "rows_mean", "target"]) == {"embed"}
    assert _rows(data["tables"]["profile"])["knob_rms"].isna().all()
    panels = data["specs"]["profile"]["vconcat"]
    assert len(panels) == 4  # no volume-knob panel
    assert "volume knob" not in json.dumps(panels)


def test_a_missing_column_is_refused_naming_file_and_column(tmp_path):
    written = synthetic.write_atlas(tmp_path, pair=False)
    path = synthetic.model_paths(tmp_path)["effects"]
    frame = written[("effects", None)].drop(columns=["delta_top1"])
    synthetic.write_malformed(path, "effects", frame)
    with pytest.raises(AtlasPageInputError, match=r"effects\.parquet: no column 'delta_top1'"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL)


def test_the_contract_is_the_results_tables(tmp_path):
    # a column results.py names (knob_rms, not the provisional schema's volume_knob) is required
    written = synthetic.write_atlas(tmp_path, pair=False)
    frame = written[("profile", None)].rename(columns={"knob_rms": "volume_knob"})
    frame.to_parquet(synthetic.model_paths(tmp_path)["profile"])
    with pytest.raises(AtlasPageInputError, match=r"profile\.parquet: no column 'knob_rms'"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL)


def test_a_missing_column_of_a_pair_table_is_refused(tmp_path):
    written = synthetic.write_atlas(tmp_path)
    path = synthetic.pairs(tmp_path)[synthetic.PAIR] / "blend.parquet"
    frame = written[("blend", synthetic.PAIR)].drop(columns=["kl_to_b"])
    synthetic.write_malformed(path, "blend", frame)
    with pytest.raises(AtlasPageInputError, match=r"blend\.parquet: no column 'kl_to_b'"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL, synthetic.pairs(tmp_path))


def test_a_column_of_another_kind_is_refused(tmp_path):
    written = synthetic.write_atlas(tmp_path, pair=False)
    frame = written[("profile", None)].assign(write_size=lambda f: f["write_size"].map(str))
    frame.to_parquet(synthetic.model_paths(tmp_path)["profile"])  # text where numbers go
    with pytest.raises(
        AtlasPageInputError, match=r"profile\.parquet: column 'write_size' is .*expected numbers"
    ):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL)


def test_rows_of_another_pair_are_refused(tmp_path):
    written = synthetic.write_atlas(tmp_path)
    frame = written[("drift", synthetic.PAIR)].copy()
    frame.loc[0, "pair"] = "other-pair"
    synthetic.write(synthetic.pairs(tmp_path)[synthetic.PAIR] / "drift.parquet", "drift", frame)
    with pytest.raises(AtlasPageInputError, match=r"rows of pair \['other-pair'\]"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL, synthetic.pairs(tmp_path))


def test_a_required_table_missing_is_refused(tmp_path):
    synthetic.write_atlas(tmp_path, pair=False, skip=("summary",))
    with pytest.raises(AtlasPageInputError, match=r"summary\.parquet: not found"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL)


def test_a_named_pair_without_tables_is_refused(tmp_path):
    synthetic.write_atlas(tmp_path, pair=False)
    with pytest.raises(AtlasPageInputError, match=r"no table of pair 'base-vs-tuned'"):
        gather(synthetic.model_paths(tmp_path), synthetic.MODEL, synthetic.pairs(tmp_path))


def test_the_page_reads_the_workflow_paths(tmp_path):
    # data.standard_paths: the files the atlas workflow writes under results/<study>/
    synthetic.write_atlas(tmp_path, pair=False)
    paths = data_module.standard_paths(tmp_path)
    assert paths["effects"] == tmp_path / "atlas" / "effects.parquet"
    assert set(gather(paths, synthetic.MODEL).tables) == set(synthetic.MODEL_TABLES)


def test_the_stage_writes_the_page_with_the_optional_tables_it_is_given(tmp_path):
    synthetic.write_atlas(tmp_path)
    paths = synthetic.model_paths(tmp_path)
    out = tmp_path / "atlas.html"
    argv = ["--model", "tiny", "--out", str(out)]
    argv += [
        a for t in ("profile", "effects", "retention", "summary") for a in (f"--{t}", str(paths[t]))
    ]
    assert page_stage.main(argv) == 0
    data, _ = _embedded(out.read_text(encoding="utf-8"))
    assert data["model"] == "tiny"
    assert set(data["tables"]) == {"profile", "effects", "retention", "summary"}
    assert data["pairs"] == []
    pair = f"{synthetic.PAIR}={synthetic.pairs(tmp_path)[synthetic.PAIR]}"
    assert page_stage.main([*argv, "--compression", str(paths["compression"]), "--pair", pair]) == 0
    data, _ = _embedded(out.read_text(encoding="utf-8"))
    assert "compression" in data["tables"]
    assert [p["name"] for p in data["pairs"]] == [synthetic.PAIR]
    with pytest.raises(SystemExit, match="no table of pair 'nothing'"):
        page_stage.main([*argv, "--pair", f"nothing={tmp_path / 'nowhere'}"])
