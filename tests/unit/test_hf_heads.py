"""Each head's weight maps of every registered transformers family (headgeom.model.hf_weights)
against an extraction written here from the modules themselves: W_O^h by running the output
projection on unit vectors of head h's slice, W_X by the Jacobian of the projection with
respect to its (normed) input, and the norm's gain γ from the norm's own outputs."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.model import registry  # noqa: E402
from headgeom.model.families import FAMILIES  # noqa: E402
from headgeom.model.heads import kv_head_of, query_read_maps  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from tests.helpers.hf_models import (  # noqa: E402
    attn_norm,
    fused_slices,
    o_proj,
    projection_modules,
    tiny_family_model,
)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    return HFCausalLM.wrap(tiny_family_model(request.param, seed=3))


def _gain(norm, x, centered):
    """γ from the norm's outputs alone: N(x) − N(−x) = 2 γ ⊙ s(x), s the standardised x
    (the bias cancels), with the norm's own ε."""
    eps = getattr(norm, "eps", None) or norm.variance_epsilon
    c = x - x.mean() if centered else x
    s = c / torch.sqrt((c * c).mean() + eps)
    return (norm(x) - norm(-x)) / (2 * s)


@torch.no_grad()
def test_write_maps_are_the_output_projection_on_unit_vectors_of_each_head(model):
    heads = registry.heads_of(model)
    H, d = model.cfg.n_head, model.cfg.d_head
    for layer in range(model.cfg.n_layer):
        proj = o_proj(model.hf, layer)
        zero = proj(torch.zeros(1, H * d))[0]
        got = heads.write_maps(layer)
        assert got.shape == (H, model.cfg.d_model, d)
        for h in range(H):
            units = torch.eye(H * d)[h * d : (h + 1) * d]  # (d, H·d): head h's slice
            expected = (proj(units) - zero).T  # (D, d): column i is W_O^h e_i
            torch.testing.assert_close(got[h], expected, rtol=0, atol=1e-6)


def test_read_maps_are_the_jacobian_of_each_heads_projection(model):
    heads = registry.heads_of(model)
    family, d, D = model.cfg.family, model.cfg.d_head, model.cfg.d_model
    u = torch.randn(D, generator=torch.Generator().manual_seed(0))
    for layer in range(model.cfg.n_layer):
        for X in ("Q", "K", "V"):
            n = model.cfg.n_head if X == "Q" else model.cfg.n_kv_head
            module = projection_modules(model.hf, layer, X)
            slices = fused_slices(family, X, n, d, D)
            jac = torch.autograd.functional.jacobian(lambda v, m=module: m(v[None])[0], u)
            got = heads.read_maps(layer, X).detach()
            assert got.shape == (n, d, D)
            for j in range(n):
                torch.testing.assert_close(got[j], jac[slices[j]], rtol=0, atol=1e-6)


@torch.no_grad()
def test_the_read_norm_gain_and_centring_are_the_norms_own(model):
    heads = registry.heads_of(model)
    x = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1)) * 3
    centered = model.cfg.family in ("gpt2", "gpt_neox")  # LayerNorm families
    for layer in range(model.cfg.n_layer):
        fold = heads.read_norm(layer)
        assert fold.centered == centered
        expected = _gain(attn_norm(model.hf, layer), x, centered)
        torch.testing.assert_close(fold.gain.detach(), expected, rtol=1e-4, atol=1e-5)
    # the gains were randomised: a gain of 1 everywhere would not test the convention
    assert (fold.gain - 1).abs().max() > 0.1


@torch.no_grad()
def test_the_reader_rerun_gives_the_sites_values(model):
    heads = registry.heads_of(model)
    ids = torch.randint(1, model.cfg.n_vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    names = [f"blocks.{layer}.{s}" for layer in range(model.cfg.n_layer)
             for s in ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v")]  # fmt: skip
    _, cache = model.run_with_cache(ids, names)
    for layer in range(model.cfg.n_layer):
        q, k, v = heads.read(layer, cache[f"blocks.{layer}.hook_resid_pre"])
        for X, got in zip("qkv", (q, k, v), strict=True):
            assert torch.equal(got, cache[f"blocks.{layer}.attn.hook_{X}"]), (layer, X)


def test_key_value_maps_are_attributed_to_every_query_head_of_their_group(model):
    heads = registry.heads_of(model)
    owner = kv_head_of(model.cfg.kv_groups)
    for X in ("K", "V"):
        per_query = query_read_maps(heads, 0, X)
        per_kv = heads.read_maps(0, X)
        assert per_query.shape[0] == model.cfg.n_head
        for h in range(model.cfg.n_head):
            assert torch.equal(per_query[h], per_kv[owner[h]])
    if model.cfg.n_kv_head < model.cfg.n_head:  # grouped: two query heads share a map
        assert torch.equal(query_read_maps(heads, 0, "K")[0], query_read_maps(heads, 0, "K")[1])


def test_kv_head_of_refuses_groups_that_miss_a_query_head():
    assert kv_head_of(((0, 1), (2, 3))) == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="do not cover"):
        kv_head_of(((0, 1), (3,)))
