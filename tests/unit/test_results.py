"""The results contract (headgeom.results), the one effects-matrix conversion
(headgeom.heads.analysis.effects) and the thread cap of stage scripts (headgeom.runtime)."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom import results
from headgeom.heads.analysis.effects import (
    drops_array,
    drops_columns,
    effect_matrix,
    matrix_columns,
)
from headgeom.heads.stages import param_counts as param_counts_stage
from headgeom.io import read_parquet_metadata
from headgeom.model import zoo

#: The stage scripts of each study kind.
SRC = Path(__file__).resolve().parents[2] / "src" / "headgeom"
HEADS_STAGES = SRC / "heads" / "stages"
STAGE_DIRS = (HEADS_STAGES, SRC / "samoe" / "stages")

MANIFEST = {
    "record_type": "checkpoint_manifest",
    "checkpoint_file_sha256": "ab" * 32,
    "config_hash": "cd" * 32,
    "config_id": "learned-s42",
}


# ----------------------------------------------------------------------------- provenance
def test_provenance_keys_from_a_hand_built_manifest():
    out = results.provenance(MANIFEST, task_dataset_sha256="ef" * 32, task_file_sha256="01" * 32)
    canonical = json.dumps(MANIFEST, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert out["checkpoint_sha256"] == "ab" * 32  # the checkpoint bytes, from the manifest
    assert out["manifest_content_hash"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert out["config_hash"] == "cd" * 32 and out["config_id"] == "learned-s42"
    assert out["task_dataset_sha256"] == "ef" * 32 and out["task_file_sha256"] == "01" * 32
    assert set(out["source_freeze"]) == {"git_commit", "tracked_diff_sha256"}
    assert set(out) <= set(results.PROVENANCE_KEYS)
    # the retired spellings never come back
    legacy = {"checkpoint_file_sha256", "checkpoint_manifest_sha256", "source"}
    assert not legacy & set(out) and not legacy & set(results.PROVENANCE_KEYS)


def test_provenance_without_inputs_is_the_source_freeze_alone():
    assert set(results.provenance()) == {"source_freeze"}


def test_carried_provenance_passes_on_input_keys_only(tmp_path):
    path = tmp_path / "in.parquet"
    meta = {**results.provenance(MANIFEST, task_dataset_sha256="ef" * 32), "n_layers": 2}
    results.LANES.write(path, pd.DataFrame(columns=results.LANES.names), meta)
    carried = results.carried_provenance(read_parquet_metadata(path), path)
    assert carried == {
        "checkpoint_sha256": "ab" * 32,
        "manifest_content_hash": meta["manifest_content_hash"],
        "config_hash": "cd" * 32,
        "config_id": "learned-s42",
        "task_dataset_sha256": "ef" * 32,
    }


def test_require_provenance_names_the_key_that_differs():
    metadata = {"checkpoint_sha256": "ab" * 32, "task_dataset_sha256": "ef" * 32}
    results.require_provenance(metadata, {"checkpoint_sha256": "ab" * 32}, "x.parquet")
    with pytest.raises(ValueError, match="x.parquet: task_dataset_sha256 is efef"):
        results.require_provenance(metadata, {"task_dataset_sha256": "00" * 32}, "x.parquet")
    with pytest.raises(KeyError, match="no 'manifest_content_hash'"):
        results.require_provenance(metadata, {"manifest_content_hash": "0"}, "x.parquet")


def test_file_metadata_puts_analysis_then_carried_then_own_provenance():
    carried = {"checkpoint_sha256": "11" * 32, "task_dataset_sha256": "ef" * 32}
    meta = results.file_metadata("lanes", "3", carried=carried)
    assert list(meta)[:2] == ["analysis", "analysis_version"]
    assert (meta["analysis"], meta["analysis_version"]) == ("lanes", "3")
    assert {k: meta[k] for k in carried} == carried
    assert list(meta)[-1] == "source_freeze"  # the writer's code, never an input's
    own = results.file_metadata("leakage", manifest=MANIFEST, task_file_sha256="99" * 32)
    assert own["checkpoint_sha256"] == "ab" * 32 and own["task_file_sha256"] == "99" * 32
    assert own["analysis_version"] == "1"


def test_require_same_run_refuses_another_checkpoint_or_task(tmp_path):
    path = tmp_path / "heads.parquet"
    meta = results.provenance(MANIFEST, task_dataset_sha256="ef" * 32)
    results.LANES.write(path, pd.DataFrame(columns=results.LANES.names), meta)
    assert results.require_same_run(path, MANIFEST, "ef" * 32)["config_id"] == "learned-s42"
    with pytest.raises(ValueError, match="task_dataset_sha256 is efef"):
        results.require_same_run(path, MANIFEST, "00" * 32)
    other = {**MANIFEST, "checkpoint_file_sha256": "cd" * 32}
    with pytest.raises(ValueError, match="heads.parquet: checkpoint_sha256 is abab"):
        results.require_same_run(path, other)


# ----------------------------------------------------------------------------- tables
def test_every_result_column_is_described_and_written_with_its_description(tmp_path):
    for table in results.TABLES.values():
        assert set(table.descriptions) == set(table.names), table.name
    path = tmp_path / "lanes.parquet"
    results.LANES.write(path, pd.DataFrame(columns=results.LANES.names), {})
    schema = pq.read_schema(path)
    assert schema.names == results.LANES.names
    assert schema.field("lambda_score").metadata[b"description"].decode().startswith("Λ")
    assert schema.field("model").metadata[b"description"].decode().startswith("model config")


def test_columns_refuses_a_column_the_producer_does_not_write():
    assert results.HEADS.columns("layer", "e") == ["layer", "e"]
    with pytest.raises(KeyError, match="heads has no columns \\['N_eff'\\]"):
        results.HEADS.columns("layer", "N_eff")


def test_with_type_keeps_the_task_files_example_id_type():
    table = results.EFFECTS.with_type("example_id", pa.int64())
    assert table.schema.field("example_id").type == pa.int64()
    assert table.schema.names == results.EFFECTS.names
    assert results.EFFECTS.schema.field("example_id").type == pa.int32()  # unchanged


# ----------------------------------------------------------------------------- effects
def test_effects_round_trip_on_a_hand_built_case():
    # 2 examples × 2 layers × 3 heads; drop d = clean − patched
    clean = np.array([1.0, -2.0])
    patched = np.arange(12, dtype=np.float64).reshape(2, 2, 3) / 4
    columns = drops_columns(clean, patched)
    assert columns["example"].tolist() == [0] * 6 + [1] * 6
    assert columns["layer"].tolist() == [0, 0, 0, 1, 1, 1] * 2
    assert columns["head"].tolist() == [0, 1, 2] * 4
    assert columns["effect"][4] == 1.0 - 1.0  # example 0, layer 1, head 1: patched 4/4
    assert columns["effect"][11] == -2.0 - 11 / 4
    rows = pd.DataFrame({"example_id": np.array([7, 3])[columns["example"]], **columns}).sample(
        frac=1.0, random_state=1
    )  # any row order
    ids, d = drops_array(rows.sort_values("example_id", ascending=False, kind="stable"))
    assert ids.tolist() == [7, 3]
    np.testing.assert_array_equal(d, clean[:, None, None] - patched)

    e = d.mean(axis=0)
    grid = matrix_columns(e)
    frame = pd.DataFrame({"layer": grid["layer"], "head": grid["head"], "e": grid["value"]})
    np.testing.assert_array_equal(effect_matrix(frame.iloc[::-1]), e)


def test_effect_conversions_refuse_incomplete_grids():
    frame = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "e": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="one row per \\(layer, head\\) of a 2×2 grid"):
        effect_matrix(frame)
    rows = pd.DataFrame(
        {"example_id": [0, 0, 0], "layer": [0, 0, 1], "head": [0, 1, 0], "effect": [1.0] * 3}
    )
    with pytest.raises(ValueError, match="incomplete"):
        drops_array(rows)


# ----------------------------------------------------------------------------- scripts
#: Stage scripts that run torch and the first call that does torch work.
TORCH_STAGES = {
    "patch_heads": "load_verified(",
    "evaluate_clean": "load_verified(",
    "leakage": "load_verified(",
    "geometry_stats": "load_verified(",
    "export_hf": "load_verified(",
    "param_counts": "count_runs(",
    "tokenize_corpus": "build_corpus(",
}


@pytest.mark.parametrize("stage", sorted(TORCH_STAGES))
def test_torch_stages_take_threads_and_set_them_first(stage):
    text = (HEADS_STAGES / f"{stage}.py").read_text()
    assert '"--threads"' in text and "default=1" in text.split('"--threads"', 1)[1][:40]
    body = text.split("def main(", 1)[1]
    assert 0 <= body.index("set_threads(args.threads)") < body.index(TORCH_STAGES[stage])


def test_a_stage_script_runs_with_the_threads_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")  # restored after the test
    tiny = {"n_layer": 2, "n_head": 4, "d_model": 16, "d_head": 4, "d_mlp": 24, "n_ctx": 16}
    runs = [
        {
            "model": "tiny",
            "seed": 1,
            "repository_name": None,
            "display_name": "tiny",
            "geometry": "learned",
            "corpus": None,
            "model_config": zoo.derive_model_config("learned", tiny),
        }
    ]
    before = torch.get_num_threads()
    try:
        argv = ["--runs-json", json.dumps(runs), "--threads", "2"]
        assert param_counts_stage.main([*argv, "--out", str(tmp_path / "c.parquet")]) == 0
        assert torch.get_num_threads() == 2
        assert Path(tmp_path / "c.parquet").exists()
    finally:
        torch.set_num_threads(before)


def test_no_stage_script_imports_another():
    """A stage script imports the library, never a stage script (its own study's or another's):
    what two stages share lives in the library."""
    paths = [p for d in STAGE_DIRS for p in sorted(d.glob("*.py")) if p.name != "__init__.py"]
    assert len(paths) == 51  # 34 head-geometry stages, 17 SA-MoE stages
    for path in paths:
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        own = sorted(m for m in imported if ".stages" in m)
        assert not own, f"{path.name} imports stage scripts {own}"
