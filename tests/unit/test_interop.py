"""Interop: a `learned` checkpoint as a transformers GPT2LMHeadModel and a TransformerLens
HookedTransformer, and our per-head patching effects against TransformerLens's own
``get_act_patch_attn_head_out_all_pos`` on the same model and examples (docs §10.1)."""

from __future__ import annotations

import ast
import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from headgeom.hashing import content_hash, sha256_file
from headgeom.heads.analysis.patching import patch_all_heads, patch_all_heads_fast
from headgeom.heads.stages import export_hf as export_hf_stage
from headgeom.io import write_manifest
from headgeom.model.checkpoint import save_checkpoint
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT
from headgeom.model.interop import export_hf, require_learned, to_transformer_lens
from tests.helpers.models import LEARNED_VOCAB as N_VOCAB
from tests.helpers.models import learned_model
from tests.tolerances import largest, peer_patch_tolerance, peer_tolerance

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
transformer_lens = pytest.importorskip("transformer_lens", reason="a [dev] extra (benchmark)")


def pairs(n: int, T: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    clean = rng.integers(0, N_VOCAB, (n, T))
    ref = clean.copy()
    for i in range(n):
        t = int(rng.integers(0, T - 1))
        ref[i, t] = (clean[i, t] + 1 + rng.integers(0, N_VOCAB - 1)) % N_VOCAB
    correct = rng.integers(0, N_VOCAB, n)
    incorrect = (correct + 1 + rng.integers(0, N_VOCAB - 1, n)) % N_VOCAB
    return clean, ref, correct, incorrect


@torch.no_grad()
def assert_same_logits(model, peer, ids) -> None:
    """Our forward against a peer's (transformers, TransformerLens) on the same weights:
    independent implementations, 2 (L + 1) stages at the largest |logit|."""
    ours = model(ids)
    out = peer(ids)
    got = out.logits if hasattr(out, "logits") else out
    torch.testing.assert_close(got, ours, atol=peer_tolerance(model, largest(ours)), rtol=0)


def test_hf_export_reproduces_our_logits(tmp_path):
    model = learned_model()
    vocab = np.arange(N_VOCAB, dtype=np.int64) * 11 + 50256 - 11 * 7  # id 7 <-> <|endoftext|>
    out = export_hf(model, vocab, tmp_path / "hf", {"checkpoint_sha256": "ab" * 32})
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "headgeom.json",
        "model.safetensors",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == N_VOCAB and config["eos_token_id"] == 7
    record = json.loads((out / "headgeom.json").read_text())
    assert record["gpt2_ids"] == vocab.tolist()
    assert record["provenance"]["checkpoint_sha256"] == "ab" * 32
    assert_same_logits(model, hf, torch.as_tensor(pairs(4, 9)[0]))
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert fh.metadata() == {"format": "pt"}
        assert "lm_head.weight" not in fh.keys()  # tied to wte


def test_export_script_verifies_the_manifest_and_refuses_other_geometries(tmp_path):
    model = learned_model(seed=2)
    vocab = np.arange(N_VOCAB, dtype=np.int64) + 300
    checkpoint = tmp_path / "model.safetensors"
    save_checkpoint(checkpoint, model, vocab)
    manifest = tmp_path / "manifest.json"
    record = {"config_id": "learned", "checkpoint_file_sha256": sha256_file(checkpoint)}
    write_manifest(manifest, record)
    script = export_hf_stage
    out = tmp_path / "hf"
    argv = ["--checkpoint", str(checkpoint), "--manifest", str(manifest), "--out-dir", str(out)]
    assert script.main(argv) == 0
    meta = json.loads((out / "headgeom.json").read_text())["provenance"]
    assert meta["manifest_content_hash"] == content_hash(record)
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert_same_logits(model, hf, torch.as_tensor(pairs(2, 6)[0]))

    other = tmp_path / "other.safetensors"
    torch.manual_seed(0)
    axis = ModelConfig(
        n_vocab=N_VOCAB, n_ctx=16, n_layer=2, n_head=4, d_model=32, d_head=8, d_mlp=64,
        geometry="write-common-axis",
    )  # fmt: skip
    save_checkpoint(other, GPT(axis), vocab)
    write_manifest(manifest, {"checkpoint_file_sha256": sha256_file(other)})
    argv = ["--checkpoint", str(other), "--manifest", str(manifest), "--out-dir", str(out) + "2"]
    with pytest.raises(ValueError, match="write-common-axis.*only the 'learned' geometry"):
        script.main(argv)
    assert not (tmp_path / "hf2").exists()


@pytest.mark.parametrize("geometry", ["write-common-axis", "read-common", "value384"])
def test_non_learned_geometries_are_refused(geometry):
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_vocab=N_VOCAB, n_ctx=16, n_layer=2, n_head=4, d_model=32, d_head=8, d_mlp=64,
        geometry=geometry,
    )  # fmt: skip
    with pytest.raises(ValueError, match=f"{geometry}.*only the 'learned' geometry"):
        require_learned(GPT(cfg))
    with pytest.raises(ValueError, match="only the 'learned' geometry"):
        to_transformer_lens(GPT(cfg))


def test_multiscreen_is_refused():
    from headgeom.model.multiscreen import MultiscreenConfig
    from headgeom.model.registry import build_model

    cfg = MultiscreenConfig(
        n_vocab=N_VOCAB, n_ctx=16, n_layer=2, n_head=4, d_model=32, d_head=8, d_key=4
    )
    with pytest.raises(ValueError, match="multiscreen"):
        require_learned(build_model(cfg.to_dict()), "ckpt")


def test_transformer_lens_logits_and_no_folding():
    model = learned_model(seed=3)
    tl = to_transformer_lens(model)
    assert tl.cfg.normalization_type == "LN"  # not the folded LNPre
    assert_same_logits(model, tl, torch.as_tensor(pairs(3, 10)[0]))
    # W_O and the unembedding are loaded as they are, not centred
    W_O = tl.blocks[1].attn.W_O.detach()  # (H, d, D)
    ours = model.blocks[1].attn.writer.write_maps().detach()  # (H, D, d)
    torch.testing.assert_close(W_O, ours.transpose(1, 2), atol=0, rtol=0)
    assert W_O.mean(dim=-1).abs().max() > 1e-3
    torch.testing.assert_close(tl.unembed.W_U.detach(), model.wte.weight.detach().T)


@pytest.mark.parametrize("engine", ["fast", "plain"])
def test_head_effects_equal_transformer_lens_patching(engine):
    """effect = clean_ld − patched_ld, patched by TL's ``get_act_patch_attn_head_out_all_pos``:
    TL's "corrupted" run is our clean prompt, its "clean cache" our reference run; the
    metric returns the mean LD over the batch (TL calls ``.item()`` on it), and for single
    examples the per-example LD."""
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    model = learned_model(seed=4)
    tl = to_transformer_lens(model)
    clean, ref, correct, incorrect = pairs(6, 8, seed=5)
    if engine == "fast":
        run = partial(patch_all_heads_fast, max_rows=4096)
    else:
        run = patch_all_heads
    clean_ld, patched = run(model, list(clean), list(ref), correct, incorrect, batch_size=6)
    drops = clean_ld[:, None, None] - patched  # (N, L, H)
    assert np.abs(drops.mean(axis=0)).max() > 1e-2

    def tl_effects(index):
        rows = torch.arange(len(index))
        good, bad = torch.as_tensor(correct[index]), torch.as_tensor(incorrect[index])

        def mean_ld(logits):
            return (logits[rows, -1, good] - logits[rows, -1, bad]).mean()

        c, r = torch.as_tensor(clean[index]), torch.as_tensor(ref[index])
        with torch.no_grad():
            _, ref_cache = tl.run_with_cache(r)
            base = float(mean_ld(tl(c)))
            patched_tl = get_act_patch_attn_head_out_all_pos(tl, c, ref_cache, mean_ld)
        return base - patched_tl.double().numpy()

    # ours and TransformerLens, independent implementations: 2 (L + 1) stages at |logit|
    tol = peer_patch_tolerance(model, clean, ref)
    np.testing.assert_allclose(drops.mean(axis=0), tl_effects(np.arange(6)), atol=tol, rtol=0)
    for i in (0, 3):  # per-example drops
        np.testing.assert_allclose(drops[i], tl_effects(np.array([i])), atol=tol, rtol=0)


#: Where each peer may be imported (inside functions only): TransformerLens is a [dev] peer
#: of the interop checks; transformers also builds the SA-MoE paper study's Hub sources.
PEER_HOMES = {
    "transformer_lens": {"interop.py"},
    "transformers": {"interop.py", "hub.py", "hub_corpus.py", "samoe_import_dense.py"},
}


def test_study_code_never_imports_the_dev_peers():
    """TransformerLens only inside the functions of ``headgeom.model.interop`` that need it,
    transformers also inside those of the SA-MoE Hub wrap, corpus tokenizer and import (so
    importing any module costs nothing), nowhere else in the library or the stage scripts."""
    src = Path(__file__).resolve().parents[2] / "src"
    peers = set(PEER_HOMES)
    for path in sorted(src.glob("*.py")) + sorted((src / "headgeom").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            for peer in names & peers:
                assert path.name in PEER_HOMES[peer], f"{path} imports {peer}"
                assert id(node) not in top_level, f"{path}:{node.lineno} imports at top level"
