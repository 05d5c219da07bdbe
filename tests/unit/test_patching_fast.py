"""The fast patching engine equals the plain one (METHODS §10.1) for every zoo geometry,
for multiscreen and under chunking, batching and mixed lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom import zoo
from headgeom.heads import GEOMETRIES
from headgeom.multiscreen import MultiscreenConfig, build_multiscreen
from headgeom.patching import patch_all_heads, patch_all_heads_fast, supports_fast

TINY = dict(n_layer=3, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
TINY_ROUTED = dict(n_layer=3, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16)
N_VOCAB = 29
ATOL = 1e-5


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random trainable weights large enough that every head moves the answer."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 0:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if "ln" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.startswith(("wte", "wpe")):
                p.copy_(noise)
            else:
                p.copy_(0.3 * noise)
    return model.eval()


def zoo_model(geometry: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    arch = TINY_ROUTED if geometry.startswith("write-routed") else TINY
    model = zoo.build_model(zoo.derive_model_config(geometry, arch, {}), N_VOCAB)
    return perturbed(model, seed)


def multiscreen_model(geometry: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = MultiscreenConfig(
        n_vocab=N_VOCAB, n_ctx=24, n_layer=3, n_head=4, d_model=32, d_head=8, d_key=4,
        geometry=geometry, window_init_max=8.0, mipe_threshold=16.0,
    )  # fmt: skip
    return build_multiscreen(cfg).eval()


def random_pairs(n: int, lengths: tuple[int, ...], seed: int = 1):
    rng = np.random.default_rng(seed)
    clean, ref = [], []
    for i in range(n):
        T = lengths[i % len(lengths)]
        x = rng.integers(0, N_VOCAB, T)
        y = x.copy()
        t = int(rng.integers(0, T - 1))
        y[t] = (x[t] + 1 + rng.integers(0, N_VOCAB - 1)) % N_VOCAB
        clean.append(x)
        ref.append(y)
    correct = rng.integers(0, N_VOCAB, n)
    incorrect = (correct + 1 + rng.integers(0, N_VOCAB - 1, n)) % N_VOCAB
    return clean, ref, correct, incorrect


def assert_same(model, pairs, batch_size=4, **fast_kwargs):
    plain = patch_all_heads(model, *pairs, batch_size=batch_size)
    fast = patch_all_heads_fast(model, *pairs, batch_size=batch_size, **fast_kwargs)
    for a, b in zip(plain, fast, strict=True):
        assert a.shape == b.shape and b.dtype == np.float64
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL)
    drops = plain[0][:, None, None] - plain[1]
    assert np.abs(drops).max() > 1e-3  # the comparison is not vacuous
    return fast


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_fast_equals_plain_for_every_geometry(geometry):
    model = zoo_model(geometry)
    assert supports_fast(model)
    assert_same(model, random_pairs(6, (5, 7)), max_rows=7)  # chunks cut row groups


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_fast_equals_plain_for_multiscreen(geometry):
    model = multiscreen_model(geometry)
    assert supports_fast(model)
    assert_same(model, random_pairs(5, (6, 4)), batch_size=3)


@pytest.mark.parametrize("max_rows", [1, 5, 16, 10_000])
def test_chunking_batching_and_progress(max_rows):
    model = zoo_model("learned", seed=2)
    pairs = random_pairs(7, (5, 8, 6), seed=3)
    reference = patch_all_heads_fast(model, *pairs, batch_size=16)
    seen = []
    got = patch_all_heads_fast(model, *pairs, batch_size=2, progress=seen.append, max_rows=max_rows)
    for a, b in zip(reference, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL)
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
    got = patch_all_heads_fast(model, *pairs, batch_size=4)
    plain = patch_all_heads(model, *pairs, batch_size=4)
    for a, b in zip(plain, got, strict=True):
        np.testing.assert_array_equal(b, a)
    assert not np.allclose(expected[0], got[0])  # it really ran the altered model


def test_input_checks_match_plain():
    model = zoo_model("learned")
    with pytest.raises(ValueError, match="equal length"):
        patch_all_heads_fast(model, [np.arange(4)], [np.arange(5)], [0], [1], batch_size=1)
