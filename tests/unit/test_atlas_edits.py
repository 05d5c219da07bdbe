"""Each edit of the atlas (headgeom.atlas.edits) on tiny Llama, Gemma 4 and Gemma 3n models
against a naive implementation written out here: edited weights on a copy of the model
(Zero: the block's output weight or post-norm weight 0; rows→mean: the table's rows
replaced; layer skip: the layer's forward the identity or its post-norms 0), hooks of our
own (Average: the hand-computed mean), and attention weights read back (flatten keys:
uniform attention over what each query sees)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import edits as E  # noqa: E402
from headgeom.atlas.blocks import AtlasModel, Block  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402

IDS = tiny.ids()
MEAN_WINDOWS = tiny.ids(3, 9, seed=1)


def edited(model: AtlasModel, edit: E.Edit, means=None, tables=None) -> torch.Tensor:
    with E.applied(model, edit, means, tables):
        return model.logits(IDS)


def with_weights(hf, change) -> torch.Tensor:
    """Logits of IDS on a copy of ``hf`` whose parameters ``change(copy)`` edits."""
    other = copy.deepcopy(hf)
    with torch.no_grad():
        change(other)
    return AtlasModel(other).logits(IDS)


def exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def changed(model: AtlasModel, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` after checking they differ from the unedited model's (no vacuous edit)."""
    assert (logits - model.logits(IDS)).abs().max() > 1e-3
    return logits


# ----------------------------------------------------------------------------- zero
@pytest.mark.parametrize("layer", [0, 2])
def test_zero_llama_is_the_output_projection_at_zero(layer):
    hf = tiny.tiny_llama()
    model = AtlasModel(hf)
    o_proj = with_weights(hf, lambda m: m.model.layers[layer].self_attn.o_proj.weight.zero_())
    down = with_weights(hf, lambda m: m.model.layers[layer].mlp.down_proj.weight.zero_())
    exact(edited(model, E.Edit("zero", "attn", layer)), o_proj)
    exact(edited(model, E.Edit("zero", "mlp", layer)), down)


@pytest.mark.parametrize("name", ["gemma4", "gemma3n"])
@pytest.mark.parametrize("layer", [1, 3])
def test_zero_gemma_is_the_post_norm_at_zero(name, layer):
    """The "volume knob" at 0 (Gemma's RMSNorm multiplies by its weight) removes the write
    exactly: the same logits as the hook that sets the write to 0. For the PLE branch, so
    do the per-layer gate at 0 (gelu(0) = 0) and the per-layer projection at 0."""
    hf = tiny.BUILDERS[name]()
    model = AtlasModel(hf)

    def zeroed(path):
        return with_weights(hf, lambda m: m.model.layers[layer].get_submodule(path).weight.zero_())

    exact(edited(model, E.Edit("zero", "attn", layer)), zeroed("post_attention_layernorm"))
    exact(edited(model, E.Edit("zero", "mlp", layer)), zeroed("post_feedforward_layernorm"))
    ple = edited(model, E.Edit("zero", "ple", layer))
    for path in ("post_per_layer_input_norm", "per_layer_input_gate", "per_layer_projection"):
        exact(ple, zeroed(path))
    assert not torch.equal(ple, model.logits(IDS))


def test_zero_everywhere_is_every_layer_at_zero():
    hf = tiny.tiny_llama()

    def all_o_proj(m):
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()

    exact(edited(AtlasModel(hf), E.Edit("zero", "attn", None)), with_weights(hf, all_o_proj))
    g4 = tiny.tiny_gemma4()

    def all_ple(m):
        for layer in m.model.layers:
            layer.post_per_layer_input_norm.weight.zero_()

    exact(edited(AtlasModel(g4), E.Edit("zero", "ple", None)), with_weights(g4, all_ple))


# ----------------------------------------------------------------------------- average
@pytest.mark.parametrize("name", sorted(tiny.BUILDERS))
def test_average_is_the_hand_computed_mean(name):
    hf = tiny.BUILDERS[name]()
    model = AtlasModel(hf)
    means = E.write_means(model, MEAN_WINDOWS, batch_size=2)
    seen = tiny.capture(model, MEAN_WINDOWS)  # one forward of every window, plain hooks
    for block in model.blocks():
        hand = seen[block][:, 1:].double().reshape(-1, seen[block].shape[-1]).mean(dim=0)
        torch.testing.assert_close(means[block], hand, rtol=1e-12, atol=1e-12)
    block = Block(1, model.kinds[-1])
    mean = means[block].float()

    def replace(module, args, out):
        out = out.clone()
        out[:, 1:] = mean
        return out

    handle = model.write_module(block).register_forward_hook(replace)
    naive = model.logits(IDS)
    handle.remove()
    result = edited(model, E.Edit("average", block.kind, 1), means)
    exact(result, naive)
    exact(result[:, 0], model.logits(IDS)[:, 0])  # position 0 keeps its own write
    assert not torch.equal(result, model.logits(IDS))


def test_average_of_a_constant_write_changes_nothing():
    """A write that is the same vector at every position equals its own mean: Average is
    then the identity, while Zero is not (size is not importance)."""
    hf = tiny.tiny_llama()
    with torch.no_grad():
        mlp = hf.model.layers[1].mlp
        for p in mlp.parameters():
            p.zero_()
        mlp.down_proj.bias = torch.nn.Parameter(torch.randn(mlp.down_proj.out_features))
    model = AtlasModel(hf)
    means = E.write_means(model, MEAN_WINDOWS, batch_size=3)
    close(edited(model, E.Edit("average", "mlp", 1), means), model.logits(IDS))
    assert not torch.allclose(edited(model, E.Edit("zero", "mlp", 1)), model.logits(IDS))


# ----------------------------------------------------------------------------- rows→mean
@pytest.mark.parametrize("name", ["gemma4", "gemma3n"])
def test_rows_mean_of_a_ple_slice_is_the_table_edited(name):
    hf = tiny.BUILDERS[name]()
    model = AtlasModel(hf)
    tables = E.needed_tables(model, [E.Edit("rows_mean", "ple", 0)])
    P = model.ple_width
    for layer in (0, 2):
        cols = slice(layer * P, (layer + 1) * P)

        def slice_to_mean(m, cols=cols):
            w = m.model.embed_tokens_per_layer.weight
            w[:, cols] = w[:, cols].mean(dim=0)

        result = changed(model, edited(model, E.Edit("rows_mean", "ple", layer), tables=tables))
        close(result, with_weights(hf, slice_to_mean))

    def table_to_mean(m):
        w = m.model.embed_tokens_per_layer.weight
        w[:] = w.mean(dim=0)

    result = changed(model, edited(model, E.Edit("rows_mean", "ple", None), tables=tables))
    close(result, with_weights(hf, table_to_mean))


@pytest.mark.parametrize("name", ["gemma4", "llama"])
def test_rows_mean_of_the_token_embedding_is_the_table_edited(name):
    """Untied models: every row of the input embedding set to the mean row. Gemma 4's
    scaled lookup and its PLE projection of the token embedding both see the mean row."""
    hf = tiny.tiny_gemma4(tie=False) if name == "gemma4" else tiny.tiny_llama(tie=False)
    model = AtlasModel(hf)
    tables = E.needed_tables(model, [E.Edit("rows_mean", "embed")])

    def rows_to_mean(m):
        w = m.model.embed_tokens.weight
        w[:] = w.mean(dim=0)

    result = changed(model, edited(model, E.Edit("rows_mean", "embed"), tables=tables))
    close(result, with_weights(hf, rows_to_mean))


def test_rows_mean_leaves_a_tied_unembedding():
    """A tied Llama: the lookup's rows are the mean row, the output layer keeps the table:
    the same as feeding the mean row as inputs_embeds to the unedited model."""
    hf = tiny.tiny_llama(tie=True)
    model = AtlasModel(hf)
    tables = E.needed_tables(model, [E.Edit("rows_mean", "embed")])
    mean_row = hf.model.embed_tokens.weight.detach().mean(dim=0)
    naive = hf(inputs_embeds=mean_row.expand(*IDS.shape, -1), use_cache=False).logits
    close(changed(model, edited(model, E.Edit("rows_mean", "embed"), tables=tables)), naive)


# ----------------------------------------------------------------------------- layer skip
def test_skip_llama_is_the_identity_layer():
    hf = tiny.tiny_llama()
    model = AtlasModel(hf)
    layer = hf.model.layers[2]
    layer.forward = lambda hidden_states, *args, **kwargs: hidden_states
    naive = model.logits(IDS)
    del layer.forward
    close(changed(model, edited(model, E.Edit("skip", "layer", 2))), naive)


@pytest.mark.parametrize("name", ["gemma4", "gemma3n"])
def test_skip_gemma_is_every_post_norm_at_zero(name):
    """All three blocks off; Gemma 4's layer scalar still applies (its layer returns
    scalar · input)."""
    hf = tiny.BUILDERS[name]()

    def knobs_off(m):
        for path in ("post_attention_layernorm", "post_feedforward_layernorm",
                     "post_per_layer_input_norm"):  # fmt: skip
            m.model.layers[1].get_submodule(path).weight.zero_()

    model = AtlasModel(hf)
    exact(edited(model, E.Edit("skip", "layer", 1)), with_weights(hf, knobs_off))
    if name == "gemma4":
        seen = {}
        handle = hf.model.layers[1].register_forward_hook(
            lambda m, a, o: seen.update(x=a[0], out=o)
        )
        with E.applied(model, E.Edit("skip", "layer", 1)):
            model.logits(IDS)
        handle.remove()
        close(seen["out"], seen["x"] * hf.model.layers[1].layer_scalar)


# ----------------------------------------------------------------------------- flatten keys
def _attention(hf, edit=None):
    model = AtlasModel(hf)
    with E.applied(model, edit):
        return hf(input_ids=IDS, use_cache=False, output_attentions=True).attentions


def _assert_uniform(weights, support):
    """Each query row spreads evenly over the keys it sees (``support``)."""
    n = support.sum(-1, keepdim=True).to(weights.dtype)
    expected = torch.where(support, 1.0 / n, torch.zeros_like(weights))
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["gemma4", "gemma3n", "qwen3"])
def test_flatten_keys_gives_uniform_attention(name):
    """Key norm 0: every score is 0, so each query attends evenly to the keys its mask lets
    it see (its causal, and for sliding layers windowed, support in the unedited run). On
    Gemma 4 / 3n the KV-sharing layer 2 reuses layer 0's keys, so flattening layer 0
    flattens it too, and layer 1 (not flattened) is untouched."""
    builder = {"qwen3": tiny.tiny_qwen3, **tiny.BUILDERS}[name]
    hf = builder(attn="eager")
    clean = _attention(hf)
    flat = _attention(hf, E.Edit("flatten_keys", "keys", 0))
    _assert_uniform(flat[0], clean[0] > 0)
    assert not torch.allclose(clean[1], torch.zeros_like(clean[1]))
    exact(flat[1][:, :, :1], clean[1][:, :, :1])  # position 0 of layer 1: before any change
    if name != "qwen3":
        _assert_uniform(flat[2], clean[2] > 0)
        assert (clean[0] > 0).sum() < (torch.ones_like(clean[0]).tril() > 0).sum()  # windowed


def test_flatten_keys_gemma4_is_the_key_norm_at_zero():
    hf = tiny.tiny_gemma4()
    naive = with_weights(hf, lambda m: m.model.layers[1].self_attn.k_norm.weight.zero_())
    exact(edited(AtlasModel(hf), E.Edit("flatten_keys", "keys", 1)), naive)


def test_flatten_keys_refused_without_a_key_norm():
    with pytest.raises(ValueError, match="no key norm"):
        edited(AtlasModel(tiny.tiny_llama()), E.Edit("flatten_keys", "keys", 0))
    with pytest.raises(ValueError, match="layer 3 .* has no key norm"):
        edited(AtlasModel(tiny.tiny_gemma4()), E.Edit("flatten_keys", "keys", 3))
    assert [e.label for e in E.atlas_edits(AtlasModel(tiny.tiny_gemma4()), ["flatten_keys"])] \
        == ["flatten_keys L0", "flatten_keys L1", "flatten_keys all"]  # fmt: skip
    assert E.atlas_edits(AtlasModel(tiny.tiny_llama()), ["flatten_keys"]) == []


# ----------------------------------------------------------------------------- the list
def test_atlas_edits_and_refusals():
    g4 = AtlasModel(tiny.tiny_gemma4())
    labels = [e.label for e in E.atlas_edits(g4, ["zero", "rows_mean"], everywhere=False)]
    assert labels == [f"zero L{layer}.{k}" for k in ("attn", "mlp", "ple") for layer in range(4)] \
        + ["rows_mean embed"] + [f"rows_mean L{layer}.ple" for layer in range(4)]  # fmt: skip
    llama = AtlasModel(tiny.tiny_llama())
    assert not [e for e in E.atlas_edits(llama) if e.target == "ple"]
    with pytest.raises(ValueError, match="no PLE branch"):
        edited(llama, E.Edit("zero", "ple", 0))
    with pytest.raises(ValueError, match="no mean write of L0.attn"):
        edited(llama, E.Edit("average", "attn", 0), means={})
    with pytest.raises(ValueError, match="no mean row of the embed table"):
        edited(llama, E.Edit("rows_mean", "embed"))
    with pytest.raises(ValueError, match="layers 0..3"):
        edited(llama, E.Edit("zero", "attn", 4))
    with pytest.raises(ValueError, match="edit kind 'erase'"):
        E.Edit("erase", "attn", 0)
    with pytest.raises(ValueError, match="rows_mean edits one of embed, ple, not 'mlp'"):
        E.Edit("rows_mean", "mlp", 0)
    exact(model_logits := llama.logits(IDS), AtlasModel(tiny.tiny_llama()).logits(IDS))
    assert model_logits.shape == (*IDS.shape, tiny.V)  # no hook left behind by the refusals
