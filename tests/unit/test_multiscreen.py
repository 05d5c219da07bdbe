"""The multiscreen controls (docs §6.6): exact counts, causality, the z site, frozen writes,
screening math, and that a tiny model learns."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from headgeom.heads.analysis.leakage import C8_STAGES
from headgeom.heads.analysis.tolerance import forward_tolerance, model_dtype, rounding_tolerance
from headgeom.model.geometries import FrozenWriter
from headgeom.model.gpt import site
from headgeom.model.multiscreen import (
    PAPER_CONFIG,
    SITE_AXES,
    LearnedWriter,
    MultiscreenConfig,
    causal_cosine_window,
    multiscreen_write_scale,
    screening_relevance,
    tanh_norm,
)
from headgeom.model.registry import build_model
from tests.tolerances import largest

TINY = dict(n_vocab=13, n_ctx=24, n_layer=2, n_head=4, d_model=32, d_head=8, d_key=4)
# Short windows and MiPE active on every tile at this size.
TINY_CHOICES = dict(window_init_max=8.0, mipe_threshold=16.0)


def tiny(geometry="learned", seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = MultiscreenConfig(**TINY, geometry=geometry, **{**TINY_CHOICES, **overrides})
    return build_model(cfg.to_dict())


def expected_params(V, L, H, D, d_k, d_v, frozen_write):
    """§6.6 by hand: tied embedding + 2 scalars + L·(W_Q, W_K + W_V, W_G, W_O + 3 scalars/tile)."""
    per_layer = 2 * D * H * d_k + 3 * D * H * d_v + 3 * H
    if frozen_write:
        per_layer -= D * H * d_v
    return V * D + 2 + L * per_layer


@pytest.mark.parametrize(
    ("geometry", "printed"), [("learned", 128_534_514), ("write-common-axis", 106_514_418)]
)
def test_paper_size_parameter_counts_are_exact(geometry, printed):
    p = PAPER_CONFIG
    derived = expected_params(
        p["n_vocab"],
        p["n_layer"],
        p["n_head"],
        p["d_model"],
        p["d_key"],
        p["d_head"],
        frozen_write=geometry != "learned",
    )
    assert derived == printed  # the §6.6 arithmetic reproduces the printed count
    with torch.device("meta"):
        model = build_model(MultiscreenConfig(**PAPER_CONFIG, geometry=geometry).to_dict())
    assert model.n_params() == printed
    assert 128_534_514 - 106_514_418 == 21 * 1024**2  # §4.4: one frozen 1024² W_O per layer


def test_tiny_counts_and_weight_decay_groups():
    for geometry in ("learned", "write-common-axis"):
        model = tiny(geometry)
        t = TINY
        assert model.n_params() == expected_params(
            t["n_vocab"],
            t["n_layer"],
            t["n_head"],
            t["d_model"],
            t["d_key"],
            t["d_head"],
            frozen_write=geometry != "learned",
        )
        decay, no_decay = model.optim_groups(0.1)
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        # The scalars (2 global + 3 per tile) are exactly the undecayed tensors (§7.2).
        assert sum(p.numel() for p in no_decay["params"]) == 2 + 3 * t["n_layer"] * t["n_head"]
        assert all(p.dim() == 2 for p in decay["params"])


def test_config_round_trips_and_rejects_unknown_keys():
    cfg = MultiscreenConfig(**TINY, geometry="write-common-axis", mipe=False)
    assert MultiscreenConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["architecture"] == "multiscreen"
    with pytest.raises(ValueError, match="unknown multiscreen config keys"):
        MultiscreenConfig.from_dict({**cfg.to_dict(), "d_mlp": 3})
    with pytest.raises(ValueError, match="unknown geometry"):
        MultiscreenConfig(**TINY, geometry="all-rotated")
    with pytest.raises(ValueError, match="n_head·d_head == d_model"):
        build_model(
            dict(TINY, d_model=31, geometry="write-common-axis", architecture="multiscreen")
        )


@pytest.mark.parametrize("mipe", [True, False])
def test_changing_token_t_leaves_earlier_logits_unchanged(mipe):
    model = tiny(mipe=mipe).eval()
    ids = torch.randint(0, TINY["n_vocab"], (2, 20), generator=torch.Generator().manual_seed(1))
    t = 11
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % TINY["n_vocab"]
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])
    # the same blocks; the routes part at the unembedding: 1 stage at the largest |logit|
    tol = forward_tolerance(model, largest(a[:, -1]), from_layer=model.cfg.n_layer)
    torch.testing.assert_close(model(ids, last_only=True).detach(), a[:, -1], atol=tol, rtol=0)


@pytest.mark.parametrize("mipe", [True, False])
@pytest.mark.parametrize("last_only", [True, False])
def test_forward_suffix_equals_the_whole_sequence_at_its_positions(mipe, last_only):
    """The KV-prefix forward (the registry's prefix_reuse): block l run on positions P..T−1
    with the clean keys/values of 0..P−1 gives the whole-sequence block's output there, for
    G = 2 variants of each of B = 3 prefixes (row g·B + b continues prefix b)."""
    model = tiny(mipe=mipe).eval()
    T, P, B = 14, 9, 3
    ids = torch.randint(0, TINY["n_vocab"], (B, T), generator=torch.Generator().manual_seed(4))
    names = [
        site(layer, n)
        for layer in range(2)
        for n in ("hook_resid_pre", "attn.hook_k", "attn.hook_v")
    ]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names)
        for layer, block in enumerate(model.blocks):
            x = cache[site(layer, "hook_resid_pre")]
            whole = block(x)
            past = (cache[site(layer, f"attn.hook_{n}")][:, :P] for n in "kv")
            out, k, v = block.forward_suffix(x[:, P:].repeat(2, 1, 1), *past, last_only)
            want = whole[:, -1:] if last_only else whole[:, P:]
            tol = forward_tolerance(model, largest(want), from_layer=model.cfg.n_layer - 1)
            torch.testing.assert_close(out, want.repeat(2, 1, 1), atol=tol, rtol=0)
            torch.testing.assert_close(k[:B], cache[site(layer, "attn.hook_k")][:, P:])


def test_sites_have_pinned_names_and_axes():
    model = tiny()
    L, H = TINY["n_layer"], TINY["n_head"]
    block_sites = [n for n in SITE_AXES if n != "hook_resid_final"]
    expected = {site(layer, n) for layer in range(L) for n in block_sites} | {"hook_resid_final"}
    assert set(model.hook_points()) == expected
    ids = torch.randint(0, TINY["n_vocab"], (3, 7))
    _, cache = model.run_with_cache(ids, sorted(expected))
    sizes = dict(
        batch=3,
        position=7,
        head=H,
        d_head=TINY["d_head"],
        d_key=TINY["d_key"],
        d_model=TINY["d_model"],
    )
    for name, act in cache.items():
        axes = SITE_AXES[name.split(".", 2)[-1] if name.startswith("blocks.") else name]
        assert act.shape == tuple(sizes[a] for a in axes), name
    reader = model.blocks[0].attn.reader  # weight-space readers (§9.1); no LayerNorm to fold
    for X, width in (("Q", "d_key"), ("K", "d_key"), ("V", "d_head"), ("G", "d_head")):
        assert reader.read_maps(X).shape == (H, TINY[width], TINY["d_model"])
    # Queries, keys and values are unit vectors per tile: the norm, the division and the
    # norm read here are 3 rounded stages at scale 1
    tol = rounding_tolerance(model_dtype(model), 1.0, 3)
    for n in ("attn.hook_q", "attn.hook_k", "attn.hook_v"):
        norms = cache[site(1, n)].norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=tol, rtol=0)


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_zeroing_one_tile_changes_attn_out_by_minus_w_o_z(geometry):
    model = tiny(geometry).eval()
    ids = torch.randint(0, TINY["n_vocab"], (2, 9), generator=torch.Generator().manual_seed(2))
    layer, head = 1, 2
    z_name, out_name = site(layer, "attn.hook_z"), site(layer, "hook_attn_out")
    with torch.no_grad():
        _, clean = model.run_with_cache(ids, [z_name, out_name])

        def zero_head(z):
            z = z.clone()
            z[:, :, head] = 0
            return z

        with model.hooks({z_name: zero_head}):
            _, patched = model.run_with_cache(ids, [out_name])
    W = model.blocks[layer].attn.writer.write_maps()  # (head, d_model, d_head)
    assert W.shape == (TINY["n_head"], TINY["d_model"], TINY["d_head"])
    z_h = clean[z_name][:, :, head].double()  # (batch, position, d_head)
    delta = -torch.einsum("btk,dk->btd", z_h, W[head].double())
    assert clean[z_name][:, :, head].abs().max() > 0
    # check C8's tolerance: two rounded W_O sums at the largest |attention output|
    tol = rounding_tolerance(model_dtype(model), largest(clean[out_name]), C8_STAGES)
    assert delta.abs().max() > 100 * tol  # a wrong write would show
    torch.testing.assert_close(
        (patched[out_name] - clean[out_name]).double(), delta, atol=tol, rtol=0
    )


def test_frozen_write_is_g_ms_coordinate_block_buffer_and_never_trains():
    model = tiny("write-common-axis")
    writer = model.blocks[0].attn.writer
    assert isinstance(writer, FrozenWriter) and writer.b_O is None
    assert writer.basis.dtype == torch.float64
    assert "blocks.0.attn.writer.basis" in model.state_dict()  # persistent: saved, rebuilt
    assert not any(n.endswith("basis") for n, _ in model.named_parameters())
    # g_ms = std(initial learned W_O)·√(N_H·d_V) = (σ₀/√d_E)·√(N_H·d_V) (§6.6 CHOICE).
    g = 0.1 / math.sqrt(TINY["d_model"]) * math.sqrt(TINY["n_head"] * TINY["d_head"])
    assert multiscreen_write_scale(model.cfg) == pytest.approx(g)
    learned_std = tiny("learned").blocks[0].attn.writer.w_o.weight.std().item()
    assert learned_std * math.sqrt(TINY["d_model"]) == pytest.approx(g, rel=0.2)
    d = TINY["d_head"]
    for h in range(TINY["n_head"]):
        E_h = torch.zeros(TINY["d_model"], d, dtype=torch.float64)
        E_h[h * d : (h + 1) * d] = torch.eye(d, dtype=torch.float64)
        assert torch.equal(writer.write_maps()[h], g * E_h)

    before = {n: b.clone() for n, b in model.named_buffers()}
    opt = torch.optim.AdamW(model.optim_groups(0.1), lr=1e-2)
    ids = torch.randint(0, TINY["n_vocab"], (2, 12))
    for _ in range(3):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(b.grad is None for b in model.buffers())
        opt.step()
    for n, b in model.named_buffers():
        assert torch.equal(b, before[n]), n
    assert isinstance(tiny("learned").blocks[0].attn.writer, LearnedWriter)


def test_relevance_is_zero_outside_the_acceptance_width():
    # Dyadic s and r: 1 − r(1 − s) is computed exactly, so the edge s = 1 − 1/r is exact too.
    r = torch.tensor([2.0, 4.0, 8.0])[:, None]
    s = torch.arange(-256, 257)[None, :].expand(3, -1) / 256.0
    rel = screening_relevance(s, r)
    edge = 1 - 1 / r
    assert torch.all(rel[s <= edge] == 0)
    assert torch.all(rel[s > edge] > 0)
    assert torch.equal(rel[:, -1], torch.ones(3))  # s = 1: full relevance
    assert torch.equal(rel, torch.clamp(1 - r * (1 - s), min=0) ** 2)
    # Any r > 1: zero below the edge, positive above it.
    r = torch.tensor([1.3, 2.7])[:, None]
    s = torch.linspace(-1, 1, 2001)[None, :].expand(2, -1)
    rel = screening_relevance(s, r)
    assert torch.all(rel[s < 1 - 1 / r - 1e-6] == 0)
    assert torch.all(rel[s > 1 - 1 / r + 1e-6] > 0)


def test_window_mask_is_causal_cosine_and_zero_beyond_the_window():
    w = torch.tensor([1.0, 3.0, 100.0])
    m = causal_cosine_window(6, w)  # (head, query i, key j)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.all(m[:, j > i] == 0)  # future keys
    assert torch.all(m[:, i == j] == 1)
    assert torch.all(m[0][i != j] == 0)  # w = 1: only the diagonal
    dist = (i - j).float()
    expected_w3 = torch.where(
        (dist >= 0) & (dist < 3), 0.5 * (1 + torch.cos(math.pi * dist / 3)), 0
    )
    assert torch.allclose(m[1], expected_w3)
    assert torch.all(m[2][j <= i] > 0)


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_a_tiny_model_learns_a_repetitive_sequence(geometry):
    model = tiny(geometry, seed=3)
    ids = torch.tensor([[1, 5, 2, 9, 4, 7] * 4])  # period 6, 24 tokens
    opt = torch.optim.AdamW(model.optim_groups(0.0), lr=3e-2)
    losses = []
    for _ in range(30):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0]


def test_tanh_norm_bounds_the_norm_and_is_the_identity_at_zero():
    h = (
        torch.randn(6, 8, dtype=torch.float64)
        * torch.linspace(0.01, 5, 6, dtype=torch.float64)[:, None]
    )
    u = tanh_norm(h, 1e-12)
    assert torch.allclose(u.norm(dim=-1), torch.tanh(h.norm(dim=-1)))
    assert torch.allclose(F.normalize(u, dim=-1), F.normalize(h, dim=-1))
    zero = torch.zeros(2, 3, requires_grad=True)
    tanh_norm(zero, 1e-12).sum().backward()
    assert torch.equal(zero.grad, torch.ones(2, 3))  # no dead gradient when nothing is accepted
