"""Every registered transformers family on a tiny random model: our wrapper's logits are
transformers' own, its layers resumed from a cached residual (whole sequences, or a suffix
against the clean prefix) give transformers' own logits, and head / key-value-head patches
through our sites and by the fast engine equal plain torch hooks written here on the modules
themselves (one forward per head).

The models are ``tests.helpers.hf.tiny_family_config``'s: sliding-window layers (Gemma 2/3,
Mistral, the Qwen layers past ``max_window_layers``) see 4 < T keys and Gemma's logits are
softcapped at 2, so a resumption that got a layer's mask or the final softcapping wrong fails
here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.hashing import canonical_json  # noqa: E402
from headgeom.heads.analysis.patching import (  # noqa: E402
    patch_all_heads,
    patch_all_heads_fast,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.heads.analysis.tolerance import forward_tolerance, rounding_tolerance  # noqa: E402
from headgeom.model import registry  # noqa: E402
from headgeom.model.families import FAMILIES, UnsupportedFamilyError  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from tests.helpers.hf import TINY_VOCAB, tiny_family_config  # noqa: E402

T, B = 9, 3
V = TINY_VOCAB
_config = tiny_family_config


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


def _naive_head_patching(hf, clean, ref, correct, incorrect) -> np.ndarray:
    """Patched LD (B, L, H): o_proj's input captured on the reference run, then one clean
    forward per head with that head's slice replaced by a forward pre-hook."""
    cfg = HFCausalLM.wrap(hf).cfg
    L, H, d = cfg.n_layer, cfg.n_head, cfg.d_head
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
    naive = np.empty((len(clean), L, H))
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
    return naive


@torch.no_grad()
def test_every_query_head_patch_equals_a_plain_hook_on_the_output_projection(case):
    family, hf, clean, ref, correct, incorrect = case
    model = HFCausalLM.wrap(hf)
    naive = _naive_head_patching(hf, clean, ref, correct, incorrect)
    clean_ld, patched = patch_all_heads(
        model, clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist(), batch_size=B
    )
    tol = forward_tolerance(model, float(hf(input_ids=clean).logits.abs().max()))
    expected_clean = _ld(hf(input_ids=clean).logits, correct, incorrect).numpy()
    assert np.abs(clean_ld - expected_clean).max() <= tol
    assert np.abs(patched - naive).max() <= tol
    # the comparison can fail: the effects are far above the tolerance
    assert np.abs(clean_ld[:, None, None] - naive).max() > 1000 * tol


@pytest.mark.parametrize("prefix_reuse", [True, False])
@torch.no_grad()
def test_the_fast_engine_equals_the_naive_hook_loop(case, prefix_reuse):
    """Layer resumption, stacked rows (max_rows 5 cuts the heads × examples into several
    forwards) and, with prefix_reuse, the clean prefix's keys/values: examples whose first
    differing position is 0 (no prefix), 2, and T − 1 (every later layer runs one position),
    each its own batch (batch_size 1), and all three in one batch."""
    family, hf, clean, ref, correct, incorrect = case
    model = HFCausalLM.wrap(hf)
    assert supports_fast(model) and supports_prefix_reuse(model)
    ref = ref.clone()
    ref[0, 0] = (clean[0, 0] + 1) % V  # differs from position 0
    ref[2, : T - 1] = clean[2, : T - 1]  # differs at the last position only
    ref[2, T - 1] = (clean[2, T - 1] + 1) % V
    naive = _naive_head_patching(hf, clean, ref, correct, incorrect)
    expected_clean = _ld(hf(input_ids=clean).logits, correct, incorrect).numpy()
    tol = forward_tolerance(model, float(hf(input_ids=clean).logits.abs().max()))
    args = (clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist())
    for batch_size in (1, B):
        clean_ld, patched = patch_all_heads_fast(
            model, *args, batch_size=batch_size, max_rows=5, prefix_reuse=prefix_reuse
        )
        assert np.abs(clean_ld - expected_clean).max() <= tol
        assert np.abs(patched - naive).max() <= tol, (batch_size, np.abs(patched - naive).max())
    assert np.abs(expected_clean[:, None, None] - naive).max() > 1000 * tol


@torch.no_grad()
def test_the_fast_engine_equals_the_plain_one_with_fixed_replacements(case):
    """Mean / zero ablation (a fixed z per head at every position, so nothing of the clean
    prefix is reused): the fast engine equals the plain one."""
    family, hf, clean, ref, correct, incorrect = case
    model = HFCausalLM.wrap(hf)
    torch.manual_seed(5)
    replacement = torch.randn(model.cfg.n_layer, model.cfg.n_head, model.cfg.d_head)
    args = (clean.tolist(), ref.tolist(), correct.tolist(), incorrect.tolist())
    plain = patch_all_heads(model, *args, batch_size=B, replacement=replacement)
    fast = patch_all_heads_fast(model, *args, batch_size=B, max_rows=5, replacement=replacement)
    tol = forward_tolerance(model, float(hf(input_ids=clean).logits.abs().max()))
    assert np.abs(fast[1] - plain[1]).max() <= tol
    assert np.abs(plain[0][:, None, None] - plain[1]).max() > 1000 * tol


@torch.no_grad()
def test_resumed_layers_give_transformers_own_logits(case):
    """From the cached residual entering any layer l: the layers on whole sequences, or
    ``after_z`` on the cached z and ``forward_suffix`` against the clean prefix's cached
    keys/values from any position p, then ``answer_logits`` of every vocabulary id, equal
    transformers' forward; so do ``after_attn`` of ``attn.writer`` and ``attn.z_suffix``."""
    family, hf, clean, *_ = case
    model = HFCausalLM.wrap(hf)
    L = model.cfg.n_layer
    names = [f"blocks.{layer}.{s}" for layer in range(L)
             for s in ("hook_resid_pre", "attn.hook_z", "attn.hook_k", "attn.hook_v")]  # fmt: skip
    _, cache = model.run_with_cache(clean, names)
    expected = hf(input_ids=clean).logits[:, -1]
    every_id = torch.arange(V).expand(B, V)
    tol = forward_tolerance(model, float(expected.abs().max()))

    def at(layer, name):
        return cache[f"blocks.{layer}.{name}"]

    for layer in range(L):
        x = at(layer, "hook_resid_pre")
        for block in model.blocks[layer:]:
            x = block(x)
        assert (model.answer_logits(x, every_id) - expected).abs().max() <= tol
        for p in (0, 3, T - 1):
            x, z = at(layer, "hook_resid_pre")[:, p:], at(layer, "attn.hook_z")[:, p:]
            block = model.blocks[layer]
            x_z = block.after_z(x, z)
            assert (block.after_attn(x, block.attn.writer(z)) - x_z).abs().max() <= tol
            if layer > 0:  # the attention's z from the prefix's keys/values
                past = at(layer, "attn.hook_k")[:, :p], at(layer, "attn.hook_v")[:, :p]
                z_suffix, _, _ = block.attn.z_suffix(block.hook_resid_pre(x), *past)
                assert (z_suffix - z).abs().max() <= tol
            x = x_z
            for j in range(layer + 1, L):
                past = at(j, "attn.hook_k")[:, :p], at(j, "attn.hook_v")[:, :p]
                x, _, _ = model.blocks[j].forward_suffix(x, *past, last_only=j == L - 1)
            assert (model.answer_logits(x, every_id) - expected).abs().max() <= tol
    # not vacuous: the windows and Gemma's softcapping change the logits
    unbounded = {"sliding_window": 64, "final_logit_softcapping": None}
    config = type(hf.config)(**{**hf.config.to_dict(), **unbounded})
    wide = transformers.AutoModelForCausalLM.from_config(config).eval()
    wide.load_state_dict(hf.state_dict())
    changed = (wide(input_ids=clean).logits[:, -1] - expected).abs().max()
    assert (changed > 1000 * tol) == (family in ("gemma2", "gemma3", "mistral", "qwen2", "qwen3"))


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


def test_the_wrapper_holds_each_weight_once_under_the_transformers_names(case):
    # a checkpoint is the wrapper's state dict: exactly the transformers model's, each
    # tensor under its own name once (no second copy through a view of the layers)
    family, hf, *_ = case
    wrapped = HFCausalLM.wrap(hf).state_dict()
    assert list(wrapped) == [f"hf.{name}" for name in hf.state_dict()], family


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


@torch.no_grad()
def test_a_prefix_is_taken_again_when_its_tensors_or_the_attention_change():
    """``prefix_keys_values`` keeps its last answer for the same tensors only: a prefix
    changed in place, another prefix of the same shape, or the attention's key norm changed
    in place (Qwen3 normalises keys before the rotary) gives the answer computed afresh."""
    torch.manual_seed(1234)
    hf = transformers.AutoModelForCausalLM.from_config(_config("qwen3")).eval()
    model = HFCausalLM.wrap(hf)
    block = model.blocks[1]
    past_k, past_v = torch.randn(2, 3, model.cfg.n_kv_head, model.cfg.d_head).unbind(0)
    past_k, past_v = past_k[None].repeat(2, 1, 1, 1), past_v[None].repeat(2, 1, 1, 1)

    def fresh(k, v):  # a new block view: nothing kept
        return type(block)(model, 1).prefix_keys_values(k.clone(), v.clone())

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    first = block.prefix_keys_values(past_k, past_v)
    assert same(first, fresh(past_k, past_v))
    assert block.prefix_keys_values(past_k, past_v) is first  # kept
    past_k.mul_(2)  # in place: a new version
    assert same(block.prefix_keys_values(past_k, past_v), fresh(past_k, past_v))
    other = past_k + 1  # same shape, other memory
    assert same(block.prefix_keys_values(other, past_v), fresh(other, past_v))
    k_norm = block.attn_module.k_norm.weight
    k_norm.mul_(3)
    changed = block.prefix_keys_values(other, past_v)
    assert same(changed, fresh(other, past_v))
    k_norm.div_(3)
    assert not torch.equal(changed[0], block.prefix_keys_values(other, past_v)[0])


@torch.no_grad()
def test_the_last_layer_at_its_final_position_equals_its_whole_suffix(case):
    """``forward_suffix(last_only=True)`` (the final position's output projection and MLP
    only) returns what the layer's single forward on the whole suffix gives at the final
    position, and the same suffix keys/values (within round-off: two products, not one); a
    hook on one of the layer's sites sees the whole suffix at once."""
    family, hf, clean, *_ = case
    model = HFCausalLM.wrap(hf)
    j = model.cfg.n_layer - 1
    names = [f"blocks.{j}.{s}" for s in ("hook_resid_pre", "attn.hook_k", "attn.hook_v")]
    _, cache = model.run_with_cache(clean, names)
    tol = forward_tolerance(model, float(cache[names[0]].abs().max()))
    for p in (0, 3):
        x = cache[names[0]][:, p:]
        past = cache[names[1]][:, :p], cache[names[2]][:, :p]
        whole, k, v = model.blocks[j].forward_suffix(x, *past)
        last, k1, v1 = model.blocks[j].forward_suffix(x, *past, last_only=True)
        assert last.shape == (B, 1, model.cfg.d_model)
        assert (last - whole[:, -1:]).abs().max() <= tol
        assert (k1 - k).abs().max() <= tol and (v1 - v).abs().max() <= tol
        widths: list[int] = []
        with model.hooks({f"blocks.{j}.hook_mlp_out": lambda t, w=widths: w.append(t.shape[1])}):
            hooked, _, _ = model.blocks[j].forward_suffix(x, *past, last_only=True)
        assert widths == [T - p] and (hooked - last).abs().max() <= tol
