"""The edit atlas's DAG through Snakemake on a random tiny Llama with its own tokenizer
(written locally; nothing is downloaded): every rule runs, the merged tables hold every edit
the model has, a pair of two tiny Llamas of one shape gets its two-checkpoint views, the DAG
ends with the atlas page (which embeds those tables and opens in Chromium where there is one),
a second run has nothing to do, and a changed sweep setting reruns the sweep but not the
inputs."""

from __future__ import annotations

import json
import re
import shutil

import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.conftest import REPO, make_workdir, planned_jobs, snakemake

pytestmark = pytest.mark.e2e
pytest.importorskip("transformers", reason="building the tiny Llama needs transformers [dev]")


@pytest.fixture(scope="module")
def atlas_run(tmp_path_factory):
    from tests.helpers.hf import save_tiny_llama

    cfg = yaml.safe_load((REPO / "tests" / "e2e" / "atlas-micro.yaml").read_text())
    work = make_workdir(tmp_path_factory.mktemp("atlas") / "w", cfg)
    save_tiny_llama(work / "llama-tiny", seed=0)
    save_tiny_llama(work / "llama-tiny-b", seed=1)  # the pair's B: same shape and tokenizer
    snakemake(work, "--cores", "2")
    return work, work / "results" / cfg["study"] / "atlas", cfg


def test_every_edit_is_in_the_merged_tables(atlas_run):
    _, results, _ = atlas_run
    summary = pq.read_table(results / "summary.parquet").to_pandas()
    # 2 layers: zero and average of 2 blocks each + everywhere, rows_mean of the embedding,
    # skip of each layer + everywhere; no key norm, no PLE
    assert len(summary) == 2 * (4 + 2) + 1 + 3
    effects = pq.read_table(results / "effects.parquet").to_pandas()
    assert set(effects["corpus"]) == {"demo", "code"} and (effects["kl"] >= 0).all()
    assert (results / "atlas.md").read_text().startswith("# Edit atlas")
    # the compression view is in the default target: its original row scores nothing
    compressed = pq.read_table(results / "compression.parquet").to_pandas()
    original = compressed[compressed["method"] == "original"]
    assert len(original) == 3 and (original["kl"] == 0).all()
    assert {"int8", "int4", "int2", "low_rank"} <= set(compressed["method"])


def test_the_pair_has_its_views(atlas_run):
    _, results, _ = atlas_run
    folder = results / "pairs" / "two-seeds"
    blend = pq.read_table(folder / "blend.parquet").to_pandas().set_index(["alpha", "corpus"])
    assert blend.loc[(0.0, "mean"), "kl_to_a"] == 0.0 and blend.loc[(1.0, "mean"), "kl_to_b"] == 0.0
    assert blend.loc[(0.5, "demo"), "kl_to_a"] > 0
    probes = pq.read_table(folder / "probes.parquet").to_pandas()
    assert len(probes) == 3 * 8  # α × the sva items
    grafts = pq.read_table(folder / "grafts.parquet").to_pandas()
    assert set(grafts["part"]) == {"group"} and set(grafts["direction"]) == {"b_into_a", "a_into_b"}
    assert set(pq.read_table(folder / "lowrank.parquet").column("mode").to_pylist()) == {
        "top", "random", "fraction"}  # fmt: skip
    drift = pq.read_table(folder / "drift.parquet").to_pandas()
    # two seeds: every matrix differs; both models' norm weights are their initial ones
    assert (drift.loc[drift["kind"] != "norm", "drift"] > 0).all()
    assert (drift.loc[drift["kind"] == "norm", "drift"] == 0).all()
    assert "## Where the probes switch" in (folder / "pair.md").read_text()


def test_the_dag_ends_with_the_page(atlas_run):
    _, results, _ = atlas_run
    html = (results / "atlas.html").read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S)
    data = json.loads(block.group(1).replace("<\\/", "</"))
    assert data["model"] == "llama-tiny"  # the model folder's name (config model.path)
    effects = pq.read_table(results / "effects.parquet")
    assert set(data["tables"]) == {"profile", "effects", "retention", "summary", "compression"}
    assert data["tables"]["effects"]["kl"] == effects.column("kl").to_pylist()
    cited = {s["table"]: s["path"] for s in data["sources"]}
    assert cited["effects"].endswith("atlas/effects.parquet")
    (pair,) = data["pairs"]
    assert pair["name"] == "two-seeds"
    assert set(pair["tables"]) == {"blend", "probes", "grafts", "drift", "lowrank"}


def test_the_page_opens_in_chromium(atlas_run):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on PATH (Debian: chromium)")
    _, results, _ = atlas_run
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=flags)
        try:
            tab = browser.new_context(offline=True).new_page()
            problems = []
            tab.on("pageerror", lambda e: problems.append(str(e)))
            tab.goto((results / "atlas.html").as_uri())
            tab.wait_for_selector("body[data-ready]", state="attached")
            assert tab.get_attribute("body", "data-ready") == "true", problems
            # the heat map of Zero: each block of each of the 2 layers, per corpus and the mean
            cells = tab.locator('#heat path[aria-roledescription="rect mark"]')
            assert cells.count() == 2 * 2 * 3
            assert tab.locator("#pairs-section").is_visible()
            assert tab.locator("#probes tbody tr").count() == 8  # one row per probe item
            assert problems == []
        finally:
            browser.close()


def test_nothing_to_do_then_a_sweep_setting_reruns_the_sweep(atlas_run, tmp_path):
    work, _, cfg = atlas_run
    assert planned_jobs(snakemake(work, "-n", "--cores", "2")) == {}
    cfg = {**cfg, "sweep": {**cfg["sweep"], "kl_chunk": 8}}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    jobs = planned_jobs(snakemake(work, "-n", "--cores", "2"))
    assert jobs.get("atlas_sweep") == 2 and jobs.get("atlas_report") == 1
    assert jobs.get("atlas_page") == 1
    assert "atlas_inputs" not in jobs and "atlas_profile" not in jobs
