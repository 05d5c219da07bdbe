"""Key/value-head and query-input patching (headgeom.heads.analysis.kv_patching).

* On tiny random grouped-query models (Llama; Qwen3, whose k-norm acts after the projection;
  Gemma 2 with a sliding window and softcapped logits), every engine (fast with and without
  the clean prefix, plain; batches of one and of all, rows cut by max_rows) equals a naive
  loop written here: one full transformers forward per key/value head with forward hooks on
  k_proj and v_proj replacing that head's slices by the reference run's.
* The stage script (heads/stages/patch_kv_heads.py) on an imported grouped-query Llama checkpoint.
* Where every query head has its own key/value head (a multi-head Llama, GPT-2's fused qkv,
  our own GPT), patching the query input and key/value head h together gives head h its
  reference z at every position (its attention reads only its own q, k, v; the norms and the
  rotary act position by position on values that are the reference's), so it equals head h's
  z patch (headgeom.heads.analysis.patching) — while q alone or k, v alone do not.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.hashing import sha256_file  # noqa: E402
from headgeom.heads.analysis.kv_patching import (  # noqa: E402
    KV,
    QUERY,
    is_grouped_query,
    patch_inputs,
    patch_kv_heads,
)
from headgeom.heads.analysis.patching import patch_all_heads  # noqa: E402
from headgeom.heads.analysis.tolerance import forward_tolerance  # noqa: E402
from headgeom.heads.stages import patch_heads as patch_heads_stage  # noqa: E402
from headgeom.heads.stages import patch_kv_heads as patch_kv_heads_stage  # noqa: E402
from headgeom.io import read_parquet_metadata, write_manifest, write_parquet  # noqa: E402
from headgeom.model import causal_import  # noqa: E402
from headgeom.model.checkpoint import load_verified, save_checkpoint  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from headgeom.training.import_job import import_run  # noqa: E402
from tests.helpers.examples import TASK_SCHEMA  # noqa: E402
from tests.helpers.hf import save_tiny_llama  # noqa: E402
from tests.helpers.models import small_gpt  # noqa: E402

V, T, B = 97, 9, 3
SIZES = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
             vocab_size=V, initializer_range=0.2)  # fmt: skip
GQA = {
    "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **SIZES),
    "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **SIZES),
    "gemma2": lambda: transformers.Gemma2Config(
        num_key_value_heads=2, head_dim=8, sliding_window=4, final_logit_softcapping=2.0,
        **SIZES,
    ),
}  # fmt: skip


def _hf(config):
    torch.manual_seed(1234)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _examples(vocab: int):
    """Clean and reference prompts first differing at positions 0, 2 and T − 1."""
    g = torch.Generator().manual_seed(7)
    clean = torch.randint(1, vocab, (B, T), generator=g)
    ref = clean.clone()
    for row, start in enumerate((0, 2, T - 1)):
        shift = 1 + torch.randint(0, vocab - 2, (T - start,), generator=g)  # never 0 mod vocab
        ref[row, start:] = (clean[row, start:] + shift) % vocab
    correct, incorrect = torch.tensor([3, 5, 7]), torch.tensor([11, 13, 17])
    return clean, ref, correct, incorrect


def _ld(logits, correct, incorrect):
    last = logits[:, -1].double()
    return (last.gather(1, correct[:, None]) - last.gather(1, incorrect[:, None]))[:, 0]


@torch.no_grad()
def _naive_kv(hf, clean, ref, correct, incorrect) -> np.ndarray:
    """Patched LD (B, L, n_kv): the k_proj / v_proj outputs of the reference run, then one
    clean forward per key/value head with both outputs' head slices replaced by hooks."""
    cfg = hf.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = hf.model.layers
    ref_out = {}
    handles = [
        getattr(layer.self_attn, f"{x}_proj").register_forward_hook(
            lambda m, a, out, key=(i, x): ref_out.__setitem__(key, out.clone())
        )
        for i, layer in enumerate(layers)
        for x in "kv"
    ]
    hf(input_ids=ref)
    for h in handles:
        h.remove()
    out = np.empty((len(clean), len(layers), cfg.num_key_value_heads))
    for i, layer in enumerate(layers):
        for j in range(cfg.num_key_value_heads):
            cols = slice(j * d, (j + 1) * d)

            def swap(m, a, o, key, cols=cols):
                o = o.clone()
                o[..., cols] = ref_out[key][..., cols]
                return o

            handles = [
                getattr(layer.self_attn, f"{x}_proj").register_forward_hook(
                    lambda m, a, o, key=(i, x), swap=swap: swap(m, a, o, key)
                )
                for x in "kv"
            ]
            out[:, i, j] = _ld(hf(input_ids=clean).logits, correct, incorrect).numpy()
            for h in handles:
                h.remove()
    return out


@pytest.mark.parametrize("family", sorted(GQA))
def test_key_value_head_patching_equals_naive_hooks_on_k_and_v_proj(family):
    hf = _hf(GQA[family]())
    model = HFCausalLM.wrap(hf)
    assert is_grouped_query(model) and model.cfg.kv_groups == ((0, 1), (2, 3))
    clean, ref, correct, incorrect = _examples(V)
    naive = _naive_kv(hf, clean, ref, correct, incorrect)
    with torch.no_grad():
        logits = hf(input_ids=clean).logits
    clean_naive = _ld(logits, correct, incorrect).numpy()
    tol = forward_tolerance(model, float(logits.abs().max()))
    args = (clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist())
    runs = [dict(engine="plain"), dict(prefix_reuse=False, max_rows=3), dict(max_rows=3)]
    for kwargs in runs:
        for batch_size in (1, B):
            clean_ld, patched = patch_kv_heads(
                model, *args, batch_size=batch_size, **{"max_rows": 4096, **kwargs}
            )
            assert patched.shape == (B, 2, 2)
            assert np.abs(clean_ld - clean_naive).max() <= tol
            assert np.abs(patched - naive).max() <= tol, (kwargs, batch_size)
    assert np.abs(clean_naive[:, None, None] - naive).max() > 1000 * tol  # effects are real


GPT2 = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=V, initializer_range=0.2)
NON_GQA = {
    "llama-mha": lambda: HFCausalLM.wrap(
        _hf(transformers.LlamaConfig(num_key_value_heads=4, **SIZES))
    ),
    "gpt2": lambda: HFCausalLM.wrap(_hf(transformers.GPT2Config(**GPT2))),
    "gpt-learned": lambda: small_gpt("learned"),
}


@pytest.mark.parametrize("name", sorted(NON_GQA))
def test_patching_q_k_v_of_a_head_together_is_its_z_patch(name):
    model = NON_GQA[name]()
    vocab = model.cfg.n_vocab
    clean, ref, correct, incorrect = _examples(min(vocab, V))
    args = (clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist())
    assert not is_grouped_query(model)
    clean_ld, z_patched = patch_all_heads(model, *args, batch_size=B)
    with torch.no_grad():
        scale = float(model(clean).abs().max())
    tol = forward_tolerance(model, scale)
    for kwargs in (dict(engine="plain"), dict(prefix_reuse=False), dict(max_rows=5)):
        kwargs = {"max_rows": 4096, **kwargs}
        ld, qkv = patch_inputs(model, *args, batch_size=B, sites=(*QUERY, *KV), **kwargs)
        assert np.abs(ld - clean_ld).max() <= tol
        assert np.abs(qkv - z_patched).max() <= tol, kwargs
    # each part alone is another patch: q alone and k, v alone move the answer otherwise
    _, q_only = patch_inputs(model, *args, batch_size=B, sites=QUERY, max_rows=4096)
    _, kv_only = patch_inputs(model, *args, batch_size=B, sites=KV, max_rows=4096)
    assert np.abs(q_only - z_patched).max() > 1000 * tol
    assert np.abs(kv_only - z_patched).max() > 1000 * tol
    assert np.abs(clean_ld[:, None, None] - z_patched).max() > 1000 * tol


def test_sites_of_different_head_counts_are_refused_together():
    model = HFCausalLM.wrap(_hf(GQA["llama"]()))
    clean, ref, correct, incorrect = _examples(V)
    with pytest.raises(ValueError, match="different head counts"):
        patch_inputs(model, clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist(),
                     batch_size=B, sites=(*QUERY, *KV), max_rows=4096)  # fmt: skip


# ----------------------------------------------------------------------------- the stage
def _task_file(path, clean, ref, correct, incorrect, splits):
    n = len(clean)
    columns = {"example_id": list(range(n)), "split": splits, "condition": ["SS"] * n,
               "lexical_group": ["g0"] * n, "clean_ids": clean.tolist(),
               "ref_ids": ref.tolist(), "diff_position": [3] * n,
               "correct_id": correct.tolist(), "incorrect_id": incorrect.tolist()}  # fmt: skip
    table = pa.table(columns).cast(TASK_SCHEMA)
    write_parquet(path, table, TASK_SCHEMA, metadata={"dataset_sha256": "ab" * 32})


def _stage_args(ckpt, manifest, task, out, *extra):
    return ["--checkpoint", str(ckpt), "--manifest", str(manifest), "--task", str(task),
            "--splits", "discovery,evaluation", "--batch-size", "2", "--max-rows", "4096",
            "--model-name", "llama", "--seed", "0", "--task-name", "sva", "--device", "cpu",
            "--out", str(out), *extra]  # fmt: skip


def test_the_stage_writes_every_key_value_head_with_its_query_heads(tmp_path):
    """heads/stages/patch_kv_heads.py on an imported grouped-query Llama: one row per (split,
    example, layer, kv head), the drops of the engine on the verified checkpoint, the query
    heads of each kv head, the clean LD of patch_heads, and the provenance metadata; a GPT
    checkpoint (no key/value heads of its own) is refused."""
    folder = tmp_path / "llama"
    save_tiny_llama(folder, seed=3)
    spec = {"format": "hf-causal-lm", "path": str(folder)}
    run = {"model_name": "llama-tiny", "seed": 0, "import": spec,
           "model": causal_import.model_config(spec)}  # fmt: skip
    ckpt, manifest_path = tmp_path / "model.safetensors", tmp_path / "manifest.json"
    manifest, _, _ = import_run(run, ckpt, None, n_ctx=16, batch_size=4)
    write_manifest(manifest_path, manifest)
    model, _, _ = load_verified(ckpt, manifest_path)
    n_vocab = model.cfg.n_vocab
    rng = np.random.default_rng(5)
    clean = rng.integers(0, n_vocab, (5, 7))
    ref = clean.copy()
    ref[:, 3] = (clean[:, 3] + 1) % n_vocab
    correct, incorrect = rng.integers(0, n_vocab, 5), rng.integers(0, n_vocab, 5)
    splits = {"discovery": [0, 1], "evaluation": [2, 3, 4]}
    task = tmp_path / "sva.parquet"
    _task_file(task, clean, ref, correct, incorrect, ["discovery"] * 2 + ["evaluation"] * 3)
    out, heads_out = tmp_path / "kv.parquet", tmp_path / "heads.parquet"
    assert patch_kv_heads_stage.main(_stage_args(ckpt, manifest_path, task, out)) == 0
    assert (
        patch_heads_stage.main(
            _stage_args(ckpt, manifest_path, task, heads_out, "--mode", "resample")
        )
        == 0
    )

    rows = pq.read_table(out).to_pandas()
    L, n_kv = model.cfg.n_layer, model.cfg.n_kv_head
    assert (L, n_kv) == (2, 2) and len(rows) == 5 * L * n_kv
    expected_groups = [[0, 1] if j == 0 else [2, 3] for j in rows["kv_head"]]
    assert [list(q) for q in rows["query_heads"]] == expected_groups
    np.testing.assert_array_equal(rows["effect"], rows["clean_ld"] - rows["patched_ld"])
    # the stage's numbers are the plain engine's on the verified model, split by split
    with torch.no_grad():
        scale = float(model(torch.as_tensor(np.concatenate([clean, ref]))).abs().max())
    tol = forward_tolerance(model, scale)
    for split, ids in splits.items():
        _, patched = patch_kv_heads(model, clean[ids].tolist(), ref[ids].tolist(),
                                    correct[ids].tolist(), incorrect[ids].tolist(),
                                    batch_size=2, engine="plain", max_rows=4096)  # fmt: skip
        part = rows[rows["split"] == split].sort_values(["example_id", "layer", "kv_head"])
        assert np.abs(part["patched_ld"].to_numpy() - patched.reshape(-1)).max() <= tol
    heads = pq.read_table(heads_out).to_pandas()
    np.testing.assert_array_equal(
        rows.groupby("example_id")["clean_ld"].first(),
        heads.groupby("example_id")["clean_ld"].first(),
    )
    meta = read_parquet_metadata(out)
    assert meta["analysis"] == "patch_kv_heads" and meta["n_kv_heads"] == "2"
    assert meta["checkpoint_sha256"] == manifest["checkpoint_file_sha256"]
    assert "attn.hook_k" in meta["patch_site"] and "[[0, 1], [2, 3]]" in meta["kv_groups"]
    assert "stacked key/value heads" in meta["engine_paths"]

    gpt = small_gpt("learned")  # one key and value per query head: refused, named
    gpt_ckpt, gpt_manifest = tmp_path / "gpt.safetensors", tmp_path / "gpt.json"
    save_checkpoint(gpt_ckpt, gpt, np.arange(gpt.cfg.n_vocab))
    write_manifest(gpt_manifest, {"checkpoint_file_sha256": sha256_file(gpt_ckpt)})
    argv = _stage_args(gpt_ckpt, gpt_manifest, task, tmp_path / "gpt.parquet")
    with pytest.raises(SystemExit, match="gpt.safetensors: a GPT has no key/value heads"):
        patch_kv_heads_stage.main(argv)
