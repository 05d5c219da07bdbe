"""Bring your own model, format tl-gpt2: a TransformerLens HookedTransformer state dict
imported as a `learned` checkpoint.

Expectations come from the original model's own bytes (a workspace model exported with
``interop.tl_state_dict``), from the other import path (``interop.export_hf`` → hf-gpt2),
from ``hashlib`` for the file hashes, and — where TransformerLens is installed — from a real
``HookedTransformer``'s own forward pass and own ``state_dict()`` (buffers included). Each
refusal is asserted to name the key at fault. No download anywhere."""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from headgeom.heads.analysis.patching import patch_all_heads_fast
from headgeom.heads.analysis.tolerance import rounding_tolerance
from headgeom.model.gpt import GPT
from headgeom.model.importing import (
    ModelImportError,
    import_hf_gpt2,
    import_inputs,
    import_model,
)
from headgeom.model.importing_tl import TL_CONVERSION_VERSION
from headgeom.model.interop import export_hf, tl_state_dict
from headgeom.training.import_job import import_run
from tests.helpers.models import learned_model
from tests.tolerances import largest

N_VOCAB, L, H, D, DH, M, CTX = 40, 3, 4, 32, 8, 64, 16


def tl_dir(path, state, config=None):
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config, default=str))
    return path


def hand_config(**change):
    """The HookedTransformerConfig fields of learned_model(), written by hand."""
    cfg = {
        "n_layers": L, "d_model": D, "n_heads": H, "d_head": DH, "d_mlp": M,
        "d_vocab": N_VOCAB, "n_ctx": CTX, "act_fn": "gelu_new", "normalization_type": "LN",
        "eps": 1e-5, "positional_embedding_type": "standard", "attn_scale": math.sqrt(DH),
    }  # fmt: skip
    cfg.update(change)
    return {k: v for k, v in cfg.items() if v is not None}


def examples(n: int, T: int, seed: int):
    rng = np.random.default_rng(seed)
    clean = rng.integers(0, N_VOCAB, (n, T))
    ref = clean.copy()
    ref[np.arange(n), rng.integers(0, T - 1, n)] = rng.integers(0, N_VOCAB, n)
    correct = rng.integers(0, N_VOCAB, n)
    return clean, ref, correct, (correct + 1 + rng.integers(0, N_VOCAB - 1, n)) % N_VOCAB


def assert_same_weights(a: GPT, b: GPT) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
        assert sa[k].numpy().tobytes() == sb[k].numpy().tobytes(), k


def assert_logits_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to rounding: ours and TransformerLens are independent implementations, so
    the roundings of both routes' L + 1 stages count, 2 (L + 1) at the largest |logit|
    (``tests.tolerances.peer_tolerance``; these random models' logits reach tens)."""
    assert b.abs().max() > 5.0
    tol = rounding_tolerance(b.dtype, largest(b), 2 * (L + 1))
    torch.testing.assert_close(a, b, atol=tol, rtol=0)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("with_config", [False, True])
def test_round_trip_is_byte_identical_with_identical_patching(tmp_path, with_config):
    model = learned_model(seed=5)
    d = tl_dir(tmp_path / "tl", tl_state_dict(model), hand_config() if with_config else None)
    back, vocab, record = import_model("tl-gpt2", d)
    assert_same_weights(model, back)
    assert back.cfg == model.cfg and back.cfg.geometry == "learned"
    np.testing.assert_array_equal(vocab, np.arange(N_VOCAB))  # identity ids, no compaction
    files = ["config.json", "model.safetensors"] if with_config else ["model.safetensors"]
    assert record["files_sha256"] == {f: sha256(d / f) for f in files}
    assert record["format"] == "tl-gpt2" and record["conversion_version"] == TL_CONVERSION_VERSION
    assert record["pickle"] is False and record["dropped_buffers"] == []
    if with_config:
        assert record["assumed"] == {} and record["sizes_from_shapes"] == []
        assert record["tl_config"] == hand_config()
    else:
        assert record["tl_config"] is None
        assert record["assumed"] == {
            "act_fn": "gelu_new", "normalization_type": "LN",
            "positional_embedding_type": "standard", "eps": 1e-5, "attn_scale": math.sqrt(DH),
        }  # fmt: skip
        assert set(record["sizes_from_shapes"]) == {
            "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"
        }  # fmt: skip
    clean, ref, correct, incorrect = examples(3, 7, seed=6)
    a = patch_all_heads_fast(
        model, list(clean), list(ref), correct, incorrect, batch_size=3, max_rows=4096
    )
    b = patch_all_heads_fast(
        back, list(clean), list(ref), correct, incorrect, batch_size=3, max_rows=4096
    )
    assert np.abs(a[0][:, None, None] - a[1]).max() > 1e-2  # the heads matter
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)


def test_tl_import_equals_the_hf_import_of_the_same_model(tmp_path):
    model = learned_model(seed=8)
    via_tl, _, _ = import_model("tl-gpt2", tl_dir(tmp_path / "tl", tl_state_dict(model)))
    via_hf, _, _ = import_hf_gpt2(export_hf(model, np.arange(N_VOCAB), tmp_path / "hf"))
    assert_same_weights(via_tl, via_hf)
    assert via_tl.cfg == via_hf.cfg


def test_half_precision_weights_are_read_as_float32(tmp_path):
    model = learned_model(seed=9)
    state = {k: v.to(torch.bfloat16) for k, v in tl_state_dict(model).items()}
    back, _, _ = import_model("tl-gpt2", tl_dir(tmp_path / "tl", state))
    for k, v in back.state_dict().items():
        assert v.dtype == torch.float32, k
    assert torch.equal(back.wte.weight, state["embed.W_E"].float())


def test_pickle_is_refused_without_the_opt_in(tmp_path):
    model = learned_model(seed=10)
    d = tmp_path / "tl"
    d.mkdir()
    torch.save(tl_state_dict(model), d / "model.pt")
    with pytest.raises(ModelImportError, match=r"model\.pt.*arbitrary code.*allow_pickle"):
        import_model("tl-gpt2", d)
    with pytest.raises(ModelImportError, match="allow_pickle"):
        import_inputs(d, False, "tl-gpt2")
    back, _, record = import_model("tl-gpt2", d, allow_pickle=True)
    assert_same_weights(model, back)
    assert record["pickle"] is True and record["files_sha256"] == {
        "model.pt": sha256(d / "model.pt")
    }
    assert import_inputs(d, True, "tl-gpt2") == [str(d / "model.pt")]
    torch.save(tl_state_dict(model), d / "pytorch_model.bin")
    with pytest.raises(ModelImportError, match="several pickle"):
        import_model("tl-gpt2", d, allow_pickle=True)


def test_import_inputs_list_every_file_read(tmp_path):
    model = learned_model(seed=11)
    d = tl_dir(tmp_path / "tl", tl_state_dict(model))
    assert import_inputs(d, False, "tl-gpt2") == [str(d / "model.safetensors")]
    (d / "config.json").write_text(json.dumps(hand_config()))
    assert import_inputs(d, False, "tl-gpt2") == [
        str(d / "config.json"),
        str(d / "model.safetensors"),
    ]
    (d / "unrelated.txt").write_text("x")
    _, _, record = import_model("tl-gpt2", d)
    assert set(record["files_sha256"]) == {"config.json", "model.safetensors"}


def test_import_run_writes_a_tl_manifest(tmp_path):
    model = learned_model(seed=12)
    d = tl_dir(tmp_path / "tl", tl_state_dict(model))
    run = {
        "model_name": "tl-tiny", "seed": 0, "model": model.cfg.to_dict(),
        "import": {"format": "tl-gpt2", "path": str(d)},
    }  # fmt: skip
    manifest, log, _ = import_run(run, tmp_path / "ckpt.safetensors", None, n_ctx=8, batch_size=4)
    imported = manifest["import"]
    assert (
        imported["format"] == "tl-gpt2" and imported["conversion_version"] == TL_CONVERSION_VERSION
    )
    assert imported["files_sha256"] == {"model.safetensors": sha256(d / "model.safetensors")}
    assert imported["assumed"]["act_fn"] == "gelu_new" and "hf_config" not in imported
    assert manifest["checkpoint_file_sha256"] == sha256(tmp_path / "ckpt.safetensors")
    assert list(log["step"]) == [0]


def test_a_study_reads_a_tl_model_from_its_shapes(tmp_path):
    from pathlib import Path

    import yaml

    from headgeom.heads.study import Study, StudyConfigError

    d = tl_dir(tmp_path / "tl", tl_state_dict(learned_model(seed=13)))
    cfg = yaml.safe_load((Path(__file__).parents[1] / "e2e" / "import.yaml").read_text())
    cfg["models"]["gpt2-tiny"]["import"] = {"format": "tl-gpt2", "path": str(d)}
    cfg["architecture"]["n_ctx"] = CTX
    study = Study.from_config(cfg)
    mc = study.model_config("gpt2-tiny")
    assert (mc["n_layer"], mc["n_head"], mc["d_head"], mc["d_mlp"], mc["n_vocab"]) == (
        L,
        H,
        DH,
        M,
        N_VOCAB,
    )
    assert study.import_inputs("gpt2-tiny") == [str(d / "model.safetensors")]
    cfg["architecture"]["n_ctx"] = CTX + 1
    with pytest.raises(StudyConfigError, match=r"gpt2-tiny\.import: n_ctx 16 is below"):
        Study.from_config(cfg)
    (d / "config.json").write_text(json.dumps(hand_config(act_fn="relu")))
    with pytest.raises(StudyConfigError, match=r"gpt2-tiny\.import: .*act_fn is 'relu'"):
        Study.from_config(cfg)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "change, message",
    [
        ({"act_fn": "gelu"}, r"act_fn is 'gelu', expected 'gelu_new'"),
        ({"normalization_type": "LNPre"}, r"normalization_type is 'LNPre'.*no_processing"),
        ({"normalization_type": "RMS"}, r"normalization_type is 'RMS', expected 'LN'"),
        ({"layer_norm_folding": True}, r"layer_norm_folding is True.*fold_ln=False"),
        ({"positional_embedding_type": "rotary"}, r"positional_embedding_type is 'rotary'"),
        ({"attn_scale": 1.0}, r"attn_scale is 1\.0, expected sqrt\(d_head\)"),
        ({"use_attn_scale": False}, r"use_attn_scale is False"),
        ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx is True"),
        ({"n_key_value_heads": 2}, r"n_key_value_heads is 2, expected 4"),
        ({"attn_types": ["global", "local"]}, r"attn_types"),
        ({"parallel_attn_mlp": True}, r"parallel_attn_mlp is True"),
        ({"output_logits_soft_cap": 30.0}, r"output_logits_soft_cap is 30\.0"),
        ({"d_vocab_out": 7}, r"d_vocab_out is 7"),
        ({"d_model": 64}, r"embed\.W_E has shape \(40, 32\), expected \(40, 64\) from config"),
        ({"n_ctx": 1024}, r"pos_embed\.W_pos has shape \(16, 32\), expected \(1024, 32\)"),
        ({"some_new_option": True}, r"keys this import does not know: \['some_new_option'\]"),
        ({"d_mlp": "64"}, r"d_mlp = '64' is no integer"),
    ],
)  # fmt: skip
def test_config_values_our_model_does_not_compute_are_named(tmp_path, change, message):
    d = tl_dir(tmp_path / "tl", tl_state_dict(learned_model(seed=14)), hand_config(**change))
    with pytest.raises(ModelImportError, match=message):
        import_model("tl-gpt2", d)


def _drop(*suffixes):
    return lambda s: {k: v for k, v in s.items() if not k.endswith(suffixes)}


def _set(key, fn):
    return lambda s: {**s, key: fn(s[key])}


@pytest.mark.parametrize(
    "edit, message",
    [
        (_drop("ln1.w", "ln1.b", "ln2.w", "ln2.b", "ln_final.w", "ln_final.b"),
         r"no blocks\.0\.ln1\.w.*'LNPre'.*from_pretrained_no_processing"),
        (_set("unembed.W_U", lambda w: w + 1e-3),
         r"unembed\.W_U is not embed\.W_E transposed.*tied.*from_pretrained_no_processing"),
        (_set("unembed.b_U", lambda b: b + 0.5), r"unembed\.b_U is not zero"),
        (_drop("blocks.1.mlp.b_out"), r"lacks \['blocks\.1\.mlp\.b_out'\]"),
        (lambda s: {**s, "blocks.0.mlp.W_gate": s["blocks.0.mlp.W_in"].clone()},
         r"no place for: \['blocks\.0\.mlp\.W_gate'\]"),
        (_drop("pos_embed.W_pos"), r"no pos_embed\.W_pos.*'standard'"),
        (_set("blocks.1.attn.W_K", lambda w: w[:, :, :4]),
         r"blocks\.1\.attn\.W_K has shape \(4, 32, 4\), expected \(4, 32, 8\)"),
        (lambda s: {k: v for k, v in s.items() if not k.startswith("blocks.2.")},
         None),  # two layers: a valid, smaller model (no error)
    ],
)  # fmt: skip
def test_state_dicts_our_model_cannot_hold_are_named(tmp_path, edit, message):
    d = tl_dir(tmp_path / "tl", edit(tl_state_dict(learned_model(seed=15))))
    if message is None:
        assert import_model("tl-gpt2", d)[0].cfg.n_layer == 2
        return
    with pytest.raises(ModelImportError, match=message):
        import_model("tl-gpt2", d)


def test_heads_that_do_not_tile_d_model_are_refused(tmp_path):
    state = tl_state_dict(learned_model(seed=16))
    for k in list(state):  # d_head 8 -> 4: consistent shapes, n_heads·d_head = 16 != 32
        if k.endswith(("W_Q", "W_K", "W_V")):
            state[k] = state[k][:, :, :4]
        elif k.endswith(("b_Q", "b_K", "b_V")):
            state[k] = state[k][:, :4]
        elif k.endswith("W_O"):
            state[k] = state[k][:, :4]
    with pytest.raises(ModelImportError, match=r"n_heads·d_head = 4·4 != d_model 32"):
        import_model("tl-gpt2", tl_dir(tmp_path / "tl", state))


def test_missing_directory_files_and_formats_are_named(tmp_path):
    with pytest.raises(ModelImportError, match="not a directory"):
        import_model("tl-gpt2", tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="no model.safetensors"):
        import_model("tl-gpt2", tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelImportError, match=r"model\.safetensors: not readable"):
        import_model("tl-gpt2", tmp_path / "empty")
    with pytest.raises(ModelImportError, match="format 'tl' is not known; known: hf-gpt2, tl-gpt2"):
        import_model("tl", tmp_path / "empty")


# --------------------------------------------------------------------------- TransformerLens
def _hooked(model_cfg: dict, seed: int):
    """A real HookedTransformer of that size with large random weights, tied unembedding."""
    tl_mod = pytest.importorskip("transformer_lens", reason="a [dev] extra")
    cfg = tl_mod.HookedTransformerConfig(
        n_layers=model_cfg["n_layer"], d_model=model_cfg["d_model"], n_ctx=model_cfg["n_ctx"],
        d_head=model_cfg["d_head"], n_heads=model_cfg["n_head"], d_mlp=model_cfg["d_mlp"],
        d_vocab=model_cfg["n_vocab"], act_fn="gelu_new", normalization_type="LN",
        default_prepend_bos=False, device="cpu", dtype=torch.float32, seed=seed,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tl = tl_mod.HookedTransformer(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in tl.named_parameters():
            p.normal_(1.0 if name.endswith(".w") else 0.0, 0.3 if "embed" not in name else 1.0)
        tl.unembed.W_U.copy_(tl.embed.W_E.T)  # GPT-2: W_U = W_E^T, no bias
        tl.unembed.b_U.zero_()
    return tl.eval()


def test_a_real_hooked_transformer_state_dict_imports_with_its_buffers(tmp_path):
    tl = _hooked(learned_model().cfg.to_dict(), seed=17)
    state = tl.state_dict()
    buffers = sorted(k for k in state if k.endswith(("attn.mask", "attn.IGNORE")))
    assert len(buffers) == 2 * L  # TL 3.x keeps them in state_dict(): handled, not refused
    d = tmp_path / "tl"
    d.mkdir()
    save_file(state, str(d / "model.safetensors"))  # the docs/usage.md recipe
    (d / "config.json").write_text(json.dumps(tl.cfg.to_dict(), default=str))
    model, _, record = import_model("tl-gpt2", d)
    assert sorted(record["dropped_buffers"]) == buffers
    assert record["assumed"] == {}  # TL's full config gives every value
    ids = torch.as_tensor(examples(3, 12, seed=18)[0])
    with torch.no_grad():
        assert_logits_close(model(ids), tl(ids))
    untied = {**state, "unembed.W_U": torch.randn_like(state["unembed.W_U"])}
    save_file(untied, str(d / "model.safetensors"))
    with pytest.raises(ModelImportError, match=r"unembed\.W_U is not embed\.W_E transposed"):
        import_model("tl-gpt2", d)


def test_to_transformer_lens_of_the_import_reproduces_our_logits(tmp_path):
    pytest.importorskip("transformer_lens", reason="a [dev] extra")
    from headgeom.model.interop import to_transformer_lens

    model = learned_model(seed=19)
    back, _, _ = import_model("tl-gpt2", tl_dir(tmp_path / "tl", tl_state_dict(model)))
    tl = to_transformer_lens(back)
    ids = torch.as_tensor(examples(3, 12, seed=20)[0])
    with torch.no_grad():
        assert_logits_close(tl(ids), model(ids))
