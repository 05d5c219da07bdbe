"""The paper-scale dense source through its two scripts: samoe/stages/import_dense.py on a
``save_pretrained`` directory (no network), then samoe/stages/upcycle.py on what it wrote; and
the clear stop when the weights cannot be had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headgeom.hashing import load_manifest
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.hub import HubSAMoE
from headgeom.samoe.stages import import_dense as samoe_import_dense
from headgeom.samoe.stages import upcycle as samoe_upcycle
from tests.helpers.samoe_hub import dense_lm

REVISION = "93efa2f097d58c2a74874c7e644dbc9b0cee75a2"


def outputs(d: Path) -> list[str]:
    return [f"--checkpoint={d / 'dense.safetensors'}", f"--log={d / 'log.parquet'}",
            f"--manifest={d / 'manifest.json'}"]  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_pretrained_model_is_imported_and_upcycled(tmp_path, family):
    lm = dense_lm(family)
    lm.save_pretrained(tmp_path / "hub")
    cfg = {"family": family, "hf": {"repo_id": str(tmp_path / "hub"), "revision": REVISION}}
    assert samoe_import_dense.main(["--config-json", json.dumps(cfg), *outputs(tmp_path)]) == 0
    manifest = load_manifest(tmp_path / "manifest.json")
    assert manifest["hub"]["revision"] == REVISION
    assert manifest["n_params"] == sum(p.numel() for p in lm.parameters())
    run = {"family": family, "variant": "persistent", "seed": 42, "data_seed": 1,
           "moe": MoEConfig(n_experts=4, state_dim=8).to_dict(), "cpt": {}}  # fmt: skip
    assert samoe_upcycle.main([
        "--config-json", json.dumps(run), f"--dense={tmp_path / 'dense.safetensors'}",
        f"--dense-manifest={tmp_path / 'manifest.json'}", f"--out={tmp_path / 'step0.st'}",
        f"--init-manifest={tmp_path / 'init.json'}"]) == 0  # fmt: skip
    model, vocab, init = load_verified_moe(tmp_path / "step0.st", tmp_path / "init.json")
    assert isinstance(model, HubSAMoE) and len(vocab) == lm.config.vocab_size
    assert init["checks"]["check_K3.copies_mismatches"] == 0
    # the attention of layer 1 is the pretrained one, byte for byte
    assert torch.equal(model.blocks[1].layer.self_attn.q_proj.weight,
                       lm.model.layers[1].self_attn.q_proj.weight)  # fmt: skip


def test_without_the_weights_it_stops_naming_the_source_and_writes_nothing(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    # offline with an empty cache (the constants were read when the library was imported)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg = {"family": "smollm2", "hf": {"repo_id": "HuggingFaceTB/SmolLM2-135M",
                                       "revision": REVISION}}  # fmt: skip
    with pytest.raises(SystemExit, match=rf"cannot load HuggingFaceTB/SmolLM2-135M@{REVISION}"):
        samoe_import_dense.main(["--config-json", json.dumps(cfg), *outputs(tmp_path)])
    assert not any(tmp_path.glob("*.safetensors")) and not (tmp_path / "manifest.json").exists()
