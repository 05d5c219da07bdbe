"""Clamps and paths (docs §13.3, §15.3) on transformers causal LMs, the engine's whole-forward
route through the hook sites against plain torch hooks written here on the modules (the
output projection's input for z, the MLP's output module), and checks C12, C13 and the
path identities, Gemma's post-norms included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.data.task_files import PatchInputs  # noqa: E402
from headgeom.heads.analysis import clamps  # noqa: E402
from headgeom.heads.analysis.clamp_analyses import clamp_analyses, require_checks  # noqa: E402
from headgeom.heads.analysis.clamps import Case, ClampSet  # noqa: E402
from headgeom.heads.analysis.patching import patch_all_heads  # noqa: E402
from headgeom.heads.analysis.tolerance import forward_tolerance  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from tests.helpers.hf_models import V, layers, o_proj, tiny_family_model  # noqa: E402


def _pairs(n=5, T=6, seed=0):
    rng = np.random.default_rng(seed)
    clean = [rng.integers(1, V, T) for _ in range(n)]
    ref = []
    for c in clean:
        r = c.copy()
        r[1:] = rng.integers(1, V, T - 1)
        ref.append(r)
    correct = rng.integers(1, V, n)
    return clean, ref, correct, (correct + 1 + rng.integers(0, V - 2, n)) % (V - 1) + 1


def _mlp_out(hf, layer):
    """The module whose output the block adds to the residual as its MLP's update."""
    block = layers(hf)[layer]
    return block.post_feedforward_layernorm if hf.config.model_type == "gemma2" else block.mlp


@torch.no_grad()
def naive(model, clean_ids, ref_ids, correct, incorrect, cases):
    """One example, one case: a transformers forward with a pre-hook on each output
    projection (the source's slice from the reference run, clamped slices from the clean run)
    and forward hooks returning the clean MLP outputs of clamped layers."""
    hf, L, H, d = model.hf, model.cfg.n_layer, model.cfg.n_head, model.cfg.d_head
    out = np.empty((len(clean_ids), len(cases)))

    def capture(ids):
        z, mlp = {}, {}
        handles = [
            o_proj(hf, j).register_forward_pre_hook(
                lambda m, a, j=j: z.__setitem__(j, a[0].clone())
            )
            for j in range(L)
        ]
        handles += [_mlp_out(hf, j).register_forward_hook(
            lambda m, a, o, j=j: mlp.__setitem__(j, o.clone())) for j in range(L)]  # fmt: skip
        hf(input_ids=ids)
        for h in handles:
            h.remove()
        return z, mlp

    for n, (c, r) in enumerate(zip(clean_ids, ref_ids, strict=True)):
        c = torch.as_tensor(np.asarray(c))[None]
        z_clean, mlp_clean = capture(c)
        z_ref, _ = capture(torch.as_tensor(np.asarray(r))[None])
        for k, case in enumerate(cases):
            handles = []
            for j in range(L):

                def put(m, a, j=j, case=case, z_clean=z_clean, z_ref=z_ref):
                    z = a[0].clone()
                    for h in range(H):
                        cols = slice(h * d, (h + 1) * d)
                        if (j, h) in case.clamp.heads:
                            z[..., cols] = z_clean[j][..., cols]
                        if case.source == (j, h):
                            z[..., cols] = z_ref[j][..., cols]
                    return (z,)

                handles.append(o_proj(hf, j).register_forward_pre_hook(put))
                if j in case.clamp.mlps:
                    handles.append(_mlp_out(hf, j).register_forward_hook(
                        lambda m, a, o, j=j, mlp_clean=mlp_clean: mlp_clean[j]))  # fmt: skip
            last = hf(input_ids=c).logits[0, -1].double()
            for h in handles:
                h.remove()
            out[n, k] = float(last[correct[n]] - last[incorrect[n]])
    return out


def _cases(model):
    L, H = model.cfg.n_layer, model.cfg.n_head
    cases = [Case(None), Case(None, clamps.everything(model))]
    for src in [(0, 1), (1, 3), (L - 1, 0)]:
        layer = src[0]
        cases += [
            Case(src),
            Case(src, clamps.later_heads(model, layer)),
            Case(src, clamps.mlps_from(model, layer)),
            Case(src, clamps.later_heads(model, layer) | clamps.mlps_from(model, layer)),
            Case(src, clamps.same_index_later(model, layer, (src[1] + 1) % H)),
            Case(src, clamps.everything(model).without(src)),
            Case(src, ClampSet(heads=frozenset({(min(layer + 1, L - 1), 2)}) - {src})),
        ]
    return cases


@pytest.fixture(scope="module", params=["llama", "gpt_neox", "gpt2", "gemma2"])
def model(request):
    return HFCausalLM.wrap(tiny_family_model(request.param, seed=7))


def test_the_whole_forward_route_equals_plain_hooks_on_the_modules(model):
    pairs = _pairs()
    cases = _cases(model)
    clean_ld, got = clamps.clamp_patch(model, *pairs, cases, batch_size=3, max_rows=7)
    want = naive(model, *pairs, cases)
    with torch.no_grad():
        scale = max(float(model(torch.as_tensor(c)[None]).abs().max()) for c in pairs[0] + pairs[1])
    tol = forward_tolerance(model, scale)  # the routes part at block 0 (batching)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    np.testing.assert_allclose(got[:, 0], clean_ld, rtol=0, atol=tol)
    assert np.abs(clean_ld[:, None] - want).max() > 1000 * tol  # the cases do something


def test_checks_c12_c13_and_the_path_identities_hold(model):
    pairs = _pairs(n=6, seed=1)
    clean_ld, patched = patch_all_heads(model, *pairs, batch_size=4)
    e = (clean_ld[:, None, None] - patched).mean(axis=0)
    inputs = PatchInputs(pairs[0], pairs[1], np.asarray(pairs[2]), np.asarray(pairs[3]))
    out = clamp_analyses(model, inputs, e, lumped=True, batch_size=4, max_rows=9)
    require_checks(out, model.cfg.family)  # C12, C13, Δ(∅) = stored e within tolerance
    p = out.paths
    assert len(p) == 5 and (p["delta_none"] - p["delta_both"]).abs().max() > 10 * out.c13.tolerance
    np.testing.assert_allclose(p.direct + p.via_mlps_a + p.via_attention_a, p.delta_none,
                               atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(p.direct + p.via_mlps_b + p.via_attention_b, p.delta_none,
                               atol=1e-12)  # fmt: skip
    # the closed form (the attention output's change at the final position, added to the
    # clean residual leaving the last block) is the direct term, post-norms included
    np.testing.assert_allclose(p.direct, p.direct_closed_form, rtol=0, atol=out.c13.tolerance)
    assert list(out.lumped.index_shift) == list(range(model.cfg.n_head))


def test_c12_sees_a_wrong_clean_value(model):
    pairs = _pairs(n=3, seed=2)
    residual, scale = clamps.check_c12(model, *pairs)
    tolerance = forward_tolerance(model, scale)
    assert residual <= tolerance
    original = clamps._Caches.__init__

    def corrupt(self, *a, **k):
        original(self, *a, **k)
        name = "blocks.1.hook_mlp_out"  # noise, not a constant: a LayerNorm centres that away
        noise = torch.randn(self.clean[name].shape, generator=torch.Generator().manual_seed(0))
        self.clean[name] = self.clean[name] + 1e-2 * noise

    try:
        clamps._Caches.__init__ = corrupt
        assert clamps.check_c12(model, *pairs)[0] > 10 * tolerance
    finally:
        clamps._Caches.__init__ = original
