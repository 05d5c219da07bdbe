"""Sparse upcycling (SAMOE §6, K3) and the init manifest (§2), against the dense tensors."""

import math

import pytest
import torch

from headgeom.checks import CheckFailed
from headgeom.samoe.config import VARIANTS
from headgeom.samoe.upcycle import (
    check_experts_agree,
    check_upcycling,
    expert_hashes,
    init_manifest,
    upcycle,
)
from tests.helpers.samoe import CFG, MOE, dense_gpt

P = MOE.drop_prob


@pytest.fixture(scope="module")
def dense():
    return dense_gpt().state_dict()


@pytest.fixture(scope="module")
def models(dense):
    return {(v, s): upcycle(dense, CFG, MOE, v, s) for v in VARIANTS for s in (42, 43)}


def test_reinit_fraction_and_statistics(dense, models):
    model = models["persistent", 42]
    for layer, block in enumerate(model.blocks):
        for name in ("c_fc.weight", "c_proj.weight"):
            w = dense[f"blocks.{layer}.mlp.{name}"]
            n = w.numel()
            drawn = []
            for expert in block.moe.experts:
                t = expert.state_dict()[name]
                replaced = t != w  # a Gaussian draw equal to the entry has probability 0
                assert abs(replaced.double().mean().item() - P) <= 4 * math.sqrt(0.2475 / n)
                drawn.append(t[replaced])
            # the replaced entries are N(mean(w), std(w)²): 5 standard errors of m draws
            drawn = torch.cat(drawn).double()
            m, mu, sigma = drawn.numel(), w.double().mean(), w.double().std()
            assert abs(drawn.mean() - mu) <= 5 * sigma / math.sqrt(m)
            assert abs(drawn.std() - sigma) <= 5 * sigma / math.sqrt(2 * m)


def test_copies_biases_and_distinct_experts(dense, models):
    model = models["latest", 42]
    state = model.state_dict()
    for layer, block in enumerate(model.blocks):
        for name, t in block.moe.shared.state_dict().items():
            assert torch.equal(t, dense[f"blocks.{layer}.mlp.{name}"])  # byte-equal copy
        for expert in block.moe.experts:
            for name in ("c_fc.bias", "c_proj.bias"):
                assert torch.equal(expert.state_dict()[name], dense[f"blocks.{layer}.mlp.{name}"])
        weights = [e.c_fc.weight for e in block.moe.experts]
        for i in range(len(weights)):
            for j in range(i):
                assert not torch.equal(weights[i], weights[j])
        assert torch.count_nonzero(block.write.proj.weight) == 0
        assert torch.count_nonzero(block.write.proj.bias) == 0
    for name, t in dense.items():  # attention, norms, embeddings: copied
        if ".mlp." not in name:
            assert torch.equal(state[name], t), name


def test_experts_identical_across_variants_and_different_across_seeds(models):
    for seed in (42, 43):
        manifests = {v: init_manifest(models[v, seed]) for v in VARIANTS}
        check_experts_agree(manifests)
        e0 = models["ordinary", seed].blocks[2].moe.experts[5].c_fc.weight
        assert torch.equal(e0, models["persistent", seed].blocks[2].moe.experts[5].c_fc.weight)
    a = expert_hashes(init_manifest(models["persistent", 42]))
    b = expert_hashes(init_manifest(models["persistent", 43]))
    routed = [k for k in a if ".experts." in k and k.endswith("weight")]
    assert routed and all(a[k] != b[k] for k in routed)
    with pytest.raises(CheckFailed, match="K3.variants"):
        check_experts_agree({"s42": init_manifest(models["persistent", 42]),
                             "s43": init_manifest(models["persistent", 43])})  # fmt: skip


def test_router_init_is_kaiming_on_the_full_matrix(models):
    d, r, E, a = CFG.d_model, MOE.state_dim, MOE.n_experts, MOE.router_init_a
    gain = math.sqrt(2.0 / (1 + a**2))
    bound = gain * math.sqrt(3.0 / (d + r))
    state_router = models["persistent", 42].blocks[0].moe.router
    full = torch.cat([state_router.W_x, state_router.W_s], dim=1)  # (E, d + r)
    assert full.abs().max() <= bound and full.abs().max() > 0.9 * bound
    # Uniform(−b, b) has variance b²/3; 5 standard errors of the sample variance
    n = full.numel()
    var_se = math.sqrt((bound**4 / 5 - (bound**2 / 3) ** 2) / n)
    assert abs(full.double().pow(2).mean().item() - bound**2 / 3) <= 5 * var_se
    lwo = models["latest", 42].blocks[0].moe.router
    assert torch.equal(lwo.W_x, state_router.W_x) and torch.equal(lwo.W_s, state_router.W_s)
    ordinary = models["ordinary", 42].blocks[0].moe.router
    assert ordinary.W_s is None and ordinary.W_x.shape == (E, d)
    assert ordinary.W_x.abs().max() <= gain * math.sqrt(3.0 / d)  # its own fan-in d
    assert torch.allclose(ordinary.W_x, state_router.W_x * math.sqrt((d + r) / d))
    routers = [b.moe.router.W_x for b in models["persistent", 42].blocks]
    assert not torch.equal(routers[0], routers[1])  # one generator per layer


def test_upcycling_leaves_the_global_rng_alone(dense):
    before = torch.get_rng_state()
    a = upcycle(dense, CFG, MOE, "persistent", 42)
    assert torch.equal(torch.get_rng_state(), before)
    torch.rand(100)  # whatever ran before does not change the bytes
    b = upcycle(dense, CFG, MOE, "persistent", 42)
    assert init_manifest(a) == init_manifest(b)


def test_manifest_groups_every_tensor_once(models):
    model = models["persistent", 42]
    man = init_manifest(model)
    names = [n for group in man["tensors"].values() for n in group]
    assert sorted(names) == sorted(model.state_dict())
    assert set(man["tensors"]) == {"shared", "routed", "router", "write", "other"}
    assert all(".moe.router." in n for n in man["tensors"]["router"])
    assert all(".write." in n for n in man["tensors"]["write"])
    assert len(man["tensors"]["routed"]) == CFG.n_layer * MOE.n_experts * 4


def test_k3_check_passes_and_catches_a_changed_shared_expert(dense, models):
    record = check_upcycling(dense, models["persistent", 42])
    assert record["check_K3.copies_mismatches"] == 0
    assert record["check_K3.distinct_mismatches"] == 0
    assert record["check_K3.fraction_max_abs_residual"] <= record["check_K3.fraction_tolerance"]
    broken = upcycle(dense, CFG, MOE, "persistent", 42)
    with torch.no_grad():
        broken.blocks[1].moe.shared.c_fc.bias[0] += 1.0
    with pytest.raises(CheckFailed, match="K3.copies"):
        check_upcycling(dense, broken)


def test_a_missing_dense_tensor_is_named(dense):
    partial = {k: v for k, v in dense.items() if k != "blocks.3.mlp.c_fc.weight"}
    with pytest.raises(KeyError, match="blocks.3.mlp.c_fc.weight"):
        upcycle(partial, CFG, MOE, "ordinary", 42)
