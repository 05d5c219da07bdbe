"""Every registered transformers family on a tiny random model: our wrapper's logits are
transformers' own, and head / key-value-head patches through our sites equal plain torch hooks
written here on the modules themselves (one forward per head)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.hashing import canonical_json  # noqa: E402
from headgeom.heads.analysis.patching import patch_all_heads, patch_all_heads_fast  # noqa: E402
from headgeom.heads.analysis.tolerance import forward_tolerance, rounding_tolerance  # noqa: E402
from headgeom.model import registry  # noqa: E402
from headgeom.model.families import FAMILIES, UnsupportedFamilyError  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402

V, T, B = 97, 9, 3
# initializer_range 0.2: effects well above float32 round-off on 32-wide models
SIZES = dict(num_hidden_layers=2, intermediate_size=64, vocab_size=V, initializer_range=0.2)
GQA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, **SIZES)


def _config(family: str):
    return {
        "llama": lambda: transformers.LlamaConfig(**GQA),
        "qwen2": lambda: transformers.Qwen2Config(**GQA),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **GQA),
        "mistral": lambda: transformers.MistralConfig(**GQA),
        "gemma2": lambda: transformers.Gemma2Config(head_dim=8, **GQA),
        "gemma3": lambda: transformers.Gemma3TextConfig(head_dim=8, **GQA),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(
            hidden_size=32, num_attention_heads=4, **SIZES
        ),
        "gpt2": lambda: transformers.GPT2Config(
            n_embd=32,
            n_head=4,
            n_layer=2,
            vocab_size=V,
            n_positions=64,
            initializer_range=0.2,
            bos_token_id=0,
            eos_token_id=0,
        ),
    }[family]()


# Written here from each model's source, not from the family records: the layer list and
# each layer's output projection (its input: z, head-major) and k / v outputs.
def _layers(hf):
    root = {"gpt_neox": "gpt_neox.layers", "gpt2": "transformer.h"}
    return hf.get_submodule(root.get(hf.config.model_type, "model.layers"))


def _o_proj(hf, layer):
    block = _layers(hf)[layer]
    return {"gpt_neox": lambda: block.attention.dense, "gpt2": lambda: block.attn.c_proj}.get(
        hf.config.model_type, lambda: block.self_attn.o_proj
    )()


def _kv_slices(hf, j, d):
    """(k, v) slices of kv head j in a projection output: separate k/v outputs for the Llama
    kinds, GPT-2's [q | k | v], GPT-NeoX's per-head [q k v]."""
    D = hf.config.hidden_size
    if hf.config.model_type == "gpt2":
        return slice(D + j * d, D + (j + 1) * d), slice(2 * D + j * d, 2 * D + (j + 1) * d)
    if hf.config.model_type == "gpt_neox":
        base = j * 3 * d
        return slice(base + d, base + 2 * d), slice(base + 2 * d, base + 3 * d)
    return slice(j * d, (j + 1) * d), None


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request):
    torch.manual_seed(1234)
    hf = transformers.AutoModelForCausalLM.from_config(_config(request.param)).eval()
    g = torch.Generator().manual_seed(7)
    clean = torch.randint(1, V, (B, T), generator=g)
    ref = clean.clone()
    ref[:, 2:] = torch.randint(1, V, (B, T - 2), generator=g)
    correct, incorrect = torch.tensor([3, 5, 7]), torch.tensor([11, 13, 17])
    return request.param, hf, clean, ref, correct, incorrect


def _ld(logits, correct, incorrect):
    last = logits[:, -1].double()
    return last.gather(1, correct[:, None])[:, 0] - last.gather(1, incorrect[:, None])[:, 0]


def test_every_family_is_registered_and_its_logits_are_transformers_own(case):
    family, hf, clean, *_ = case
    model = HFCausalLM.wrap(hf)
    assert model.cfg.family == family
    assert registry.architecture_of(model).name == "hf-causal-lm"
    with torch.no_grad():
        expected = hf(input_ids=clean).logits
        out = hf(input_ids=clean, output_hidden_states=True)
        assert torch.equal(model(clean), expected)
        # last_only unembeds one row: the routes part at the unembedding (one stage)
        last = model(clean, last_only=True)
        tol = rounding_tolerance(torch.float32, float(expected.abs().max()), stages=1)
        assert (last - expected[:, -1]).abs().max() <= tol
        # identity replacements on every site leave the forward's bytes unchanged
        with model.hooks({n: (lambda x: x.clone()) for n in model.site_names()}):
            assert torch.equal(model(clean), expected)
        _, cache = model.run_with_cache(clean, model.site_names())
    assert set(cache) == set(model.site_names())
    # the residual entering layer l is transformers' hidden_states[l]
    for layer in range(model.cfg.n_layer):
        assert torch.equal(cache[f"blocks.{layer}.hook_resid_pre"], out.hidden_states[layer])
    # every site's shape is its declared axes' sizes
    sizes = {"batch": B, "position": T, "head": model.cfg.n_head, "d_head": model.cfg.d_head,
             "kv_head": model.cfg.n_kv_head, "d_model": model.cfg.d_model}  # fmt: skip
    axes = registry.architecture_of(model).sites
    for name, value in cache.items():
        site = name.split(".", 2)[-1] if name.startswith("blocks.") else name
        assert tuple(value.shape) == tuple(sizes[a] for a in axes[site]), name


@torch.no_grad()
def test_every_query_head_patch_equals_a_plain_hook_on_the_output_projection(case):
    family, hf, clean, ref, correct, incorrect = case
    model = HFCausalLM.wrap(hf)
    L, H, d = model.cfg.n_layer, model.cfg.n_head, model.cfg.d_head

    # naive: capture o_proj's input on the reference run, then one clean forward per head with
    # that head's slice replaced by a forward pre-hook
    ref_z = {}
    handles = [
        _o_proj(hf, layer).register_forward_pre_hook(
            lambda m, args, layer=layer: ref_z.__setitem__(layer, args[0].clone())
        )
        for layer in range(L)
    ]
    hf(input_ids=ref)
    for h in handles:
        h.remove()
    naive = np.empty((B, L, H))
    for layer in range(L):
        for head in range(H):
            cols = slice(head * d, (head + 1) * d)

            def swap(m, args, layer=layer, cols=cols):
                z = args[0].clone()
                z[..., cols] = ref_z[layer][..., cols]
                return (z,)

            handle = _o_proj(hf, layer).register_forward_pre_hook(swap)
            naive[:, layer, head] = _ld(hf(input_ids=clean).logits, correct, incorrect).numpy()
            handle.remove()

    clean_ld, patched = patch_all_heads(
        model, clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist(), batch_size=B
    )
    tol = forward_tolerance(model, float(hf(input_ids=clean).logits.abs().max()))
    expected_clean = _ld(hf(input_ids=clean).logits, correct, incorrect).numpy()
    assert np.abs(clean_ld - expected_clean).max() <= tol
    assert np.abs(patched - naive).max() <= tol
    # the fast engine's entry point looks the model up in the registry: no fast_patching
    # declared, so it runs the plain engine, byte for byte
    fast = patch_all_heads_fast(
        model,
        clean.tolist(),
        ref.tolist(),
        correct.tolist(),
        incorrect.tolist(),
        batch_size=B,
        max_rows=4096,
    )
    np.testing.assert_array_equal(fast[1], patched)
    # the comparison can fail: the effects are far above the tolerance
    assert np.abs(clean_ld[:, None, None] - naive).max() > 1000 * tol


@torch.no_grad()
def test_each_key_value_head_patch_equals_plain_hooks_on_the_k_and_v_projections(case):
    family, hf, clean, ref, correct, incorrect = case
    model = HFCausalLM.wrap(hf)
    L, n_kv, d = model.cfg.n_layer, model.cfg.n_kv_head, model.cfg.d_head
    names = [f"blocks.{layer}.attn.hook_{x}" for layer in range(L) for x in "kv"]
    _, ref_cache = model.run_with_cache(ref, names)
    fused = family in ("gpt2", "gpt_neox")

    def projections(layer):
        block = _layers(hf)[layer]
        if fused:
            return [block.attn.c_attn if family == "gpt2" else block.attention.query_key_value]
        return [block.self_attn.k_proj, block.self_attn.v_proj]

    # the reference run's projection outputs, captured by plain forward hooks
    ref_out = {}
    handles = [
        p.register_forward_hook(lambda m, a, out, key=(layer, i): ref_out.__setitem__(key, out))
        for layer in range(L)
        for i, p in enumerate(projections(layer))
    ]
    hf(input_ids=ref)
    for h in handles:
        h.remove()

    worst = biggest = 0.0
    for layer in range(L):
        for j in range(n_kv):
            k_cols, v_cols = _kv_slices(hf, j, d)
            handles = []
            for i, p in enumerate(projections(layer)):

                def swap(m, a, out, key=(layer, i), parts=(k_cols, v_cols) if fused else (k_cols,)):
                    out = out.clone()
                    for cols in parts:
                        out[..., cols] = ref_out[key][..., cols]
                    return out

                handles.append(p.register_forward_hook(swap))
            naive = _ld(hf(input_ids=clean).logits, correct, incorrect)
            for h in handles:
                h.remove()

            def put(name, j=j):
                def fn(x):
                    x = x.clone()
                    x[:, :, j] = ref_cache[name][:, :, j]
                    return x

                return fn

            site = [f"blocks.{layer}.attn.hook_k", f"blocks.{layer}.attn.hook_v"]
            with model.hooks({n: put(n) for n in site}):
                ours = _ld(model(clean), correct, incorrect)
            worst = max(worst, float((ours - naive).abs().max()))
            biggest = max(biggest, float((naive - _ld(hf(input_ids=clean).logits, correct,
                                                       incorrect)).abs().max()))  # fmt: skip
    tol = forward_tolerance(model, float(hf(input_ids=clean).logits.abs().max()))
    assert worst <= tol
    assert biggest > 1000 * tol


@torch.no_grad()
def test_a_key_value_head_reaches_exactly_the_query_heads_its_group_names(case):
    family, hf, clean, ref, *_ = case
    model = HFCausalLM.wrap(hf)
    layer = model.cfg.n_layer - 1
    k, z = f"blocks.{layer}.attn.hook_k", f"blocks.{layer}.attn.hook_z"
    _, ref_cache = model.run_with_cache(ref, [k])
    _, clean_cache = model.run_with_cache(clean, [z])
    for j, group in enumerate(model.cfg.kv_groups):

        def put(x, j=j):
            x = x.clone()
            x[:, :, j] = ref_cache[k][:, :, j]
            return x

        with model.hooks({k: put}):
            _, patched = model.run_with_cache(clean, [z])
        moved = {h for h in range(model.cfg.n_head)
                 if not torch.equal(patched[z][:, :, h], clean_cache[z][:, :, h])}  # fmt: skip
        assert moved == set(group)
    assert sum(len(g) for g in model.cfg.kv_groups) == model.cfg.n_head


def test_the_registry_rebuilds_a_wrapped_model_from_its_config_dict(case):
    family, hf, clean, *_ = case
    cfg = HFCausalLM.wrap(hf).cfg
    stored = json.loads(canonical_json(cfg.to_dict()))  # as a run config or manifest holds it
    assert registry.config_from_dict(stored) == cfg
    rebuilt = registry.build_model(stored).eval()
    assert type(rebuilt) is HFCausalLM and rebuilt.cfg.kv_groups == cfg.kv_groups
    rebuilt.hf.load_state_dict(hf.state_dict())
    with torch.no_grad():
        assert torch.equal(rebuilt(clean), hf(input_ids=clean).logits)


def test_an_unsupported_model_type_is_refused_naming_what_is_missing():
    with pytest.raises(UnsupportedFamilyError, match="model_type 'falcon' has no family record"):
        HFCausalLM.wrap(transformers.FalconForCausalLM(transformers.FalconConfig(
            hidden_size=32, num_attention_heads=4, num_hidden_layers=1, vocab_size=V)))  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(_config("llama"))
    del hf.model.norm
    with pytest.raises(UnsupportedFamilyError, match="declares module 'model.norm', which"):
        HFCausalLM.wrap(hf)


def test_an_unknown_site_is_refused_with_the_known_ones():
    torch.manual_seed(0)
    model = HFCausalLM.wrap(transformers.AutoModelForCausalLM.from_config(_config("gpt_neox")))
    with pytest.raises(KeyError, match="blocks.0.hook_resid_mid"):  # parallel residual: none
        with model.hooks({"blocks.0.hook_resid_mid": lambda x: x}):
            pass
