"""Leakage (docs §11, §11.8) on transformers causal LMs of several families, through the hook
sites alone (headgeom.heads.analysis.leakage_hooked), against routes written here: the folded read
spaces from the projections' Jacobians and the norm's own outputs, δ from plain hooks on the
output projection, hand-made perturbations inside and orthogonal to a read space, and the
hooked pass against the KV-prefix pass on our GPT."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.data.task_files import PatchInputs  # noqa: E402
from headgeom.heads.analysis import leakage  # noqa: E402
from headgeom.heads.analysis.leakage_hooked import hooked_pass  # noqa: E402
from headgeom.heads.analysis.leakage_sums import Sums  # noqa: E402
from headgeom.heads.analysis.patching import patch_all_heads  # noqa: E402
from headgeom.heads.analysis.stats import effects_from_drops  # noqa: E402
from headgeom.heads.analysis.tolerance import forward_tolerance, model_dtype, rounding_tolerance  # noqa: E402
from headgeom.model import registry  # noqa: E402
from headgeom.model.config import ModelConfig  # noqa: E402
from headgeom.model.gpt import GPT  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from tests.helpers.hf_models import (  # noqa: E402
    V,
    attn_norm,
    fused_slices,
    o_proj,
    projection_modules,
    tiny_family_model,
)
from tests.weights import large_random_weights  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt_neox", "gpt2")  # Gemma: refused below
CENTERED = ("gpt2", "gpt_neox")


def _inputs(seed=0, n=6, T=7, vocab=V) -> PatchInputs:
    rng = np.random.default_rng(seed)
    clean = [rng.integers(1, vocab, T) for _ in range(n)]
    ref = []
    for c in clean:
        r = c.copy()
        r[2:] = rng.integers(1, vocab, T - 2)  # differ from position 2 on
        ref.append(r)
    return PatchInputs(clean, ref, rng.integers(1, vocab, n), rng.integers(1, vocab, n))


def _effects(model, inputs):
    clean_ld, patched = patch_all_heads(model, inputs.clean_ids, inputs.ref_ids,
                                        inputs.correct, inputs.incorrect, 4)  # fmt: skip
    return effects_from_drops(clean_ld[:, None, None] - patched)


@pytest.fixture(scope="module", params=FAMILIES)
def run(request):
    model = HFCausalLM.wrap(tiny_family_model(request.param, seed=5))
    inputs = _inputs()
    e = _effects(model, inputs)
    out = leakage.leakage_table(model, inputs, e, 4, torch.device("cpu"), "effects")
    return request.param, model, inputs, e, out


# ----------------------------------------------------------------------------- read spaces
def _projector(M: np.ndarray) -> np.ndarray:
    """The orthogonal projector onto Im M (M: D × k), by the test's own SVD."""
    u, s, _ = np.linalg.svd(M, full_matrices=False)
    u = u[:, s > 1e-9 * s.max()]
    return u @ u.T


def _folded(model, layer, X, j):
    """P_c diag(γ) W_X^jᵀ (D × d) of head j (a key/value head for K, V) written here: W_X
    from the Jacobian of the projection with respect to its input, γ from the norm's outputs
    (N(x) − N(−x) = 2 γ ⊙ standardised x), P_c the centring of a LayerNorm."""
    family, d, D = model.cfg.family, model.cfg.d_head, model.cfg.d_model
    n = model.cfg.n_head if X == "Q" else model.cfg.n_kv_head
    module = projection_modules(model.hf, layer, X)
    u = torch.randn(D, generator=torch.Generator().manual_seed(9))
    jac = torch.autograd.functional.jacobian(lambda v: module(v[None])[0], u)
    W = jac[fused_slices(family, X, n, d, D)[j]].double().numpy()  # (d, D)
    norm = attn_norm(model.hf, layer)
    x = torch.randn(D, generator=torch.Generator().manual_seed(10)) * 2
    centered = family in CENTERED
    c = x - x.mean() if centered else x
    eps = getattr(norm, "eps", None) or norm.variance_epsilon
    with torch.no_grad():
        gamma = ((norm(x) - norm(-x)) / (2 * c / torch.sqrt((c * c).mean() + eps))).double()
    P = np.eye(D) - np.ones((D, D)) / D if centered else np.eye(D)
    return P @ np.diag(gamma.numpy()) @ W.T


def _kv_of(model, h):
    return next(j for j, group in enumerate(model.cfg.kv_groups) if h in group)


def test_folded_read_spaces_are_the_projections_jacobians_times_the_norms_gain(run):
    _, model, *_ = run
    R = leakage.read_bases(model)
    for layer in range(model.cfg.n_layer):
        for X in ("Q", "K", "V"):
            for h in range(model.cfg.n_head):
                j = h if X == "Q" else _kv_of(model, h)  # K, V: the kv head h reads
                expected = _projector(_folded(model, layer, X, j))
                got = R[layer][X][h] @ R[layer][X][h].T
                # γ here comes from float32 norm outputs (the norms compute in float32):
                # a few ε_32 per entry, amplified by the folded map's conditioning
                assert np.abs(got - expected).max() < 1e-5, (layer, X, h)


def test_a_perturbation_inside_a_read_space_leaks_1_and_one_orthogonal_to_it_0(run):
    _, model, *_ = run
    R = leakage.read_bases(model)
    rng = np.random.default_rng(0)
    M = _folded(model, 2, "Q", 1)  # (D, d): its columns span the reader's read space
    inside = rng.normal(size=(20, M.shape[1])) @ M.T  # rows in Im M
    # orthogonal: rows in the kernel of Mᵀ, the complement of Im M (the test's own SVD)
    _, s, vt = np.linalg.svd(M.T)
    kernel = vt[(s > 1e-9 * s.max()).sum() :]  # (D − rank, D)
    outside = rng.normal(size=(20, kernel.shape[0])) @ kernel
    assert leakage.directional_leakage(inside, R[2]["Q"][1]) == pytest.approx(1.0, abs=1e-10)
    assert leakage.directional_leakage(outside, R[2]["Q"][1]) == pytest.approx(0.0, abs=1e-10)
    # a mixture leaks its energy share in the read space
    mix = np.concatenate([inside, outside])
    share = np.sum(inside**2) / np.sum(mix**2)
    assert leakage.directional_leakage(mix, R[2]["Q"][1]) == pytest.approx(share, abs=1e-10)


# ----------------------------------------------------------------------------- the table
def test_checks_c8_and_c9_pass_and_every_later_reader_has_a_row(run):
    family, model, inputs, e, out = run
    L, H = model.cfg.n_layer, model.cfg.n_head
    assert out.c8.passed and out.c9.passed
    assert out.c9.tolerance <= forward_tolerance(model, 1e3)  # a derived, not a loose, bound
    pairs = sum(H * (L - 1 - layer) * H * 3 for layer in range(L))
    assert len(out.table) == pairs
    finite = out.table["leakage"].dropna()
    assert len(finite) == len(out.table) and finite.between(0, 1).all()
    # attention after rotary positions is not recomputed from the sites: TV is null, never a
    # number (docs §11.8); GPT-2's is softmax(q·k/√d) of its projections: TV is computed
    tv = out.table[leakage.TV_COLUMNS]
    assert tv.notna().all().all() if family == "gpt2" else tv.isna().all().all()
    assert out.table["response_cosine"].notna().all()


def test_gpt2s_total_tv_is_the_attention_transformers_computes_in_the_patched_forward():
    """tv_total of one pair against the attention weights of transformers' eager attention
    (output_attentions) in the forward with the source's z slice swapped by a plain hook."""
    model = HFCausalLM.wrap(tiny_family_model("gpt2", seed=5))
    inputs = _inputs()
    out = leakage.leakage_table(model, inputs, _effects(model, inputs), 4, torch.device("cpu"), "e")
    (src_layer, src_head), (rl, rh), d = (0, 2), (2, 1), model.cfg.d_head
    hf = model.hf
    implementation = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    proj, total = o_proj(hf, src_layer), 0.0
    cols = slice(src_head * d, (src_head + 1) * d)
    try:
        with torch.no_grad():
            for c_ids, r_ids in zip(inputs.clean_ids, inputs.ref_ids, strict=True):
                seen = {}
                handle = proj.register_forward_pre_hook(lambda m, a, s=seen: s.update(z=a[0]))
                hf(input_ids=torch.as_tensor(r_ids[None].astype(np.int64)))
                handle.remove()
                ids = torch.as_tensor(c_ids[None].astype(np.int64))
                a = hf(input_ids=ids, output_attentions=True).attentions[rl][0, rh, -1].double()

                def swap(m, args, z_ref=seen["z"]):
                    z = args[0].clone()
                    z[..., cols] = z_ref[..., cols]
                    return (z,)

                handle = proj.register_forward_pre_hook(swap)
                patched = hf(input_ids=ids, output_attentions=True).attentions[rl][0, rh, -1]
                handle.remove()
                total += 0.5 * float((patched.double() - a).abs().sum()) / len(inputs.clean_ids)
    finally:
        hf.set_attn_implementation(implementation)
    t = out.table
    row = t[(t["source_layer"] == src_layer) & (t["source_head"] == src_head)
            & (t["reader_layer"] == rl) & (t["reader_head"] == rh)].iloc[0]  # fmt: skip
    assert total > 1e-3  # the patch moves the reader's attention
    assert row["tv_total"] == pytest.approx(total, rel=1e-4, abs=1e-7)


def test_leakage_equals_the_pooled_share_of_delta_from_plain_hooks(run):
    """δ of source (0, h) from a plain hook on the output projection (patched − clean output,
    all positions, every example) and the test's own folded read space."""
    family, model, inputs, _, out = run
    src_layer, src_head = 0, 1
    d = model.cfg.d_head
    proj = o_proj(model.hf, src_layer)
    deltas = []
    with torch.no_grad():
        for c_ids, r_ids in zip(inputs.clean_ids, inputs.ref_ids, strict=True):
            seen = {}

            def keep(module, args, output, seen=seen):
                seen["in"] = (args[0], output)

            handle = proj.register_forward_hook(keep)
            model.hf(input_ids=torch.as_tensor(r_ids[None].astype(np.int64)))
            z_ref = seen["in"][0].clone()
            model.hf(input_ids=torch.as_tensor(c_ids[None].astype(np.int64)))
            z, out_clean = seen["in"][0].clone(), seen["in"][1].clone()
            handle.remove()
            cols = slice(src_head * d, (src_head + 1) * d)
            z_patched = z.clone()
            z_patched[..., cols] = z_ref[..., cols]
            deltas.append((proj(z_patched) - out_clean)[0].double().numpy())
    delta = np.concatenate(deltas)  # (examples · positions, D)
    rows = out.table[(out.table["source_layer"] == src_layer)
                     & (out.table["source_head"] == src_head)]  # fmt: skip
    for (rl, rh, X), expected_basis in (
        ((1, 0, "Q"), _folded(model, 1, "Q", 0)),
        ((2, 3, "K"), _folded(model, 2, "K", _kv_of(model, 3))),
        ((2, 2, "V"), _folded(model, 2, "V", _kv_of(model, 2))),
    ):
        P = _projector(expected_basis)
        expected = float(np.sum((delta @ P) * delta) / np.sum(delta**2))
        row = rows[(rows["reader_layer"] == rl) & (rows["reader_head"] == rh)
                   & (rows["read_type"] == X)].iloc[0]  # fmt: skip
        assert row["leakage"] == pytest.approx(expected, abs=1e-6), (rl, rh, X)


def test_the_query_heads_of_one_key_value_group_get_identical_key_and_value_rows(run):
    _, model, _, _, out = run
    t = out.table
    cols = ["leakage", "rho", "pk", "read_dim", "response_cosine", "response_norm_ratio"]
    for group in model.cfg.kv_groups:
        for X in ("K", "V"):
            rows = t[(t["read_type"] == X) & t["reader_head"].isin(group)]
            keyed = rows.set_index(["source_layer", "source_head", "reader_layer", "reader_head"])
            first = keyed.xs(group[0], level="reader_head")[cols]
            for h in group[1:]:
                np.testing.assert_array_equal(keyed.xs(h, level="reader_head")[cols], first)
    if model.cfg.n_kv_head < model.cfg.n_head:  # the query rows of one group differ
        q = t[(t["read_type"] == "Q") & (t["reader_layer"] == 2)]
        a = q[q["reader_head"] == 0]["leakage"].to_numpy()
        b = q[q["reader_head"] == 1]["leakage"].to_numpy()
        assert np.abs(a - b).max() > 1e-3


def test_wrong_stored_effects_fail_check_c9(run):
    _, model, inputs, e, _ = run
    with pytest.raises(ArithmeticError, match="check C9 failed"):
        leakage.leakage_table(model, inputs, e + 0.01, 4, torch.device("cpu"), "effects")


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_is_refused_because_its_post_norm_makes_the_patch_nonlinear(family):
    model = HFCausalLM.wrap(tiny_family_model(family, seed=5))
    with pytest.raises(ValueError, match="post_attention_layernorm.*C8/C9"):
        leakage.require_free_readers(model, "ckpt")
    inputs = _inputs(n=2)
    with pytest.raises(ValueError, match="post_attention_layernorm"):
        leakage.leakage_table(model, inputs, np.zeros((3, 4)), 4, torch.device("cpu"), "e")
    # the reason is real: the residual change of a z patch is not W_O^h (z_ref − z)
    heads = registry.heads_of(model)
    site_z, site_out = "blocks.0.attn.hook_z", "blocks.0.hook_attn_out"
    clean = torch.as_tensor(np.stack(inputs.clean_ids).astype(np.int64))
    ref = torch.as_tensor(np.stack(inputs.ref_ids).astype(np.int64))
    _, cc = model.run_with_cache(clean, [site_z, site_out])
    _, rc = model.run_with_cache(ref, [site_z])

    def swap(z):
        z = z.clone()
        z[:, :, 0] = rc[site_z][:, :, 0]
        return z

    with model.hooks({site_z: swap}):
        _, pc = model.run_with_cache(clean, [site_out])
    w = heads.write_maps(0)[0].double()
    delta = (rc[site_z][:, :, 0] - cc[site_z][:, :, 0]).double() @ w.T
    change = pc[site_out].double() - cc[site_out].double()
    assert (change - delta).abs().max() > 100 * rounding_tolerance(torch.float32, 10.0, 2)


# ----------------------------------------------------------------------------- both routes
def test_the_hooked_pass_equals_the_prefix_pass_on_our_gpt():
    """The route of every transformers model against the KV-prefix route of our GPT, on one
    batch: drops, C8, energies, write-space Grams, responses and TV."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_vocab=23, n_ctx=16, n_layer=3, n_head=3, d_model=24, d_head=8,
                      d_mlp=48, geometry="learned")  # fmt: skip
    model = GPT(cfg)
    large_random_weights(model)
    model.eval()
    inputs = _inputs(seed=2, n=4, vocab=23)
    clean = torch.as_tensor(np.stack(inputs.clean_ids).astype(np.int64))
    ref = torch.as_tensor(np.stack(inputs.ref_ids).astype(np.int64))
    good, bad = torch.as_tensor(inputs.correct), torch.as_tensor(inputs.incorrect)
    heads = registry.heads_of(model)
    U = [[torch.as_tensor(u) for u in layer] for layer in leakage.write_bases(model)]
    dims = [[u.shape[1] for u in layer] for layer in U]
    sums = {name: Sums.empty(3, 3, dims) for name in ("prefix", "hooked")}
    prefix = leakage._batch_pass(model, heads, clean, ref, good, bad, U, sums["prefix"])
    hooked = hooked_pass(model, heads, clean, ref, good, bad, U, sums["hooked"])
    logit_scale = prefix[3]
    assert hooked[3] == pytest.approx(logit_scale)
    tol = forward_tolerance(model, logit_scale)
    assert (prefix[0] - hooked[0]).abs().max() <= tol
    assert (prefix[0]).abs().max() > 1000 * tol  # the drops are not all 0
    c8_tol = rounding_tolerance(model_dtype(model), prefix[2], leakage.C8_STAGES)
    assert prefix[1] <= c8_tol and hooked[1] <= c8_tol
    a, b = sums["prefix"], sums["hooked"]
    np.testing.assert_allclose(b.energy, a.energy, rtol=1e-12)
    for layer in range(3):
        for h in range(3):
            np.testing.assert_allclose(b.gram[layer][h], a.gram[layer][h], rtol=1e-10, atol=1e-12)
    for name in ("dot", "direct_sq", "total_sq"):
        x, y = getattr(a, name), getattr(b, name)
        assert np.abs(x).max() > 0, name
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6 * np.abs(x).max(), err_msg=name)
    assert np.abs(a.tv).max() > 0
    np.testing.assert_allclose(b.tv, a.tv, rtol=0, atol=1e-5)
