"""The whole micro DAG on one imported GPT-2 (a random tiny GPT2LMHeadModel written
locally; nothing is downloaded), its manifest, and the hash gate on its checkpoint."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
import yaml

from headgeom.hashing import ManifestMismatchError, sha256_file
from headgeom.heads.stages import evaluate_clean as evaluate_clean_stage
from headgeom.model.checkpoint import load_verified
from headgeom.model.importing import CONVERSION_VERSION
from tests.e2e.conftest import REPO, copy_of, make_workdir, snakemake

pytest.importorskip("transformers", reason="building the tiny GPT-2 needs transformers [dev]")
TASKS = ("sva", "quote", "plural")


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory):
    from tests.helpers.hf import save_tiny

    cfg = yaml.safe_load((REPO / "tests" / "e2e" / "import.yaml").read_text())
    work = make_workdir(tmp_path_factory.mktemp("import") / "w", cfg)
    save_tiny(work / "gpt2-tiny", seed=0)
    snakemake(work, "--cores", "2")
    return work, cfg


def test_the_whole_dag_runs_on_the_imported_model(imported_run):
    work, cfg = imported_run
    results = work / "results" / cfg["study"]
    run = results / "models" / "gpt2-tiny" / "s0"
    for t in ("table2", "table6", "leakage", "lanes"):
        assert (results / "tables" / f"{t}.md").exists(), t
    for stage in ("eval", "patching", "concentration", "leakage", "lanes"):
        for task in TASKS:
            assert pq.read_table(results / stage / "gpt2-tiny" / "s0" / f"{task}.parquet").num_rows
    assert not (run / "train_log.parquet").with_name("resume").exists()
    effects = pq.read_table(results / "patching" / "gpt2-tiny" / "s0" / "sva.parquet").to_pandas()
    assert effects["layer"].nunique() == 2 and effects["head"].nunique() == 2
    table2 = (results / "tables" / "table2.csv").read_text()
    assert "gpt2-tiny" in table2


def test_manifest_records_every_imported_file_and_the_conversion(imported_run):
    work, cfg = imported_run
    run = work / "results" / cfg["study"] / "models" / "gpt2-tiny" / "s0"
    record = json.loads((run / "manifest.json").read_text())
    assert record["checkpoint_file_sha256"] == sha256_file(run / "model.safetensors")
    imported = record["import"]
    assert imported["format"] == "hf-gpt2"
    assert imported["conversion_version"] == CONVERSION_VERSION
    src = work / "gpt2-tiny"
    assert imported["files_sha256"] == {
        name: sha256_file(src / name) for name in ("config.json", "model.safetensors")
    }
    assert record["step"] == 0 and record["val_loss_nats"] > 0
    model, vocab, _ = load_verified(run / "model.safetensors", run / "manifest.json")
    assert model.cfg.n_vocab == len(vocab) == 50257 and (vocab == range(50257)).all()


def test_a_changed_byte_in_the_imported_checkpoint_is_refused(imported_run, tmp_path):
    work, cfg = imported_run
    results = work / "results" / cfg["study"]
    run = results / "models" / "gpt2-tiny" / "s0"
    bad = tmp_path / "model.safetensors"
    shutil.copy(run / "model.safetensors", bad)
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0x01
    bad.write_bytes(bytes(data))
    expected = sha256_file(run / "model.safetensors")
    with pytest.raises(ManifestMismatchError) as err:
        evaluate_clean_stage.main(
            ["--checkpoint", str(bad), "--manifest", str(run / "manifest.json"),
             "--task", str(results / "tasks" / "sva.parquet"), "--out", str(tmp_path / "e.parquet")]
        )  # fmt: skip
    message = str(err.value)
    assert str(bad) in message and expected in message and sha256_file(bad) in message


#: Every rule whose script loads a checkpoint (``load_verified``) in the micro DAG.
CHECKPOINT_READERS = ("evaluate_clean", "patch_heads", "leakage", "geometry_stats", "clamps")


@pytest.mark.parametrize("rule", CHECKPOINT_READERS)
def test_every_analysis_refuses_a_changed_byte_in_the_imported_checkpoint(
    imported_run, tmp_path, rule
):
    """The real rule, rerun (``--forcerun R --until R``) on a copy of the finished study whose
    imported checkpoint has one flipped byte (its mtime kept, so Snakemake does not
    re-import it): every job fails, naming the file and both hashes, and leaves no output."""
    work, cfg = imported_run
    copy = copy_of(work, tmp_path / "w")
    results = copy / "results" / cfg["study"]
    checkpoint = results / "models" / "gpt2-tiny" / "s0" / "model.safetensors"
    expected, stat = sha256_file(checkpoint), checkpoint.stat()
    data = bytearray(checkpoint.read_bytes())
    data[-3] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    actual = sha256_file(checkpoint)
    shutil.rmtree(results / "logs" / rule)
    proc = snakemake(
        copy, "--cores", "2", "--keep-going", "--rerun-triggers", "mtime",
        "--forcerun", rule, "--until", rule, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    logs = sorted((results / "logs" / rule).glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text()
        assert "ManifestMismatchError" in text, log
        assert str(checkpoint.relative_to(copy)) in text, log
        assert expected in text and actual in text, log
    stage = {"evaluate_clean": "eval", "patch_heads": "patching", "geometry_stats": "geometry"}
    stage = stage.get(rule, rule)
    if (results / stage).is_dir():
        # the rule's own outputs (<task>.parquet, ...), not other rules' (<task>.<mode>.parquet)
        left = [
            p for p in (results / stage / "gpt2-tiny").rglob("*.parquet") if p.name.count(".") == 1
        ]
        assert not left, stage
