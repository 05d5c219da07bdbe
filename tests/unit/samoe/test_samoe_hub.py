"""The SA-MoE wrap of Hub decoder layers (SAMOE §4, paper scale) on tiny random Llama
(SmolLM2's family) and Gemma 3 text models: against a hand-written dense-mixture forward, the
step-0 zero-write equivalence, the dense model recovered with the routed experts off, the
ledger identity, upcycling (K3) and counts (K5), checkpoints, and continued pretraining."""

import numpy as np
import pytest
import torch

from headgeom.hashing import ManifestMismatchError
from headgeom.samoe import counts, li
from headgeom.samoe.capture import capture
from headgeom.samoe.checkpoint import load_moe, load_verified_dense, save_hub_dense, save_moe
from headgeom.samoe.config import CPTConfig, MoEConfig
from headgeom.samoe.cpt import continued_pretraining
from headgeom.samoe.hub import TIED_HEAD, HubSAMoE, HubSource, dense_state
from headgeom.samoe.ledger import (
    Targets,
    boundary_pair,
    ledger,
    logit_reconstruction_residual,
    reconstruction_residual,
)
from headgeom.samoe.manifest import run_manifest, write_run_manifest
from headgeom.samoe.upcycle import check_upcycling, upcycle
from tests.helpers.samoe_hub import (
    N_LAYER,
    N_VOCAB,
    dense_lm,
    randomise_moe,
    reference_forward,
    tiny_config,
)

FAMILIES = ["llama", "gemma"]
VARIANTS = ["ordinary", "latest", "persistent"]
MOE = MoEConfig(n_experts=6, top_k=2, state_dim=8, router_x_init="state_block")


def source(lm) -> HubSource:
    return HubSource.of("tiny/" + lm.config.model_type, "0" * 40, lm.config)


def ids(batch=2, seq=20, seed=0):
    return torch.randint(0, N_VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def wrap(family, variant, seed=42, moe=MOE):
    lm = dense_lm(family)
    return upcycle(dense_state(lm), source(lm), moe, variant, seed).eval(), lm


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_wrap_computes_the_hand_written_mixture(family, variant):
    model, _ = wrap(family, variant)
    randomise_moe(model, seed=3)
    x = ids()
    cap = capture(model, x)
    ref = reference_forward(model, family, x)
    assert torch.allclose(cap.logits, ref["z"], atol=1e-5, rtol=0)
    assert torch.allclose(cap.output_logits, ref["logits"], atol=1e-5, rtol=0)
    if variant == "ordinary":
        assert cap.state is None and ref["state"] is None
    else:
        assert cap.delta.abs().max() > 0.1  # the writes are not trivial
        assert torch.allclose(cap.state[1:], ref["state"], atol=1e-5, rtol=0)
        assert torch.equal(cap.state[0], torch.zeros_like(cap.state[0]))


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_writes_make_the_three_variants_one_model_at_step_zero(family):
    x = ids(seed=1)
    caps = {v: capture(wrap(family, v)[0], x) for v in VARIANTS}
    for v in ("latest", "persistent"):
        assert torch.equal(caps[v].logits, caps["ordinary"].logits)
        assert torch.equal(caps[v].output_logits, caps["ordinary"].output_logits)
        assert torch.count_nonzero(caps[v].state) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_with_the_routed_experts_off_the_wrap_is_the_dense_hub_model(family):
    model, lm = wrap(family, "persistent")
    randomise_moe(model, seed=4)  # the state changes routing, not the output, here
    with torch.no_grad():
        for block in model.blocks:
            for expert in block.moe.experts:
                expert.down_proj.weight.zero_()
        x = ids(seed=2)
        dense, moe = lm(input_ids=x).logits, model(x)
    assert torch.allclose(moe, dense, atol=1e-6, rtol=0)
    assert (moe - dense).abs().max() < (wrap(family, "persistent")[0](x) - dense).abs().max()


@pytest.mark.parametrize("variant", ["latest", "persistent"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_ledger_identity_holds_on_the_wrap(family, variant):
    model, _ = wrap(family, variant)
    randomise_moe(model, seed=5)
    x = ids(3, 16, seed=5)
    cap = capture(model, x)
    grid = torch.cartesian_prod(torch.arange(3), torch.arange(16), torch.arange(1, N_LAYER))
    led = ledger(model, cap, Targets(grid[:, 0], grid[:, 1], grid[:, 2]))
    assert led.state_term.abs().max() > 0.1
    assert reconstruction_residual(led) <= 1e-5
    assert logit_reconstruction_residual(model, cap) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_li_components_rebuild_the_router_input_and_logits_on_the_wrap(family):
    """K14 through the Hub norms (Llama's RMSNorm; Gemma 3's sandwich: post-attention and
    post-feed-forward norms frozen too), their scales made non-trivial first."""
    model, _ = wrap(family, "ordinary")
    randomise_moe(model, seed=6)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(p + 0.5 * torch.randn(p.shape, generator=g))
    x = ids(2, 16, seed=6)
    cap = capture(model, x)
    targets = Targets([0, 1, 1], [7, 12, 15], [1, 3, 2])
    e2, e3 = boundary_pair(cap, targets)
    att = li.attribute(model, x, cap, targets, e2, e3)
    assert att.input_residual <= 1e-5 and att.logit_residual <= 1e-5
    assert att.alpha.abs().max() > 0.1
    assert (~torch.isnan(att.norm)).sum(-1).tolist() == [3 * L for L in targets.layer.tolist()]
    effects = li.oracle_effects(model, x, targets, e2, e3)
    assert torch.isfinite(effects[~torch.isnan(att.norm)]).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_upcycling_the_hub_model_passes_k3_and_counts_match_the_formula(family):
    lm = dense_lm(family)
    state = dense_state(lm)
    for variant in VARIANTS:
        model = upcycle(state, source(lm), MOE, variant, seed=7)
        k3 = check_upcycling(state, model)
        assert k3["check_K3.copies_mismatches"] == 0 and k3["check_K3.distinct_mismatches"] == 0
        expected = counts.counts(counts.model_shape(model), MOE, variant)
        assert counts.model_counts(model) == (expected.total, expected.active)
        # every dense tensor outside the MLPs is copied bit for bit
        for name, t in model.state_dict().items():
            if ".moe." not in name and ".write." not in name:
                assert torch.equal(t, state[model.dense_name(name)]), name
    assert TIED_HEAD not in model.state_dict()


def test_the_hub_shape_of_smollm2s_config_is_the_papers():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=49_152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      max_position_embeddings=8192, tie_word_embeddings=True)  # fmt: skip
    shape = counts.hub_shape(cfg, name="smollm2", seq_len=2048)
    for key in ("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_ffn", "n_vocab"):
        assert getattr(shape, key) == getattr(counts.SMOLLM2, key), key
    moe = MoEConfig()
    ours, paper = (
        counts.counts(shape, moe, "persistent"),
        counts.counts(counts.SMOLLM2, moe, "persistent"),
    )
    # the paper's counts ignore norms: 2·d per layer and the final d
    assert ours.total - paper.total == 30 * 2 * 576 + 576
    assert ours.flops_per_token == paper.flops_per_token


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoints_round_trip_through_the_dense_file_and_the_moe_file(tmp_path, family):
    lm = dense_lm(family)
    dense_path, manifest = tmp_path / "dense.safetensors", tmp_path / "dense.json"
    save_hub_dense(dense_path, lm, source(lm))
    write_run_manifest(manifest, run_manifest("samoe_dense_manifest", {"family": family},
                                              dense_path, {}, {}))  # fmt: skip
    state, src, vocab = load_verified_dense(dense_path, manifest)
    assert src == source(lm) and np.array_equal(vocab, np.arange(N_VOCAB))
    model = randomise_moe(upcycle(state, src, MOE, "persistent", seed=9), seed=9).eval()
    save_moe(tmp_path / "moe.safetensors", model, vocab, {"step": 0})
    back, vocab2, record = load_moe(tmp_path / "moe.safetensors")
    assert isinstance(back, HubSAMoE) and record["hub"]["repo_id"] == src.repo_id
    assert back.lm.lm_head.weight is back.lm.model.embed_tokens.weight  # re-tied
    saved, loaded = model.state_dict(), back.state_dict()
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    x = ids(seed=3)
    with torch.no_grad():  # same values; Gemma's kernels may block the loaded layout apart
        assert torch.allclose(back(x), model(x), atol=1e-6, rtol=0)
    assert np.array_equal(vocab2, vocab)


def test_a_dense_file_whose_bytes_changed_is_refused(tmp_path):
    lm = dense_lm("llama")
    dense_path, manifest = tmp_path / "dense.safetensors", tmp_path / "dense.json"
    save_hub_dense(dense_path, lm, source(lm))
    write_run_manifest(manifest, run_manifest("samoe_dense_manifest", {}, dense_path, {}, {}))
    save_hub_dense(dense_path, dense_lm("llama", seed=1), source(lm))
    with pytest.raises(ManifestMismatchError, match="dense.safetensors: SHA-256 is"):
        load_verified_dense(dense_path, manifest)


def test_an_unknown_hub_architecture_is_named():
    bad = HubSource("x/y", "0" * 40, {**tiny_config("llama").to_dict(), "model_type": "gpt2"})
    with pytest.raises(ValueError, match=r"x/y@0+: model_type 'gpt2' has no SA-MoE wrap"):
        HubSAMoE(bad, MOE, "persistent")


@pytest.mark.parametrize("family", FAMILIES)
def test_continued_pretraining_trains_the_wrap_and_its_writes(family):
    model, _ = wrap(family, "persistent")
    tokens = np.random.default_rng(0).integers(0, N_VOCAB, 4000)
    cpt = CPTConfig(steps=6, batch_size=2, shared_freeze_steps=2, warmup_steps=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    log = continued_pretraining(model, tokens, cpt, data_seed=1)
    after = model.state_dict()
    assert len(log) == 6 and np.isfinite(log["loss"]).all()
    assert any(not torch.equal(after[k], before[k]) for k in after if ".write." in k)
    assert any(not torch.equal(after[k], before[k]) for k in after if ".layer." in k)
