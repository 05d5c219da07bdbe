"""The fast patching engine equals the plain one (docs §10.1) for every zoo geometry, with
and without clean-prefix reuse, for multiscreen and under chunking, batching, mixed lengths
and mixed first-difference positions; the prefix reuse really skips the shared prefix; the
approximate attribution mode equals the first-order directional derivative of the patch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.heads.analysis.batching import first_difference, length_batches
from headgeom.heads.analysis.patching import (
    attribution_patch,
    logit_difference,
    patch_all_heads,
    patch_all_heads_fast,
    patch_batch_fast,
    replace_head,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.heads.analysis.tolerance import rounding_tolerance
from headgeom.model import registry
from headgeom.model.gpt import site
from tests.helpers.examples import random_pairs
from tests.helpers.models import N_VOCAB, multiscreen_model, zoo_model
from tests.tolerances import patch_tolerance


def assert_same(model, pairs, batch_size=4, max_rows=4096, **fast_kwargs):
    plain = patch_all_heads(model, *pairs, batch_size=batch_size)
    fast = patch_all_heads_fast(
        model, *pairs, batch_size=batch_size, max_rows=max_rows, **fast_kwargs
    )
    # the engines part at block 0 (batching, resumption): L + 1 stages at the largest |logit|
    tol = patch_tolerance(model, pairs[0], pairs[1])
    for a, b in zip(plain, fast, strict=True):
        assert a.shape == b.shape and b.dtype == np.float64
        np.testing.assert_allclose(b, a, rtol=0, atol=tol)
    drops = plain[0][:, None, None] - plain[1]
    assert np.abs(drops).max() > 1e-3  # the comparison is not vacuous
    return fast


@pytest.mark.parametrize("prefix_reuse", [True, False])
@pytest.mark.parametrize("geometry", sorted(registry.geometry_names("gpt")))
def test_fast_equals_plain_for_every_geometry(geometry, prefix_reuse):
    model = zoo_model(geometry)
    assert supports_fast(model) and supports_prefix_reuse(model)
    pairs = random_pairs(8, (5, 7))
    firsts = {first_difference(c, r) for c, r in zip(pairs[0], pairs[1], strict=True)}
    assert len(firsts) > 2  # one batch mixes first-difference positions
    assert_same(model, pairs, batch_size=8, max_rows=7, prefix_reuse=prefix_reuse)  # cut groups


@pytest.mark.parametrize("prefix_reuse", [True, False])
@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_fast_equals_plain_for_multiscreen(geometry, prefix_reuse):
    model = multiscreen_model(geometry)
    assert supports_fast(model) and supports_prefix_reuse(model)  # the tiles' KV-prefix forward
    pairs = random_pairs(8, (6, 9))
    assert len({first_difference(c, r) for c, r in zip(*pairs[:2], strict=True)}) > 2
    assert_same(model, pairs, batch_size=4, max_rows=5, prefix_reuse=prefix_reuse)


def _late_pairs(n: int, T: int, first: int, seed: int = 5):
    """Pairs of length T whose first difference is at ``first`` or later."""
    rng = np.random.default_rng(seed)
    clean, ref = [], []
    for i in range(n):
        x = rng.integers(0, N_VOCAB, T)
        y = x.copy()
        t = first + i % (T - first)
        y[t] = (x[t] + 1) % N_VOCAB
        clean.append(x)
        ref.append(y)
    return clean, ref, rng.integers(0, N_VOCAB, n), rng.integers(0, N_VOCAB, n)


def test_prefix_reuse_recomputes_only_the_suffix():
    """With clean and reference equal before p, every MLP of the patch runs only positions
    ≥ p, and the last layer's only the final one (counted through ``hook_mlp_out``)."""
    model = zoo_model("learned", seed=4)
    L, T, p = model.cfg.n_layer, 9, 5
    clean, ref, correct, incorrect = _late_pairs(4, T, p)
    widths: dict[int, list[int]] = {j: [] for j in range(L)}

    def counter(j):
        def fn(x):
            widths[j].append(x.shape[1])

        return fn

    c, r = torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    good, bad = torch.as_tensor(correct), torch.as_tensor(incorrect)
    with model.hooks({site(j, "hook_mlp_out"): counter(j) for j in range(L)}):
        clean_ld, patched = patch_batch_fast(model, c, r, good, bad, max_rows=4096)
    # the clean and the reference forward see all T positions; every patched pass T − p,
    # the last layer 1 (one forward per layer: 4·H rows fit in one chunk)
    for j in range(L - 1):
        assert widths[j] == [T, T] + [T - p] * (j + 1), j
    assert widths[L - 1] == [T, T] + [1] * L
    plain = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=4)
    tol = patch_tolerance(model, clean, ref)  # routes part at block 0: L + 1 stages
    np.testing.assert_allclose(clean_ld.numpy(), plain[0], rtol=0, atol=tol)
    np.testing.assert_allclose(patched.numpy(), plain[1], rtol=0, atol=tol)
    assert np.abs(plain[0][:, None, None] - plain[1]).max() > 1e-3


def test_identical_prompts_give_zero_effect_with_prefix_reuse():
    model = zoo_model("all-rotated-self", seed=6)
    clean, _, correct, incorrect = random_pairs(5, (4, 6))
    clean_ld, patched = patch_all_heads_fast(
        model, clean, clean, correct, incorrect, 8, max_rows=4096
    )
    tol = patch_tolerance(model, clean, clean)  # routes part at block 0: L + 1 stages
    np.testing.assert_allclose(patched, np.broadcast_to(clean_ld[:, None, None], patched.shape),
                               rtol=0, atol=tol)  # fmt: skip


def test_suffix_forward_equals_the_full_forward():
    """``Block.forward_suffix`` with the cached prefix keys/values reproduces the block's
    output at the suffix positions (every zoo reader type)."""
    for geometry in ("learned", "read-common", "value384"):
        model = zoo_model(geometry, seed=7)
        ids = torch.as_tensor(np.random.default_rng(0).integers(0, N_VOCAB, (3, 8)))
        names = [site(j, n) for j in range(model.cfg.n_layer)
                 for n in ("hook_resid_pre", "attn.hook_k", "attn.hook_v")]  # fmt: skip
        with torch.no_grad():
            _, cache = model.run_with_cache(ids, names)
            for j, block in enumerate(model.blocks[:-1]):
                x_in = cache[site(j, "hook_resid_pre")]
                x_next = cache[site(j + 1, "hook_resid_pre")]
                # one rounded block between the routes: 4 ulps of the largest value
                tol = rounding_tolerance(torch.float32, float(x_next.abs().max()), 1)
                tol_k = rounding_tolerance(
                    torch.float32, float(cache[site(j, "attn.hook_k")].abs().max()), 1
                )
                for P in (0, 3, 7):
                    k, v = cache[site(j, "attn.hook_k")], cache[site(j, "attn.hook_v")]
                    out, k_s, v_s = block.forward_suffix(x_in[:, P:], k[:, :P], v[:, :P])
                    torch.testing.assert_close(out, x_next[:, P:], atol=tol, rtol=0)
                    torch.testing.assert_close(k_s, k[:, P:], atol=tol_k, rtol=0)
                    last, _, _ = block.forward_suffix(x_in[:, P:], k[:, :P], v[:, :P], True)
                    torch.testing.assert_close(last, x_next[:, -1:], atol=tol, rtol=0)
                    # two row groups share one prefix cache (row g·B + b continues b)
                    twice, _, _ = block.forward_suffix(
                        x_in[:, P:].repeat(2, 1, 1), k[:, :P], v[:, :P]
                    )
                    torch.testing.assert_close(twice, out.repeat(2, 1, 1), atol=tol, rtol=0)
            with pytest.raises(ValueError, match="do not repeat"):
                block.forward_suffix(x_in[:2, 3:], k[:, :3], v[:, :3])


def test_first_difference_and_ordered_batches():
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2, 3]) == 3
    batches = length_batches([3, 5, 3, 3, 5], batch_size=2, order=[2, 0, 0, 1, 9])
    assert [b.tolist() for b in batches] == [[2, 3], [0], [1, 4]]
    assert len(batches) == len(length_batches([3, 5, 3, 3, 5], batch_size=2))


def test_attribution_is_the_first_order_directional_derivative():
    """APPROXIMATE mode: patched_ld − clean_ld estimated as (z_ref − z)·∂LD/∂z equals the
    derivative d/dε LD(z_h + ε(z_ref_h − z_h)) at ε = 0, taken by central differences of
    the plain z patch (float64 model, so the difference quotient is accurate)."""
    model = zoo_model("learned", seed=8).double()
    clean, ref, correct, incorrect = random_pairs(3, (6,), seed=9)
    clean_ld, approx = attribution_patch(model, clean, ref, correct, incorrect, batch_size=3)
    c, r = torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    good, bad = torch.as_tensor(correct), torch.as_tensor(incorrect)
    eps = 1e-5
    with torch.no_grad():
        names = [site(j, "attn.hook_z") for j in range(model.cfg.n_layer)]
        _, zc = model.run_with_cache(c, names)
        _, zr = model.run_with_cache(r, names)
        for j, name in enumerate(names):
            for h in range(model.cfg.n_head):
                lds = []
                for sign in (1, -1):
                    z = zc[name][:, :, h] + sign * eps * (zr[name][:, :, h] - zc[name][:, :, h])
                    with model.hooks({name: replace_head(h, z)}):
                        lds.append(logit_difference(model(c, last_only=True), good, bad))
                derivative = ((lds[0] - lds[1]) / (2 * eps)).numpy()
                np.testing.assert_allclose(approx[:, j, h] - clean_ld, derivative, rtol=1e-5,
                                           atol=1e-7)  # fmt: skip
    exact = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=3)
    np.testing.assert_allclose(clean_ld, exact[0], atol=1e-9)
    # an approximation: it differs from the exact patch on this nonlinear fixture
    assert np.abs(approx - exact[1]).max() > 1e-3


@pytest.mark.parametrize("max_rows", [1, 5, 16, 10_000])
def test_chunking_batching_and_progress(max_rows):
    model = zoo_model("learned", seed=2)
    pairs = random_pairs(7, (5, 8, 6), seed=3)
    reference = patch_all_heads_fast(model, *pairs, batch_size=16, max_rows=4096)
    seen = []
    got = patch_all_heads_fast(model, *pairs, batch_size=2, progress=seen.append, max_rows=max_rows)
    # other batches and chunks: the routes part at block 0, L + 1 stages at the largest |logit|
    tol = patch_tolerance(model, pairs[0], pairs[1])
    for a, b in zip(reference, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=tol)
    n_batches = 2 + 1 + 1  # lengths 5, 6, 8 hold 3, 2, 2 examples; batch size 2
    assert sum(seen) == n_batches * model.cfg.n_layer * model.cfg.n_head


def test_unknown_architecture_falls_back_to_plain():
    model = zoo_model("learned")
    pairs = random_pairs(3, (5,))
    expected = patch_all_heads(model, *pairs, batch_size=4)
    del model.ln_f  # an unembedding the fast engine does not know
    model.ln_f = torch.nn.Identity()
    model.__class__ = type("OtherLM", (torch.nn.Module,), dict(vars(type(model))))
    assert not supports_fast(model)
    got = patch_all_heads_fast(model, *pairs, batch_size=4, max_rows=4096)
    plain = patch_all_heads(model, *pairs, batch_size=4)
    for a, b in zip(plain, got, strict=True):
        np.testing.assert_array_equal(b, a)
    assert not np.allclose(expected[0], got[0])  # it really ran the altered model


def test_input_checks_match_plain():
    model = zoo_model("learned")
    with pytest.raises(ValueError, match="equal length"):
        patch_all_heads_fast(
            model, [np.arange(4)], [np.arange(5)], [0], [1], batch_size=1, max_rows=4096
        )
