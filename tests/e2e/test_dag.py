"""The real Snakemake DAG on the micro study: outputs, manifests, partial reruns."""

from __future__ import annotations

import copy
import json
import os
import platform

import pyarrow.parquet as pq
import pytest

from headgeom import kernels
from headgeom.hashing import content_hash, sha256_file
from headgeom.io import read_parquet_metadata
from tests.e2e.conftest import copy_of, make_workdir, planned_jobs, snakemake

TASKS = ("sva", "quote", "plural")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, finished_micro, micro_config):
    return copy_of(finished_micro, tmp_path_factory.mktemp("dag") / "w"), micro_config


def test_every_output_exists_parses_and_is_described(finished_run):
    work, cfg = finished_run
    results = work / "results" / cfg["study"]
    models = [(m, s) for m, spec in cfg["models"].items() for s in spec["seeds"]]
    expected = [
        results / "tables" / f"{t}.{ext}"
        for t in ("table2", "table3", "table5", "table6", "lanes", "leakage")
        for ext in ("md", "csv", "tex", "sources.json")
    ]
    expected += [
        results / "figures" / f"figure{n}.{ext}"
        for n in (1, 2, 3, 4, 5, 7)
        for ext in ("png", "svg", "csv", "sources.json")
    ]
    # the paper §5.1 Parquets (Table 1's "geometric exclusivity" inputs)
    expected += [results / "exclusivity" / f"{f}.parquet" for f in ("summary", "pairs", "heads")]
    expected += [results / "concentration" / "compare" / f"{t}.paired.parquet" for t in TASKS]
    for m, s in models:
        expected += [
            results / "models" / m / f"s{s}" / f
            for f in ("model.safetensors", "train_log.parquet", "manifest.json")
        ]
        for stage in ("eval", "patching", "concentration", "leakage", "lanes"):
            expected += [results / stage / m / f"s{s}" / f"{t}.parquet" for t in TASKS]
        expected += [
            results / "concentration" / m / f"s{s}" / f"{t}.{kind}.parquet"
            for t in TASKS
            for kind in ("heads", "robustness", "conditions", "logo")
        ]
    missing = [str(p) for p in expected if not p.exists()]
    assert not missing, missing
    for parquet in results.rglob("*.parquet"):
        table = pq.read_table(parquet)
        assert table.num_rows > 0, parquet
        meta = table.schema.metadata or {}
        assert b"headgeom_version" in meta, f"{parquet} lacks file metadata"


def test_checkpoints_and_results_match_their_manifests(finished_run):
    work, cfg = finished_run
    results = work / "results" / cfg["study"]
    corpus = json.loads((results / "corpus" / "default" / "manifest.json").read_text())
    for manifest in (results / "models").rglob("manifest.json"):
        record = json.loads(manifest.read_text())
        checkpoint_sha = sha256_file(manifest.parent / "model.safetensors")
        assert checkpoint_sha == record["checkpoint_file_sha256"]
        assert record["data"]["corpus_sha256"] == corpus["train_sha256"]
        assert record["data"]["val_sha256"] == corpus["val_sha256"]
        model, seed = manifest.parent.parent.name, manifest.parent.name
        for stage in ("patching", "leakage"):
            for parquet in (results / stage / model / seed).glob("*.parquet"):
                meta = read_parquet_metadata(parquet)
                assert meta["checkpoint_sha256"] == checkpoint_sha, parquet
                unsealed = {k: v for k, v in record.items() if k != "record_sha256"}
                assert meta["manifest_content_hash"] == content_hash(unsealed), parquet


def test_the_kernel_pin_reaches_the_training_jobs(finished_run):
    """The workflow pins the kernels before any job starts (headgeom.kernels): every
    training job ran under the pin and each library took it (an AVX-512 CPU reports AVX2,
    numpy's and scipy's OpenBLAS their Haswell kernels, numpy its AVX2 level)."""
    pin = kernels.kernel_pin("avx2", kernels.cpu_flags(), platform.machine())
    if not pin or {k: os.environ.get(k) for k in pin} != pin:
        pytest.skip("no pin on this machine, or the caller chose the kernels")
    work, cfg = finished_run
    manifests = list((work / "results" / cfg["study"] / "models").rglob("manifest.json"))
    assert manifests
    for manifest in manifests:
        machine = json.loads(manifest.read_text())["environment"]["machine"]
        pinned = {k: machine["kernel_variables"].get(k) for k in pin}
        assert pinned == pin, manifest  # beside Snakemake's OMP/MKL_NUM_THREADS
        assert machine["cpu_capability"] == "AVX2", manifest
        assert {lib["core"] for lib in machine["blas_libraries"]} == {"Haswell"}, manifest
        assert not any("512" in t or t == "X86_V4" for t in machine["numpy_simd"]), manifest


def test_patching_covers_every_head_and_example(finished_run):
    work, cfg = finished_run
    arch = cfg["architecture"]
    results = work / "results" / cfg["study"]
    effects = pq.read_table(results / "patching" / "learned" / "s1" / "sva.parquet").to_pandas()
    sizes = cfg["tasks"]["sva"]["splits"]
    assert set(effects["split"]) == set(cfg["patching"]["splits"])
    n_examples = sum(sizes[split] for split in cfg["patching"]["splits"])
    assert len(effects) == n_examples * arch["n_layer"] * arch["n_head"]
    assert (effects["effect"] - (effects["clean_ld"] - effects["patched_ld"])).abs().max() < 1e-5


def test_rerun_after_complete_run_has_nothing_to_do(finished_run):
    work, _ = finished_run
    proc = snakemake(work, "-n", "--cores", "2")
    assert planned_jobs(proc) == {}, proc.stdout


def test_changing_one_task_config_reruns_only_that_task(finished_run):
    work, cfg = finished_run
    changed = copy.deepcopy(cfg)
    changed["tasks"]["quote"]["seed"] += 1
    (work / "config.yaml").write_text(json.dumps(changed))
    try:
        jobs = planned_jobs(snakemake(work, "-n", "--cores", "2"))
    finally:
        (work / "config.yaml").write_text(json.dumps(cfg))
    n_models = sum(len(spec["seeds"]) for spec in cfg["models"].values())
    assert jobs.get("make_tasks") == 1
    for rule in ("evaluate_clean", "patch_heads", "concentration", "leakage", "lanes"):
        assert jobs.get(rule) == n_models, (rule, jobs)
    assert "train" not in jobs and "tokenize_corpus" not in jobs and "hash_checkpoint" not in jobs


def test_one_target_plans_only_what_it_needs(tmp_path, micro_config):
    work = make_workdir(tmp_path / "fresh", micro_config)
    jobs = planned_jobs(snakemake(work, "-n", "--cores", "2", "results/micro/tables/table6.md"))
    assert set(jobs) == {
        "tokenize_corpus",
        "train",
        "hash_checkpoint",
        "make_tasks",
        "patch_heads",
        "concentration",
        "make_table",
    }, jobs
    assert jobs["make_table"] == 1


def test_the_explorer_shows_every_run_and_cites_the_catalog(finished_run):
    # docs §17.3: one page, a JSON block per run, every cited SHA-256 the catalog's
    import re

    import pandas as pd

    work, cfg = finished_run
    results = work / "results" / cfg["study"]
    html = (results / "explorer.html").read_text()
    models = [(m, s) for m, spec in cfg["models"].items() for s in spec["seeds"]]
    assert len(re.findall(r'<script type="application/json" id="run-\d+">', html)) == len(models)
    meta = json.loads(
        re.search(r'id="explorer-meta">(.*?)</script>', html, re.S).group(1).replace("<\\/", "</")
    )
    assert {(r["model"], r["seed"]) for r in meta["runs"]} == set(models)
    catalog = pd.read_parquet(results / "catalog.parquet").set_index("path")["sha256"]
    assert meta["sources"] and all(catalog[s["path"]] == s["sha256"] for s in meta["sources"])
    # nothing fetched: no src or href attribute outside the inlined scripts' code
    markup = re.sub(r"(<script[^>]*>).*?</script>", r"\1", html, flags=re.S)
    assert not re.search(r"\s(src|href)\s*=", markup)


def test_the_explorer_in_a_browser_shows_a_clicked_heads_parquet_values(finished_run):
    # the micro study's own page: click the cell of one head, read its e back (docs §17.3)
    import shutil

    import pandas as pd

    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on PATH (Debian: chromium)")
    work, cfg = finished_run
    results = work / "results" / cfg["study"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_context(offline=True).new_page()
        errors = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto((results / "explorer.html").as_uri())
        tab.wait_for_selector("body[data-ready='true']")
        run = tab.evaluate("META.runs[META.default_run]")
        task, split = tab.input_value("#task"), tab.input_value("#split")
        tab.locator(
            '#grid path[aria-roledescription="rect mark"][aria-label*="layer: 1;"]'
            '[aria-label*="head: 0;"]'
        ).click()
        tab.wait_for_function("document.getElementById('selected-head').textContent === 'L1.H0'")
        shown = float(tab.get_attribute("#head-details td[data-key='e']", "data-value"))
        browser.close()
    heads = pd.read_parquet(
        results / "concentration" / run["model"] / f"s{run['seed']}" / f"{task}.heads.parquet"
    )
    row = heads[(heads["split"] == split) & (heads["layer"] == 1) & (heads["head"] == 0)]
    assert shown == float(row["e"].iloc[0])
    assert errors == []
