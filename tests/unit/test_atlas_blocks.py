"""The blocks of tiny Llama, Gemma 4 and Gemma 3n models (headgeom.atlas.blocks): which blocks
each has, that a block's write is what its layer adds to the stream, the volume knob and the
norm conventions behind it (checked in transformers 5.24), key norms under KV sharing, and
the refusals."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm  # noqa: E402
from transformers.models.gemma3n.modeling_gemma3n import Gemma3nRMSNorm  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm  # noqa: E402

from headgeom.atlas.blocks import AtlasModel, Block  # noqa: E402
from headgeom.model.families import UnsupportedFamilyError  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402
from tests.helpers.hf import tiny_family_config  # noqa: E402


@pytest.fixture(scope="module", params=sorted(tiny.BUILDERS))
def family(request):
    return request.param, AtlasModel(tiny.BUILDERS[request.param]())


def test_blocks_per_layer(family):
    name, model = family
    kinds = ("attn", "mlp", "ple") if name.startswith("gemma") else ("attn", "mlp")
    assert model.n_layer == tiny.LAYERS
    assert model.blocks() == [Block(layer, k) for layer in range(tiny.LAYERS) for k in kinds]
    assert Block(2, "mlp").label == "L2.mlp"
    with pytest.raises(ValueError, match="no block L9.attn"):
        model.write_module(Block(9, "attn"))


@torch.no_grad()
def test_the_writes_are_what_the_layer_adds():
    """Llama: layer output = input + attention write + MLP write. Gemma 4: layer output =
    layer_scalar · (input + attention + MLP + PLE writes), the writes being the post-norms'
    outputs."""
    for hf, kinds in ((tiny.tiny_llama(), ("attn", "mlp")),
                      (tiny.tiny_gemma4(), ("attn", "mlp", "ple"))):  # fmt: skip
        model = AtlasModel(hf)
        seen = tiny.capture(model, tiny.ids())
        for layer in range(model.n_layer):
            total = seen[("in", layer)] + sum(seen[Block(layer, k)] for k in kinds)
            scalar = model.layer_scalar(layer)
            expected = total if scalar is None else total * scalar
            torch.testing.assert_close(seen[("out", layer)], expected, rtol=1e-5, atol=1e-5)


def test_knob_is_the_post_norm_gain():
    g4 = AtlasModel(tiny.tiny_gemma4())
    for kind, path in (("attn", "post_attention_layernorm"), ("mlp", "post_feedforward_layernorm"),
                       ("ple", "post_per_layer_input_norm")):  # fmt: skip
        weight = g4.layers[1].get_submodule(path).weight
        assert torch.equal(g4.knob(Block(1, kind)), weight.detach())
    llama = AtlasModel(tiny.tiny_llama())
    assert llama.knob(Block(0, "attn")) is None and llama.knob(Block(0, "mlp")) is None
    # Gemma 3 (a core family) scales by 1 + weight
    torch.manual_seed(0)
    g3 = transformers.Gemma3ForCausalLM(tiny_family_config("gemma3")).eval()
    weight = g3.model.layers[0].post_attention_layernorm.weight.detach()
    torch.testing.assert_close(AtlasModel(g3).knob(Block(0, "attn")), 1.0 + weight)


@torch.no_grad()
def test_gemma_norm_conventions():
    """What makes "post-norm weight 0" the exact Zero on Gemma 4 and 3n but not on Gemma 3:
    transformers 5.24's Gemma4RMSNorm and Gemma3nRMSNorm return normed · weight (weight
    initialised to ones), Gemma3RMSNorm normed · (1 + weight) (initialised to zeros)."""
    x = torch.randn(3, 5, 16)
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    for cls in (Gemma4RMSNorm, Gemma3nRMSNorm):
        norm = cls(16)
        assert torch.equal(norm.weight, torch.ones(16))
        norm.weight.zero_()
        assert torch.count_nonzero(norm(x)) == 0
        norm.weight.fill_(2.0)
        torch.testing.assert_close(norm(x), 2.0 * x * rms)
    gemma3 = Gemma3RMSNorm(16)
    assert torch.equal(gemma3.weight, torch.zeros(16))
    torch.testing.assert_close(gemma3(x), x * rms)  # weight 0 is the identity gain


def test_key_norms_where_the_layer_has_one():
    g4 = AtlasModel(tiny.tiny_gemma4())
    # layers 2 and 3 reuse layer 0's and 1's keys: no key norm of their own
    assert [g4.key_norm(layer) is not None for layer in range(4)] == [True, True, False, False]
    assert all(AtlasModel(tiny.tiny_llama()).key_norm(layer) is None for layer in range(4))
    assert all(AtlasModel(tiny.tiny_qwen3()).key_norm(layer) is not None for layer in range(4))


def test_ple_table_and_width():
    g4 = AtlasModel(tiny.tiny_gemma4())
    assert g4.ple_width == tiny.PLE["hidden_size_per_layer_input"]
    assert g4.ple_table().weight.shape == (tiny.V, tiny.LAYERS * g4.ple_width)
    with pytest.raises(ValueError, match="no per-layer embedding table"):
        AtlasModel(tiny.tiny_llama()).ple_table()


def test_refusals():
    other = nn.Module()
    other.config = types.SimpleNamespace(model_type="mamba")
    with pytest.raises(UnsupportedFamilyError, match="'mamba'.*gemma4_text"):
        AtlasModel(other.eval())
    with pytest.raises(ValueError, match="eval mode"):
        AtlasModel(tiny.tiny_llama().train())
