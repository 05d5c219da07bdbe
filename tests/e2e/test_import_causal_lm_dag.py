"""The micro DAG up to clean evaluation, all-heads and key/value-head patching, AtP beside
exact, leakage, the geometry summary, lanes and clamps on an imported causal LM: a random tiny
grouped-query Llama with its own tokenizer (written locally; nothing is downloaded), imported
with format hf-causal-lm, its tasks built with its tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from headgeom.hashing import sha256_file
from headgeom.io import read_parquet_metadata
from headgeom.model.checkpoint import load_verified
from tests.e2e.conftest import REPO, make_workdir, snakemake

pytestmark = pytest.mark.e2e
pytest.importorskip("transformers", reason="building the tiny Llama needs transformers [dev]")
TASKS = ("sva", "quote", "plural")
MODEL, LAYERS, HEADS, KV_HEADS = "llama-tiny", 2, 4, 2


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    from tests.helpers.hf import save_tiny_llama

    cfg = yaml.safe_load((REPO / "tests" / "e2e" / "import_llama.yaml").read_text())
    work = make_workdir(tmp_path_factory.mktemp("llama") / "w", cfg)
    hf = save_tiny_llama(work / MODEL, seed=0)
    results = f"results/{cfg['study']}"
    stages = ("eval", "patching", "patching_kv", "atp", "leakage", "lanes")
    targets = [f"{results}/{stage}/{MODEL}/s0/{t}.parquet" for stage in stages for t in TASKS]
    targets += [f"{results}/geometry/{MODEL}/s0/summary.parquet",
                f"{results}/clamps/{MODEL}/s0/paths.parquet",
                f"{results}/exclusivity/summary.parquet"]  # fmt: skip
    proc = snakemake(work, "--cores", "2", *targets)
    assert f"no edges for {MODEL}: architecture 'hf-causal-lm' lacks" in proc.stderr
    return work / results, hf


def test_patching_covers_every_head_with_finite_effects(llama_run):
    results, _ = llama_run
    for task in TASKS:
        effects = pq.read_table(results / "patching" / MODEL / "s0" / f"{task}.parquet").to_pandas()
        heads = set(zip(effects["layer"], effects["head"], strict=True))
        assert heads == {(layer, h) for layer in range(LAYERS) for h in range(HEADS)}, task
        assert np.isfinite(effects["effect"]).all() and (effects["effect"] != 0).any(), task
        per_example = effects.groupby(["split", "example_id"]).size()
        assert (per_example == LAYERS * HEADS).all(), task


def test_atp_sits_beside_the_exact_effects_of_every_task(llama_run):
    # rule atp_agreement on the imported model: every head of the evaluation split, the exact
    # drops those of the effects file, one agreement row per task and the run's figure
    results, _ = llama_run
    run = results / "atp" / MODEL / "s0"
    for task in TASKS:
        (row,) = pq.read_table(run / f"{task}.parquet").to_pylist()
        assert row["split"] == "evaluation" and row["n_heads"] == LAYERS * HEADS, task
        assert row["n_examples"] == 16 and row["top_k"] == LAYERS * HEADS, task
        examples = pq.read_table(run / f"{task}.examples.parquet").to_pandas()
        effects = pq.read_table(results / "patching" / MODEL / "s0" / f"{task}.parquet")
        effects = effects.to_pandas().query("split == 'evaluation'")
        both = effects.merge(examples, on=["example_id", "layer", "head"], validate="1:1")
        assert len(both) == len(examples) == 16 * LAYERS * HEADS, task
        assert (both["effect"] == both["effect_exact"]).all(), task
        assert np.isfinite(examples["effect_atp"]).all(), task
        meta = read_parquet_metadata(run / f"{task}.parquet")
        assert meta["effects_sha256"] == sha256_file(results / "patching" / MODEL / "s0"
                                                     / f"{task}.parquet")  # fmt: skip
    assert (run / "agreement.png").read_bytes().startswith(b"\x89PNG")


def test_key_value_head_patching_covers_every_kv_head_with_its_query_heads(llama_run):
    results, _ = llama_run
    for task in TASKS:
        path = results / "patching_kv" / MODEL / "s0" / f"{task}.parquet"
        rows = pq.read_table(path).to_pandas()
        heads = set(zip(rows["layer"], rows["kv_head"], strict=True))
        assert heads == {(layer, j) for layer in range(LAYERS) for j in range(KV_HEADS)}, task
        assert {tuple(q) for q in rows["query_heads"]} == {(0, 1), (2, 3)}, task
        assert np.isfinite(rows["effect"]).all() and (rows["effect"] != 0).any(), task
        assert (rows.groupby(["split", "example_id"]).size() == LAYERS * KV_HEADS).all(), task
        assert read_parquet_metadata(path)["analysis"] == "patch_kv_heads"


def test_clean_evaluation_runs_on_the_models_own_tokens(llama_run):
    results, _ = llama_run
    for task in TASKS:
        frame = pq.read_table(results / "eval" / MODEL / "s0" / f"{task}.parquet").to_pandas()
        assert len(frame) and frame["n"].gt(0).all() and frame["accuracy"].between(0, 1).all()
        meta = read_parquet_metadata(results / "tasks" / f"{task}.parquet")
        tokenizer = json.loads(meta["tokenizer"])
        assert tokenizer["kind"] == "directory"
        assert tokenizer["files_sha256"]["tokenizer.json"] == sha256_file(
            results.parents[1] / MODEL / "tokenizer.json"
        )


def test_the_manifest_holds_the_source_record_and_gates_the_checkpoint(llama_run):
    results, hf = llama_run
    run = results / "models" / MODEL / "s0"
    record = json.loads((run / "manifest.json").read_text())
    source = record["import"]["source"]
    folder = results.parents[1] / MODEL
    assert record["import"]["format"] == "hf-causal-lm"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert source["files_sha256"][name] == sha256_file(folder / name), name
    assert source["family"] == "llama" and "transformers" in source["versions"]
    assert record["config"]["model"]["architecture"] == "hf-causal-lm"
    assert record["config"]["model"]["n_kv_head"] == 2
    assert record["checkpoint_file_sha256"] == sha256_file(run / "model.safetensors")
    assert np.isfinite(record["val_loss_nats"])
    model, vocab, _ = load_verified(run / "model.safetensors", run / "manifest.json")
    assert model.cfg.n_head == HEADS and len(vocab) == hf.config.vocab_size


def test_leakage_runs_with_its_checks_and_attributes_shared_key_value_heads(llama_run):
    results, _ = llama_run
    for task in TASKS:
        path = results / "leakage" / MODEL / "s0" / f"{task}.parquet"
        meta = read_parquet_metadata(path)
        for check in ("C8", "C9"):
            assert float(meta[f"check_{check}_max_abs_residual"]) <= float(
                meta[f"check_{check}_tolerance"]
            )
        assert "attributed to every query head of its group" in meta["kv_attribution"]
        frame = pq.read_table(path).to_pandas()
        assert len(frame) == HEADS * 1 * HEADS * 3  # sources of layer 0, readers of layer 1
        assert frame["leakage"].between(0, 1).all() and frame["tv_query"].isna().all()
        k = frame[frame["read_type"] == "K"].set_index(["source_head", "reader_head"])["leakage"]
        np.testing.assert_array_equal(k.xs(0, level=1), k.xs(1, level=1))  # kv head 0: 0, 1
    # the exclusivity summary (docs §11.3) reads them with the run's log
    summary = pq.read_table(results / "exclusivity" / "summary.parquet").to_pandas()
    medians = summary[(summary["quantity"] == "median_leakage") & (summary["scope"] == "run")]
    assert set(medians["model"]) == {MODEL} and set(medians["read_type"]) == {"Q", "K", "V"}


def test_geometry_lanes_and_clamps_run_on_the_pretrained_model(llama_run):
    results, _ = llama_run
    run = results / "geometry" / MODEL / "s0"
    summary = pq.read_table(run / "summary.parquet").to_pandas()
    assert summary["n_head"].item() == HEADS and not summary["prop1_applies"].item()
    lanes = pq.read_table(results / "lanes" / MODEL / "s0" / "sva.parquet").to_pandas()
    assert lanes["chance"].item() == 1 / HEADS
    paths = results / "clamps" / MODEL / "s0" / "paths.parquet"
    meta = read_parquet_metadata(paths)
    for check in ("C12", "C13"):
        assert float(meta[f"check_{check}_max_abs_residual"]) <= float(
            meta[f"check_{check}_tolerance"]
        )
    assert len(pq.read_table(paths)) == 5 * len(TASKS)
