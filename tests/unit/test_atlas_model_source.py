"""Our own checkpoints as an atlas model source (headgeom.atlas.model_source, format
``checkpoint``): verified on read (a changed byte is refused naming the file), the learned
model converted to GPT-2 gives our forward's logits, another geometry is refused there and read
as itself for the pair views, and the tokenizer is GPT-2's BPE mapped to the checkpoint's
compact vocabulary, as the demo tokenises its corpus and tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headgeom.atlas import model_source as ms
from headgeom.atlas.stages import inputs
from headgeom.data.corpus import compact
from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer
from headgeom.hashing import ManifestMismatchError, load_manifest
from headgeom.io import read_parquet_metadata, read_table, write_manifest
from headgeom.model.gpt import GPT
from tests.helpers import atlas_checkpoints as ours
from tests.tolerances import largest, peer_tolerance

pytest.importorskip("transformers", reason="the GPT-2 conversion needs transformers [dev]")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A learned run folder and a write-common timeline checkpoint."""
    root = tmp_path_factory.mktemp("ours")
    learned = ours.tiny_gpt("learned", 0)
    ours.write_run(root / "learned" / "s0", learned)
    frozen = ours.tiny_gpt("write-common", 1)
    step = ours.write_checkpoint(root / "wc" / "checkpoints" / "step000008.safetensors", frozen, 8)
    return root, learned, frozen, step


def test_the_checkpoint_and_manifest_of_a_path(tmp_path):
    run = tmp_path / "models" / "learned" / "s42"
    assert ms.checkpoint_paths(run) == (run / "model.safetensors", run / "manifest.json")
    final = run / "model.safetensors"
    assert ms.checkpoint_paths(final) == (final, run / "manifest.json")
    step = run / "checkpoints" / "step000128.safetensors"
    assert ms.checkpoint_paths(step)[1] == run / "checkpoints" / "step000128.manifest.json"
    with pytest.raises(ms.CheckpointSourceError, match="run folder or a .safetensors"):
        ms.checkpoint_paths(run / "model.bin")
    assert ms.model_name({"format": "checkpoint", "path": str(run)}) == "learned/s42"
    assert ms.model_name({"format": "checkpoint", "path": str(step)}) == ("learned/s42/step000128")


def test_the_weights_read_are_the_checkpoints(run):
    root, learned, frozen, step = run
    model, vocab, record = ms.read_checkpoint({"format": "checkpoint", "path": str(step)})
    assert isinstance(model, GPT) and np.array_equal(vocab, ours.demo_vocab())
    own = frozen.state_dict()
    assert all(torch.equal(t, own[n]) for n, t in model.state_dict().items())
    manifest = load_manifest(step.with_name("step000008.manifest.json"))
    assert record["checkpoint_file_sha256"] == manifest["checkpoint_file_sha256"]
    assert record["step"] == 8 and record["geometry"] == "write-common"


def test_a_changed_byte_is_refused_naming_the_file(run, tmp_path):
    root, learned, _, _ = run
    folder = ours.write_run(tmp_path / "run", learned)
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # a weight's byte, past the header
    path.write_bytes(bytes(data))
    spec = {"format": "checkpoint", "path": str(folder)}
    for read in (ms.read_checkpoint, ms.load_tokenizer,
                 lambda s: ms.load_module(s, CPU, convert=True)):  # fmt: skip
        with pytest.raises(ManifestMismatchError, match=rf"{path}: SHA-256 is"):
            read(spec)


def test_a_missing_checkpoint_says_which_study_makes_it(tmp_path):
    spec = {"format": "checkpoint", "path": str(tmp_path / "results" / "demo" / "nothing")}
    with pytest.raises(FileNotFoundError, match="run the default demo first"):
        ms.read_checkpoint(spec)


@torch.no_grad()
def test_the_converted_learned_model_gives_our_logits(run):
    root, learned, _, _ = run
    hf, record = ms.load_module({"format": "checkpoint", "path": str(root / "learned" / "s0")},
                                CPU, convert=True)  # fmt: skip
    assert hf.config.model_type == "gpt2" and "to_hf" in record["conversion"]
    ids = torch.randint(
        0, len(ours.demo_vocab()), (3, 20), generator=torch.Generator().manual_seed(0)
    )
    want = learned(ids)
    got = hf(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=peer_tolerance(learned, largest(want)), rtol=0)


def test_another_geometry_is_refused_for_gpt2_and_read_as_itself(run):
    _, _, frozen, step = run
    spec = {"format": "checkpoint", "path": str(step)}
    with pytest.raises(ValueError, match="write-common.*cannot be exported to GPT-2"):
        ms.load_module(spec, CPU, convert=True)
    model, _ = ms.load_module(spec, CPU, convert=False)
    assert isinstance(model, GPT) and model.cfg.geometry == "write-common"


def test_the_tokenizer_is_gpt2_mapped_to_the_compact_vocabulary(run):
    root, *_ = run
    tok = ms.load_tokenizer({"format": "checkpoint", "path": str(root / "learned" / "s0")})
    gpt2, vocab = load_gpt2_tokenizer(), ours.demo_vocab()
    text = "The singer behind the desk"
    ids = tok.encode(text)
    # model id i is GPT-2 id vocab[i]
    assert vocab[ids].tolist() == gpt2.encode(text).ids
    assert tok.decode(ids) == text
    assert tok.bos_id is None and vocab[tok.eos_id] == EOT_ID
    assert tok.to_model(gpt2.encode(text).ids) == ids
    unknown = gpt2.encode(" Zanzibar").ids
    assert not set(unknown) <= set(vocab.tolist())
    with pytest.raises(ValueError, match="not in the model vocabulary"):
        tok.encode(" Zanzibar")
    assert tok.record["files_sha256"]["vocab.gpt2_ids"] and len(tok.sha256) == 64


def test_tokenizer_files_other_than_the_trained_ones_are_refused(run, tmp_path):
    root, learned, *_ = run
    folder = ours.write_run(tmp_path / "run", learned)
    record = load_manifest(folder / "manifest.json")
    record["data"]["tokenizer_files_sha256"]["vocab.bpe"] = "0" * 64
    write_manifest(folder / "manifest.json", record)
    with pytest.raises(ms.CheckpointSourceError, match="tokenizer file vocab.bpe"):
        ms.load_tokenizer({"format": "checkpoint", "path": str(folder)})


def test_the_inputs_stage_cuts_windows_and_probes_in_the_model_vocabulary(run, tmp_path):
    root, *_ = run
    skills = {"tasks": ["sva"], "n_items": ours.N_ITEMS, "seed": ours.TASK_SEED}
    cfg = {"model": {"format": "checkpoint", "path": str(root / "learned" / "s0")},
           "corpora": [{"name": "demo", "source": "demo", "seed": ours.CORPUS_SEED}],
           "windows": {"n_ctx": 16, "n_mean": 1, "n_scored": 2}, "skills": skills}  # fmt: skip
    out = {k: str(tmp_path / f"{k}.parquet") for k in ("windows", "probes")}
    assert inputs.main(["--config-json", json.dumps(cfg), "--out-windows", out["windows"],
                        "--out-probes", out["probes"]]) == 0  # fmt: skip
    gpt2, vocab = load_gpt2_tokenizer(), ours.demo_vocab()
    windows = read_table(out["windows"]).to_pandas()
    assert len(windows) == 3 and all(len(w) == 16 for w in windows["ids"])
    first = np.concatenate(windows.sort_values("window")["ids"].to_list())
    # the corpus's text, GPT-2-encoded then compacted (no BOS: GPT-2 has none)
    text = gpt2.decode(vocab[first].tolist())
    assert compact(gpt2.encode(text).ids, vocab).tolist()[:40] == first.tolist()[:40]
    probes = read_table(out["probes"]).to_pandas()
    assert len(probes) == ours.N_ITEMS
    assert all(max(p) < len(vocab) for p in probes["prompt"])
    meta = read_parquet_metadata(out["windows"])
    assert json.loads(meta["tokenizer_source"])["format"] == "checkpoint"
