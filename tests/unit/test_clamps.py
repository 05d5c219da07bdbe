"""The clamp engine (docs §13.3, §15.3) against an independent naive implementation (one
full forward per case with hooks), checks C12 and C13 on every zoo geometry, the path
decomposition's identities, and a planted relay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.heads.analysis import clamps
from headgeom.heads.analysis.clamps import Case, ClampSet
from headgeom.heads.analysis.patching import logit_difference
from headgeom.heads.analysis.tolerance import forward_tolerance
from headgeom.model import registry
from headgeom.model.families import FAMILIES
from headgeom.model.gpt import site
from headgeom.model.hf import HFCausalLM
from tests.helpers.examples import random_pairs
from tests.helpers.hf import TINY_VOCAB, tiny_family_config
from tests.helpers.models import multiscreen_model, zoo_model
from tests.tolerances import patch_tolerance


@torch.no_grad()
def naive(model, clean_ids, ref_ids, correct, incorrect, cases):
    """One example and one case at a time: a full clean forward with hooks that swap the
    source's z for the reference one and put clean values into every clamped site."""
    L = model.cfg.n_layer
    mlp = [site(j, "hook_mlp_out") for j in range(L)] if clamps.has_mlps(model) else []
    zs = [site(j, "attn.hook_z") for j in range(L)]
    out = np.empty((len(clean_ids), len(cases)))
    for n, (c, r) in enumerate(zip(clean_ids, ref_ids, strict=True)):
        c = torch.as_tensor(np.asarray(c))[None]
        r = torch.as_tensor(np.asarray(r))[None]
        _, clean_cache = model.run_with_cache(c, zs + mlp)
        _, ref_cache = model.run_with_cache(r, zs)
        for k, case in enumerate(cases):
            fns = {}
            for j in range(L):

                def fz(z, j=j, case=case, clean_cache=clean_cache, ref_cache=ref_cache):
                    z = z.clone()
                    for h in range(model.cfg.n_head):
                        if (j, h) in case.clamp.heads:
                            z[:, :, h] = clean_cache[zs[j]][:, :, h]
                        if case.source == (j, h):
                            z[:, :, h] = ref_cache[zs[j]][:, :, h]
                    return z

                fns[zs[j]] = fz
                if j in case.clamp.mlps:
                    fns[mlp[j]] = lambda x, j=j, cc=clean_cache: cc[mlp[j]]
            with model.hooks(fns):
                logits = model(c, last_only=True)
            out[n, k] = float(
                logit_difference(logits, torch.tensor([correct[n]]), torch.tensor([incorrect[n]]))
            )
    return out


def mixed_cases(model):
    L, H = model.cfg.n_layer, model.cfg.n_head
    cases = [Case(None, clamps.NOTHING), Case(None, clamps.everything(model))]
    for layer, head in [(0, 1), (1, 0), (L - 1, H - 1)]:
        src = (layer, head)
        cases += [
            Case(src),
            Case(src, clamps.later_heads(model, layer)),
            Case(src, clamps.mlps_from(model, layer)),
            Case(src, clamps.later_heads(model, layer) | clamps.mlps_from(model, layer)),
            Case(src, clamps.same_index_later(model, layer, head)),
            Case(src, clamps.everything(model).without(src)),
            Case(src, ClampSet(heads=frozenset({(min(layer + 1, L - 1), 2)}) - {src})),
        ]
    return cases


@pytest.mark.parametrize("prefix_reuse", [True, False])
@pytest.mark.parametrize("geometry", sorted(registry.geometry_names("gpt")))
def test_engine_equals_naive_hooks(geometry, prefix_reuse):
    model = zoo_model(geometry, seed=3)
    pairs = random_pairs(7, (5, 7), seed=2)
    cases = mixed_cases(model)
    clean_ld, got = clamps.clamp_patch(
        model, *pairs, cases, batch_size=4, max_rows=5, prefix_reuse=prefix_reuse
    )
    want = naive(model, *pairs, cases)
    # engine and naive hooks part at block 0: L + 1 stages at the largest |logit|
    tol = patch_tolerance(model, pairs[0], pairs[1])
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    np.testing.assert_allclose(got[:, 0], clean_ld, rtol=0, atol=tol)
    assert np.abs(clean_ld[:, None] - want).max() > 1e-2  # the cases do something


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_engine_equals_naive_for_multiscreen(geometry):
    model = multiscreen_model(geometry)
    assert clamps.mlps_from(model, 0) == clamps.NOTHING  # no MLP site in the registry
    pairs = random_pairs(5, (6, 4), seed=4)
    cases = mixed_cases(model)
    _, got = clamps.clamp_patch(model, *pairs, cases, batch_size=3, max_rows=4096)
    tol = patch_tolerance(model, pairs[0], pairs[1])  # routes part at block 0: L + 1 stages
    np.testing.assert_allclose(got, naive(model, *pairs, cases), rtol=0, atol=tol)


@pytest.mark.parametrize("prefix_reuse", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_engine_equals_naive_hooks_on_every_transformers_family(family, prefix_reuse):
    """A wrapped transformers causal LM runs the clamp engine through its layers' own
    forward (headgeom.model.hf_blocks): sliding windows, post-norms, parallel residuals."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1234)
    hf = transformers.AutoModelForCausalLM.from_config(tiny_family_config(family)).eval()
    model = HFCausalLM.wrap(hf)
    rng = np.random.default_rng(2)
    pairs = random_pairs(5, (5, 7), seed=2)
    pairs = (*pairs[:2], rng.integers(0, TINY_VOCAB, 5), rng.integers(0, TINY_VOCAB, 5))
    cases = mixed_cases(model)
    clean_ld, got = clamps.clamp_patch(
        model, *pairs, cases, batch_size=3, max_rows=5, prefix_reuse=prefix_reuse
    )
    want = naive(model, *pairs, cases)
    tol = patch_tolerance(model, pairs[0], pairs[1])  # routes part at block 0
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert np.abs(clean_ld[:, None] - want).max() > 1000 * tol  # the cases do something


# --------------------------------------------------------------------------- checks C12, C13
def task_inputs(pairs):
    from headgeom.data.task_files import PatchInputs

    clean, ref, correct, incorrect = pairs
    return PatchInputs(list(clean), list(ref), np.asarray(correct), np.asarray(incorrect))


def stored_effects(model, pairs):
    from headgeom.heads.analysis.patching import patch_all_heads

    clean_ld, patched = patch_all_heads(model, *pairs, batch_size=8)
    return (clean_ld[:, None, None] - patched).mean(axis=0)


@pytest.mark.parametrize("geometry", sorted(registry.geometry_names("gpt")))
def test_checks_c12_c13_and_identities_on_every_geometry(geometry):
    from headgeom.heads.analysis.clamp_analyses import clamp_analyses, require_checks

    model = zoo_model(geometry, seed=5)
    pairs = random_pairs(9, (6, 8), seed=3)
    e = stored_effects(model, pairs)
    out = clamp_analyses(model, task_inputs(pairs), e, lumped=True, batch_size=4, max_rows=9)
    require_checks(out, geometry)  # C12, C13 and Δ(∅) = stored e, each within its tolerance
    # the tolerance is 4 ulps of the largest |logit| per stage (3 blocks + unembedding)
    eps = torch.finfo(torch.float32).eps
    with torch.no_grad():
        logits = [model(torch.as_tensor(c)[None], last_only=True) for c in pairs[0]]
    scale = max(float(x.abs().max()) for x in logits)
    assert out.c12.tolerance == pytest.approx(4 * 4 * eps * scale, rel=1e-5)
    assert out.c12.tolerance < 1e-4  # a check, not a pass: rounding-sized
    p = out.paths
    # the clamps move Δ by far more than rounding
    assert len(p) == 5 and (p["delta_none"] - p["delta_both"]).abs().max() > 10 * out.c12.tolerance
    # order A and order B parts each sum to Δ(∅)
    np.testing.assert_allclose(
        p.direct + p.via_mlps_a + p.via_attention_a, p.delta_none, atol=1e-12
    )
    np.testing.assert_allclose(
        p.direct + p.via_mlps_b + p.via_attention_b, p.delta_none, atol=1e-12
    )
    # I = via attention − via attention′ = via MLPs′ − via MLPs
    np.testing.assert_allclose(p.via_attention_a - p.via_attention_b, p.interaction, atol=1e-12)
    np.testing.assert_allclose(p.via_mlps_b - p.via_mlps_a, p.interaction, atol=1e-12)
    # the direct term is order-free and equals the closed form to 4 decimals
    np.testing.assert_allclose(p.direct, p.direct_closed_form, rtol=0, atol=out.c13.tolerance)
    # pairs: earlier → later among the top 3; lumped: one row per index shift
    assert (out.pairs.source_layer < out.pairs.later_layer).all()
    assert list(out.lumped.index_shift) == list(range(model.cfg.n_head))


def test_c12_sees_a_broken_cache():
    """C12 is not vacuous: a clamp that holds a slightly wrong value breaks it."""
    model = zoo_model("learned", seed=1)
    pairs = random_pairs(4, (6,), seed=9)
    clean, scale = clamps.check_c12(model, *pairs)
    tolerance = forward_tolerance(model, scale)
    assert clean <= tolerance
    original = clamps._Caches.__init__

    def corrupt(self, *a, **k):
        original(self, *a, **k)
        name = site(1, "hook_mlp_out")
        noise = torch.randn(self.clean[name].shape, generator=torch.Generator().manual_seed(0))
        self.clean[name] = self.clean[name] + 1e-3 * noise

    try:
        clamps._Caches.__init__ = corrupt
        assert clamps.check_c12(model, *pairs)[0] > 10 * tolerance
    finally:
        clamps._Caches.__init__ = original


def test_bad_cases_are_refused():
    model = zoo_model("learned")
    pairs = random_pairs(2, (5,))
    with pytest.raises(ValueError, match="cannot also be clamped"):
        clamps.clamp_patch(
            model, *pairs, [Case((1, 1), ClampSet(heads=frozenset({(1, 1)})))], 128, 4096
        )
    with pytest.raises(ValueError, match="outside"):
        clamps.clamp_patch(model, *pairs, [Case((9, 0))], 128, 4096)
    ms = multiscreen_model("learned")
    with pytest.raises(ValueError, match="no MLP"):
        clamps.clamp_patch(ms, *pairs, [Case((0, 0), ClampSet(mlps=frozenset({0})))], 128, 4096)


# --------------------------------------------------------------------------- planted relay
def relay_model():
    """2 layers × 2 heads, D = 8: head (0,0) writes its value (dims 0–1) weakly along the
    zero-mean direction e_4 − e_6 (so LN centering ignores it); head (1,0) reads that
    direction and copies it, 400× stronger, into e_5 − e_7; the final LN drops dims 4 and 6
    (γ = 0) and the tied unembedding reads dims 0–3, 5, 7. MLPs and every other head are
    zero and attention is uniform: the source's effect goes almost only through the relay."""
    cfg = dict(n_layer=2, n_head=2, d_model=8, d_head=2, d_mlp=4, n_ctx=16)
    from headgeom.model import zoo

    model = registry.build_model(zoo.derive_model_config("learned", cfg, {}), 6)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.fill_(1.0)
        model.ln_f.weight[[4, 6]] = 0.0
        emb = torch.randn(6, 8, generator=gen)
        emb[:, [4, 6]] = 0.0
        model.wte.weight.copy_(emb)
        hd = 2 * 2  # H·d; c_attn rows are q | k | v
        src, relay = model.blocks[0].attn, model.blocks[1].attn
        src.reader.c_attn.weight[2 * hd + 0, 0] = 1.0  # v of head 0 <- dims 0, 1
        src.reader.c_attn.weight[2 * hd + 1, 1] = 1.0
        for d in (0, 1):  # W_O of head 0 -> 0.02 (e_4 − e_6)
            src.writer.c_proj.weight[4, d], src.writer.c_proj.weight[6, d] = 0.02, -0.02
        relay.reader.c_attn.weight[2 * hd + 0, 4] = 1.0  # relay v <- e_4 − e_6
        relay.reader.c_attn.weight[2 * hd + 0, 6] = -1.0
        relay.writer.c_proj.weight[5, 0], relay.writer.c_proj.weight[7, 0] = 8.0, -8.0
    return model.eval()


def test_planted_relay_gives_a_reduction_near_one():
    from headgeom.heads.analysis.clamp_analyses import reduction

    model = relay_model()
    rng = np.random.default_rng(0)
    clean = [rng.integers(0, 6, 7) for _ in range(16)]
    ref = [np.where(np.arange(7) == 3, (c + 1) % 6, c) for c in clean]
    correct, incorrect = rng.integers(0, 3, 16), rng.integers(3, 6, 16)
    pairs = (clean, ref, correct, incorrect)
    cases = [
        Case((0, 0)),
        Case((0, 0), ClampSet(heads=frozenset({(1, 0)}))),  # the relay
        Case((0, 0), ClampSet(heads=frozenset({(1, 1)}))),  # a silent head
    ]
    clean_ld, patched = clamps.clamp_patch(model, *pairs, cases, batch_size=128, max_rows=4096)
    e = (clean_ld[:, None] - patched).mean(axis=0)
    tol = patch_tolerance(model, clean, ref)  # routes part at block 0: L + 1 stages
    np.testing.assert_allclose(patched, naive(model, *pairs, cases), rtol=0, atol=tol)
    assert abs(e[0]) > 0.01
    assert reduction(e[0], e[1]) > 0.95
    assert abs(reduction(e[0], e[2])) < 1e-9
