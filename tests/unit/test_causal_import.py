"""Imports of any registered causal LM (formats hf-causal-lm, gguf, hub): the import block's
keys, the import job's checkpoint and manifest (the source record, the hf-causal-lm model
config), the verified checkpoint rebuilding the model with transformers' own logits, the
validation text in the model's own ids, and the study's tasks under the model's tokenizer.

The model is a tiny random grouped-query Llama with its own tokenizer
(``tests.helpers.hf.save_tiny_llama``), written here; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from headgeom.hashing import ManifestMismatchError
from headgeom.heads.stages import make_tasks as make_tasks_stage
from headgeom.io import write_manifest
from headgeom.model import causal_import, facts, importing
from headgeom.model.checkpoint import checkpoint_contents, load_verified, save_checkpoint
from headgeom.model.import_errors import ModelImportError
from headgeom.validation import import_problems
from tests.helpers.models import learned_model

transformers = pytest.importorskip("transformers", reason="a [dev] extra")
E2E = Path(__file__).parents[1] / "e2e"


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.helpers.hf import save_tiny_llama

    folder = tmp_path_factory.mktemp("llama") / "llama-tiny"
    return folder, save_tiny_llama(folder, seed=3)


def run_config(folder) -> dict:
    spec = {"format": "hf-causal-lm", "path": str(folder)}
    return {"model_name": "llama-tiny", "seed": 0, "import": spec,
            "model": causal_import.model_config(spec)}  # fmt: skip


def test_the_causal_lm_formats_are_one_list():
    assert causal_import.FORMATS == importing.CAUSAL_LM_FORMATS == facts.CAUSAL_LM_FORMATS
    assert set(importing.FORMATS) == {"hf-gpt2", "tl-gpt2", "hf-causal-lm", "gguf", "hub"}


@pytest.mark.parametrize(
    ("spec", "kind"),
    [({"format": "hf-causal-lm", "path": "d"}, "directory"),
     ({"format": "gguf", "path": "m.gguf"}, "gguf"),
     ({"format": "hub", "repo_id": "org/m", "revision": "a" * 40}, "hub")],
)  # fmt: skip
def test_each_format_names_its_source(spec, kind):
    assert causal_import.source_of(spec).kind == kind


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"format": "gguf"}, "import format gguf needs path"),
     ({"format": "hf-causal-lm", "path": "d", "revision": "a" * 40}, "and package, not revision"),
     ({"format": "hub", "repo_id": "org/m", "revision": "main"}, "is not pinned"),
     ({"format": "hf-gpt2", "path": "d"}, "not a causal-LM format")],
)  # fmt: skip
def test_a_bad_import_block_is_refused_naming_the_key(spec, message):
    with pytest.raises(ModelImportError, match=message):
        causal_import.source_of(spec)


def test_the_config_check_names_the_model_and_the_keys_of_its_format():
    config = {"models": {
        "a": {"import": {"format": "hub", "path": "x"}},
        "b": {"import": {"format": "gguf", "path": "m.gguf", "repo_id": "o/m"}},
        "c": {"import": {"format": "hf-causal-lm", "path": "d"}},
    }}  # fmt: skip
    assert import_problems(config) == [
        "config models.a.import: format hub takes repo_id and revision; missing repo_id, "
        "revision; not path",
        "config models.b.import: format gguf takes path; not repo_id",
    ]


def test_a_hub_model_says_it_needs_network():
    spec = {"format": "hub", "repo_id": "org/m", "revision": "a" * 40}
    with pytest.raises(ModelImportError, match="needs network"):
        causal_import.model_config(spec)
    assert causal_import.import_files(spec) == []


def test_the_model_config_is_read_without_weights_and_is_portable(llama):
    folder, hf = llama
    cfg = causal_import.model_config({"format": "hf-causal-lm", "path": str(folder)})
    assert cfg["architecture"] == "hf-causal-lm" and cfg["family"] == "llama"
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["d_head"]) == (2, 4, 2, 8)
    assert "_name_or_path" not in cfg["hf_config"]  # no path in the run config
    assert causal_import.context_length(cfg) == 64
    files = causal_import.import_files({"format": "hf-causal-lm", "path": str(folder)})
    names = {Path(f).name for f in files}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names


def test_the_import_job_writes_the_source_record_and_a_checkpoint_that_rebuilds_the_model(
    llama, tmp_path
):
    from headgeom.training.import_job import import_run

    folder, hf = llama
    run = run_config(folder)
    gpt2 = make_tasks_stage.load_tokenizer("gpt2")[0]
    val = np.asarray(gpt2.encode(" the keys and the cabinet are here " * 30).ids)
    ckpt = tmp_path / "model.safetensors"
    manifest, log, _ = import_run(run, ckpt, val, n_ctx=16, batch_size=4)
    imported = manifest["import"]
    assert imported["format"] == "hf-causal-lm" and imported["conversion_version"] == 1
    assert imported["files_sha256"]["model.safetensors"] == sha256(folder / "model.safetensors")
    assert imported["files_sha256"]["tokenizer.json"] == sha256(folder / "tokenizer.json")
    source = imported["source"]
    assert source["family"] == "llama" and source["model_type"] == "llama"
    assert source["conversion"].startswith("cast to float32 by transformers")
    assert set(source["versions"]) >= {"torch", "transformers"}
    assert manifest["config"]["model"]["architecture"] == "hf-causal-lm"
    assert manifest["checkpoint_file_sha256"] == sha256(ckpt)
    assert manifest["n_trainable_params"] == sum(p.numel() for p in hf.parameters())
    assert np.isfinite(manifest["val_loss_nats"]) and manifest["val_loss_nats"] > 0
    assert list(log["step"]) == [0]

    mpath = tmp_path / "manifest.json"
    write_manifest(mpath, manifest)
    model, vocab, _ = load_verified(ckpt, mpath)
    assert (vocab == np.arange(hf.config.vocab_size)).all()
    ids = torch.randint(
        0, hf.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids).logits, rtol=0, atol=0)


def test_a_changed_context_or_size_is_refused(llama, tmp_path):
    from headgeom.training.import_job import import_run

    folder, _ = llama
    run = run_config(folder)
    with pytest.raises(
        ModelImportError, match="max_position_embeddings\\) 64 < the study's n_ctx 65"
    ):
        import_run(run, tmp_path / "c.safetensors", None, n_ctx=65, batch_size=4)
    run["model"] = {**run["model"], "n_kv_head": 4}
    with pytest.raises(ModelImportError, match="changed since the workflow started"):
        import_run(run, tmp_path / "c.safetensors", None, n_ctx=8, batch_size=4)


def test_a_flipped_byte_in_the_causal_lm_checkpoint_is_refused(llama, tmp_path):
    from headgeom.training.import_job import import_run

    folder, _ = llama
    ckpt = tmp_path / "model.safetensors"
    manifest, _, _ = import_run(run_config(folder), ckpt, None, n_ctx=8, batch_size=4)
    write_manifest(tmp_path / "manifest.json", manifest)
    data = bytearray(ckpt.read_bytes())
    data[-5] ^= 0x01
    ckpt.write_bytes(bytes(data))
    with pytest.raises(ManifestMismatchError, match=manifest["checkpoint_file_sha256"]):
        load_verified(ckpt, tmp_path / "manifest.json")


def test_retokenize_gives_the_models_ids_of_the_same_text(llama):
    folder, _ = llama
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    gpt2 = make_tasks_stage.load_tokenizer("gpt2")[0]
    text = "The keys to the cabinet are"
    got = causal_import.retokenize(np.asarray(gpt2.encode(text).ids), tok)
    assert got.tolist() == tok(text, add_special_tokens=False)["input_ids"]
    assert got.tolist() != gpt2.encode(text).ids


def test_our_gpt_checkpoints_keep_their_bytes(tmp_path):
    """Tied-weight copies apply only to shared storages: a GPT's file is what it was."""
    model = learned_model(seed=5)
    vocab = np.arange(model.cfg.n_vocab)
    save_checkpoint(tmp_path / "new.safetensors", model, vocab)
    tensors, header = checkpoint_contents(model, vocab)
    old = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    old["vocab.gpt2_ids"] = tensors["vocab.gpt2_ids"]
    save_file(old, str(tmp_path / "old.safetensors"), metadata=header)
    assert sha256(tmp_path / "new.safetensors") == sha256(tmp_path / "old.safetensors")


# ----------------------------------------------------------------------------- the study
def study_config(folder) -> dict:
    cfg = yaml.safe_load((E2E / "import_llama.yaml").read_text())
    cfg["models"]["llama-tiny"]["import"]["path"] = str(folder)
    return cfg


def test_a_causal_lm_study_builds_its_tasks_with_the_models_tokenizer(llama):
    from headgeom.heads.study import Study

    folder, _ = llama
    study = Study.from_config(study_config(folder))
    assert study.model_config("llama-tiny")["architecture"] == "hf-causal-lm"
    assert study.task_tokenizer == str(folder)
    assert study.make_tasks_config("sva") == {**study.task_config("sva"), "tokenizer": str(folder)}
    assert str(folder / "tokenizer.json") in study.task_tokenizer_files()
    assert str(folder / "model.safetensors") in study.import_inputs("llama-tiny")


def test_the_default_study_keeps_gpt2_tasks():
    from headgeom.heads.study import Study

    cfg = yaml.safe_load((E2E.parents[1] / "config" / "config.yaml").read_text())
    study = Study.from_config(cfg)
    assert study.task_tokenizer is None and study.task_tokenizer_files() == []
    assert all(study.make_tasks_config(t) == study.task_config(t) for t in cfg["tasks"])


def test_a_causal_lm_beside_a_gpt2_vocabulary_model_is_refused(llama):
    from headgeom.heads.study import Study, StudyConfigError

    folder, _ = llama
    cfg = study_config(folder)
    cfg["models"]["learned"] = {"geometry": "learned", "seeds": [0]}
    with pytest.raises(StudyConfigError, match=r"\['learned'\] use GPT-2's vocabulary"):
        Study.from_config(cfg)


def test_make_tasks_takes_the_tokenizer_from_the_config_json(llama, tmp_path):
    folder, _ = llama
    make_tasks = make_tasks_stage
    cfg = {"seed": 3, "splits": {"discovery": 8, "validation": 4, "evaluation": 4, "holdout": 4},
           "tokenizer": str(folder)}  # fmt: skip
    out = tmp_path / "sva.parquet"
    assert (
        make_tasks.main(["--task", "sva", "--config-json", json.dumps(cfg), "--out", str(out)]) == 0
    )
    from headgeom.io import read_parquet_metadata

    meta = read_parquet_metadata(out)
    assert json.loads(meta["tokenizer"])["files_sha256"]["tokenizer.json"] == sha256(
        folder / "tokenizer.json"
    )
    assert "tokenizer" not in json.loads(meta["config"])
    with pytest.raises(SystemExit):
        make_tasks.main(["--task", "sva", "--config-json", json.dumps(cfg),
                         "--tokenizer", "other.json", "--out", str(out)])  # fmt: skip
