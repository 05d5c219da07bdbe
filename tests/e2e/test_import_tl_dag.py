"""An imported model, format tl-gpt2, through the workflow: a TransformerLens state dict
(written from a random workspace model by ``interop.tl_state_dict``, no config.json, no
TransformerLens needed) imported by rule import_model and patched by patch_heads (one task:
the rest of the DAG is the hf-gpt2 one of test_import_dag.py, which reads the same
checkpoint format)."""

from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq
import torch
import yaml
from safetensors.torch import save_file

from headgeom.model.checkpoint import load_verified
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT
from headgeom.model.importing_tl import TL_CONVERSION_VERSION
from headgeom.model.interop import tl_state_dict
from tests.e2e.conftest import REPO, make_workdir, snakemake


def test_a_tl_state_dict_imports_and_is_patched(tmp_path):
    cfg = yaml.safe_load((REPO / "tests" / "e2e" / "import.yaml").read_text())
    cfg["models"]["gpt2-tiny"]["import"] = {"format": "tl-gpt2", "path": "tl-tiny"}
    work = make_workdir(tmp_path / "w", cfg)
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(n_vocab=50257, n_ctx=64, n_layer=2, n_head=2, d_model=16, d_head=8, d_mlp=64)
    )
    (work / "tl-tiny").mkdir()
    weights = work / "tl-tiny" / "model.safetensors"
    save_file(tl_state_dict(model), str(weights))
    results = work / "results" / cfg["study"]
    target = results.relative_to(work) / "patching/gpt2-tiny/s0/sva.parquet"
    snakemake(work, "--cores", "2", str(target))

    run = results / "models" / "gpt2-tiny" / "s0"
    manifest = json.loads((run / "manifest.json").read_text())
    imported = manifest["import"]
    assert imported["format"] == "tl-gpt2"
    assert imported["conversion_version"] == TL_CONVERSION_VERSION
    assert imported["files_sha256"] == {
        "model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest()
    }
    assert imported["tl_config"] is None and imported["assumed"]["act_fn"] == "gelu_new"
    back, vocab, _ = load_verified(run / "model.safetensors", run / "manifest.json")
    assert len(vocab) == 50257 and back.cfg.to_dict() == model.cfg.to_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    effects = pq.read_table(results / "patching/gpt2-tiny/s0/sva.parquet").to_pandas()
    assert effects["layer"].nunique() == 2 and effects["head"].nunique() == 2
