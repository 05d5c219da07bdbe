"""Bring your own model: a transformers GPT2LMHeadModel directory imported as a `learned`
checkpoint.

Every expectation comes from a peer: transformers' own forward pass, TransformerLens built
from the HF weights with TL's own converter (``convert_gpt2_weights``, not our code), and
the bytes of a checkpoint exported by ``interop.export_hf``. No download anywhere."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headgeom.heads.analysis.patching import patch_all_heads_fast
from headgeom.model.importing import ModelImportError, import_hf_gpt2, import_model
from headgeom.model.interop import export_hf
from tests.helpers.hf import save_tiny
from tests.helpers.models import learned_model
from tests.tolerances import largest, peer_patch_tolerance, peer_tolerance

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
transformer_lens = pytest.importorskip("transformer_lens", reason="a [dev] extra")

V = 50257


def examples(n: int, T: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    clean = rng.integers(0, V, (n, T))
    ref = clean.copy()
    ref[np.arange(n), rng.integers(0, T - 1, n)] = rng.integers(0, V, n)
    correct = rng.integers(0, V, n)
    incorrect = (correct + 1 + rng.integers(0, V - 1, n)) % V
    return clean, ref, correct, incorrect


@torch.no_grad()
def assert_logits_equal_transformers(model, hf, ids) -> None:
    """Our forward against transformers' on the same weights: independent implementations,
    2 (L + 1) rounded stages at the largest |logit| (``tests.tolerances.peer_tolerance``)."""
    want = hf(ids).logits
    tol = peer_tolerance(model, largest(want))
    torch.testing.assert_close(model(ids), want, atol=tol, rtol=0)


def test_imported_logits_equal_transformers(tmp_path):
    hf = save_tiny(tmp_path / "gpt2")
    model, vocab, record = import_hf_gpt2(tmp_path / "gpt2")
    assert model.cfg.geometry == "learned" and model.cfg.n_vocab == V
    np.testing.assert_array_equal(vocab, np.arange(V))  # the full GPT-2 vocabulary
    assert set(record["files_sha256"]) == {"config.json", "model.safetensors"}
    ids = torch.as_tensor(examples(3, 12)[0])
    assert_logits_equal_transformers(model, hf, ids)


def test_head_patch_effects_equal_transformer_lens_on_the_same_weights(tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = save_tiny(tmp_path / "gpt2", seed=2)
    model, _, _ = import_hf_gpt2(tmp_path / "gpt2")
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=64, d_head=8, n_heads=2, d_mlp=64, d_vocab=V,
        act_fn="gelu_new", normalization_type="LN", default_prepend_bos=False,
        original_architecture="GPT2LMHeadModel", device="cpu", dtype=torch.float32,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tl = HookedTransformer(cfg)
    state = tl.state_dict()
    state.update(convert_gpt2_weights(hf, cfg))  # TL's own GPT-2 conversion
    tl.load_state_dict(state, strict=True)
    tl.eval()

    clean, ref, correct, incorrect = examples(4, 8, seed=3)
    clean_ld, patched = patch_all_heads_fast(
        model, list(clean), list(ref), correct, incorrect, batch_size=4, max_rows=4096
    )
    drops = clean_ld[:, None, None] - patched
    assert np.abs(drops).max() > 1e-2
    # ours and TransformerLens, independent implementations: 2 (L + 1) stages at |logit|
    tol = peer_patch_tolerance(model, clean, ref)
    for i in range(4):
        idx = [i]
        good, bad = torch.as_tensor(correct[idx]), torch.as_tensor(incorrect[idx])

        def ld(logits, good=good, bad=bad):
            return (logits[0, -1, good] - logits[0, -1, bad]).sum()

        c, r = torch.as_tensor(clean[idx]), torch.as_tensor(ref[idx])
        with torch.no_grad():
            _, cache = tl.run_with_cache(r)
            base = float(ld(tl(c)))
            tl_patched = get_act_patch_attn_head_out_all_pos(tl, c, cache, ld)
        np.testing.assert_allclose(drops[i], base - tl_patched.double().numpy(), rtol=0, atol=tol)


def test_export_import_round_trip_is_byte_identical(tmp_path):
    model = learned_model(seed=5)
    vocab = np.arange(model.cfg.n_vocab, dtype=np.int64)
    out = export_hf(model, vocab, tmp_path / "hf")
    back, _, _ = import_hf_gpt2(out)
    ours, theirs = model.state_dict(), back.state_dict()
    assert list(ours) == list(theirs)
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype
        assert ours[k].numpy().tobytes() == theirs[k].numpy().tobytes(), k
    assert back.cfg == model.cfg
    clean, ref, correct, incorrect = examples(3, 7, seed=6)
    clean, ref = clean % model.cfg.n_vocab, ref % model.cfg.n_vocab
    correct, incorrect = correct % model.cfg.n_vocab, (correct + 1) % model.cfg.n_vocab
    a = patch_all_heads_fast(
        model, list(clean), list(ref), correct, incorrect, batch_size=3, max_rows=4096
    )
    b = patch_all_heads_fast(
        back, list(clean), list(ref), correct, incorrect, batch_size=3, max_rows=4096
    )
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)


def test_prefixless_keys_and_untied_copy_of_lm_head_are_read(tmp_path):
    hf = save_tiny(tmp_path / "gpt2", seed=7)
    w = load_file(str(tmp_path / "gpt2" / "model.safetensors"))
    from safetensors.torch import save_file

    plain = {k.removeprefix("transformer."): v.contiguous() for k, v in w.items()}
    plain["lm_head.weight"] = plain["wte.weight"].clone()
    save_file(plain, str(tmp_path / "gpt2" / "model.safetensors"))
    model, _, _ = import_hf_gpt2(tmp_path / "gpt2")
    ids = torch.as_tensor(examples(1, 5)[0])
    assert_logits_equal_transformers(model, hf, ids)


def test_pickle_only_weights_need_the_opt_in(tmp_path):
    hf = save_tiny(tmp_path / "gpt2", seed=8)  # transformers 5 writes safetensors only
    (tmp_path / "gpt2" / "model.safetensors").unlink()
    torch.save(hf.state_dict(), tmp_path / "gpt2" / "pytorch_model.bin")
    with pytest.raises(ModelImportError, match="pickle.*arbitrary code.*allow_pickle"):
        import_hf_gpt2(tmp_path / "gpt2")
    model, _, record = import_hf_gpt2(tmp_path / "gpt2", allow_pickle=True)
    assert record["pickle"] is True and "pytorch_model.bin" in record["files_sha256"]
    ids = torch.as_tensor(examples(1, 5)[0])
    assert_logits_equal_transformers(model, hf, ids)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "llama"}, "model_type is 'llama', not 'gpt2'"),
        ({"n_head": None}, "lacks n_head"),
        ({"activation_function": "relu"}, "activation_function is 'relu'"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ],
)
def test_a_directory_that_is_not_gpt2_is_named(tmp_path, change, message):
    save_tiny(tmp_path / "m", seed=9)
    path = tmp_path / "m" / "config.json"
    config = json.loads(path.read_text())
    for k, v in change.items():
        config.pop(k) if v is None else config.__setitem__(k, v)
    path.write_text(json.dumps(config))
    with pytest.raises(ModelImportError, match=message):
        import_hf_gpt2(tmp_path / "m")


def test_missing_files_and_formats_are_named(tmp_path):
    with pytest.raises(ModelImportError, match="not a directory"):
        import_hf_gpt2(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="no config.json"):
        import_hf_gpt2(tmp_path / "empty")
    save_tiny(tmp_path / "m", seed=10)
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(ModelImportError, match="no model.safetensors"):
        import_hf_gpt2(tmp_path / "m")
    with pytest.raises(ModelImportError, match="format 'tl' is not known"):
        import_model("tl", tmp_path / "m")
