"""The model: exact parameter arithmetic, named sites with pinned axes, pluggable geometry."""

from __future__ import annotations

import math

import pytest
import torch

from headgeom.heads.analysis.leakage import C8_STAGES
from headgeom.heads.analysis.tolerance import forward_tolerance, rounding_tolerance
from headgeom.model.config import ModelConfig
from headgeom.model.geometries import GEOMETRIES, FrozenWriter, LearnedWriter, write_scale
from headgeom.model.gpt import GPT, SITE_AXES, site
from tests.tolerances import largest

TINY = dict(n_vocab=23, n_ctx=16, n_layer=3, n_head=2, d_model=8, d_head=4, d_mlp=12)
PAPER = dict(n_vocab=50257, n_ctx=512, n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072)


def tiny(geometry="learned", seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig(**TINY, geometry=geometry))


def expected_learned_params(V, T, L, D, F):
    """docs §4.4 by hand: embeddings + L·(LN1 + QKV + W_O + LN2 + MLP) + final LN."""
    per_layer = 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D + (D * F + F) + (F * D + D)
    return V * D + T * D + L * per_layer + 2 * D


@pytest.mark.parametrize(
    ("geometry", "expected"),
    [("learned", 124_046_592), ("write-common-axis", 116_968_704)],
)
def test_paper_size_parameter_counts_are_exact(geometry, expected):
    with torch.device("meta"):
        model = GPT(ModelConfig(**PAPER, geometry=geometry))
    assert model.n_params() == expected


def test_tiny_counts_follow_the_arithmetic():
    V, T, L, D, F = (TINY[k] for k in ("n_vocab", "n_ctx", "n_layer", "d_model", "d_mlp"))
    assert tiny("learned").n_params() == expected_learned_params(V, T, L, D, F)
    # Freezing W_O removes exactly L·D·(H·d) parameters; b_O stays learned (§4.4).
    assert (
        tiny("write-common-axis").n_params() == expected_learned_params(V, T, L, D, F) - L * D * D
    )


def test_frozen_write_is_a_buffer_equal_to_g_times_coordinate_blocks():
    model = tiny("write-common-axis")
    writer = model.blocks[1].attn.writer
    assert isinstance(writer, FrozenWriter)
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.endswith("basis") for n in names)
    g = 0.02 * math.sqrt(TINY["d_model"] / (2 * TINY["n_layer"]))
    assert write_scale(model.cfg) == pytest.approx(g)
    W = writer.write_maps()  # (H, D, d)
    d = TINY["d_head"]
    for h in range(TINY["n_head"]):
        E_h = torch.zeros(TINY["d_model"], d, dtype=torch.float64)
        E_h[h * d : (h + 1) * d] = torch.eye(d, dtype=torch.float64)
        assert torch.equal(W[h], g * E_h)


def test_learned_write_maps_reassemble_the_output_projection():
    model = tiny("learned")
    writer = model.blocks[0].attn.writer
    assert isinstance(writer, LearnedWriter)
    z = torch.randn(2, 5, TINY["n_head"], TINY["d_head"])
    by_head = sum(z[..., h, :] @ writer.write_maps()[h].T for h in range(TINY["n_head"]))
    want = by_head + writer.c_proj.bias
    # one W_O sum against one per head and their sum: 2 rounded stages at the largest |output|
    tol = rounding_tolerance(torch.float32, largest(want), C8_STAGES)
    torch.testing.assert_close(writer(z), want, atol=tol, rtol=0)


def test_every_site_has_its_declared_axes():
    model = tiny()
    ids = torch.randint(0, TINY["n_vocab"], (2, 7))
    names = [site(1, s) for s in SITE_AXES if s != "hook_resid_final"] + ["hook_resid_final"]
    _, cache = model.run_with_cache(ids, names)
    sizes = {
        "batch": 2,
        "position": 7,
        "head": TINY["n_head"],
        "d_head": TINY["d_head"],
        "d_model": TINY["d_model"],
    }
    for name in names:
        axes = SITE_AXES[name.split(".", 2)[-1] if name.startswith("blocks.") else name]
        assert tuple(cache[name].shape) == tuple(sizes[a] for a in axes), name


def test_hook_replacing_z_changes_output_and_is_removed_after_an_error():
    model = tiny()
    ids = torch.randint(0, TINY["n_vocab"], (1, 6))
    clean = model(ids)
    with model.hooks({site(0, "attn.hook_z"): torch.zeros_like}):
        zeroed = model(ids)
    assert not torch.allclose(clean, zeroed)
    with pytest.raises(RuntimeError), model.hooks({site(0, "attn.hook_z"): torch.zeros_like}):
        raise RuntimeError("boom")
    assert torch.equal(model(ids), clean)


def test_attention_is_causal():
    model = tiny()
    ids = torch.randint(0, TINY["n_vocab"], (1, 6))
    changed = ids.clone()
    changed[0, 4] = (changed[0, 4] + 1) % TINY["n_vocab"]
    a, b = model(ids), model(changed)
    tol = forward_tolerance(model, largest(a))  # two forwards: L + 1 stages at the largest |logit|
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=tol, rtol=0)
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 100 * tol  # the change itself is far above it


def test_unknown_geometry_and_site_are_named():
    with pytest.raises(ValueError, match="unknown geometry 'spiral'"):
        GPT(ModelConfig(**TINY, geometry="spiral"))
    with pytest.raises(KeyError, match="hook_y"):
        site(0, "attn.hook_y")
    assert {"learned", "write-common-axis"} <= set(GEOMETRIES)


def test_weight_decay_groups_split_by_rank():
    model = tiny("write-common-axis")
    decay, no_decay = model.optim_groups(0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.n_params()
