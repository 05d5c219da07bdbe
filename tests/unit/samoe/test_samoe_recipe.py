"""The continued-pretraining recipe (SAMOE §7, K4): LR groups, schedule, weight decay."""

import math

import pytest
import torch

from headgeom.samoe.config import CPTConfig
from headgeom.samoe.recipe import (
    LR_GROUPS,
    check_lr_groups,
    lr_at,
    lr_group,
    make_optimizer,
    set_lrs,
)
from tests.helpers.samoe import random_model, token_ids

CPT = CPTConfig()  # toy: 120 steps, η = 1e-3, warmup 6, shared frozen 12


def test_groups_by_parameter():
    assert lr_group("blocks.3.moe.experts.7.c_fc.weight") == "base"
    assert lr_group("blocks.3.moe.shared.c_proj.bias") == "shared"
    assert lr_group("blocks.3.moe.router.W_s") == "router_write"
    assert lr_group("blocks.3.write.proj.weight") == "router_write"
    assert lr_group("blocks.3.attn.reader.c_attn.weight") == "base"
    assert lr_group("wte.weight") == "base"


def test_schedule_by_hand():
    """Peaks η, 0.1η, 2η; linear warmup over 6 steps; cosine to 0.1 × peak at step 120."""
    peaks = {"base": 1e-3, "shared": 1e-4, "router_write": 2e-3}
    for g, peak in peaks.items():
        assert lr_at(120, g, CPT) == pytest.approx(0.1 * peak, rel=1e-12)
    assert lr_at(3, "base", CPT) == pytest.approx(0.5e-3)
    assert lr_at(6, "router_write", CPT) == pytest.approx(2e-3)
    mid = 6 + (120 - 6) / 2  # cosine half-way: (1 + 0.1) / 2 of the peak
    assert lr_at(int(mid), "base", CPT) == pytest.approx(0.55e-3)
    assert lr_at(0, "base", CPT) == 0.0


def test_shared_lr_is_zero_while_frozen_then_follows_the_common_multiplier():
    for step in range(0, 13):
        assert lr_at(step, "shared", CPT) == 0.0
    s = 13
    frac = (s - 6) / (120 - 6)
    mult = 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
    assert lr_at(s, "shared", CPT) == pytest.approx(1e-4 * mult, rel=1e-12)


def test_k4_check():
    record = check_lr_groups(CPT)
    assert record["check_K4.frozen_max_abs_residual"] == 0.0
    assert record["check_K4.final_max_rel_residual"] <= 1e-12


def test_optimizer_groups_decay_and_frozen_shared_expert():
    model = random_model("persistent", seed=15, write_std=0.3)
    opt = make_optimizer(model, CPT)
    seen = {}
    for g in opt.param_groups:
        for p in g["params"]:
            seen[id(p)] = g
    for name, p in model.named_parameters():
        g = seen[id(p)]
        assert g["lr_group"] == lr_group(name)
        assert g["weight_decay"] == (CPT.weight_decay if p.dim() >= 2 else 0.0), name
    assert {g["lr_group"] for g in opt.param_groups} == set(LR_GROUPS)
    assert opt.defaults["betas"] == (0.9, 0.95)

    # An update during the freeze leaves the shared expert's bytes untouched.
    shared = {n: p.detach().clone() for n, p in model.named_parameters() if ".shared." in n}
    others = {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." in n}
    logged = set_lrs(opt, 1, CPT)
    assert logged["shared"] == 0.0 and logged["base"] > 0
    ids = token_ids(2, 24)
    logits, aux = model(ids, return_aux=True)
    loss = logits.logsumexp(-1).mean() + CPT.aux.load_balance * aux.load_balance
    loss = loss + CPT.aux.z_loss * aux.z_loss
    loss.backward()
    opt.step()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in shared.items())
    assert any(not torch.equal(params[n], t) for n, t in others.items())


def test_zero_aux_coefficients_are_allowed():
    cpt = CPTConfig.from_dict({"aux": {"load_balance": 0.0, "z_loss": 0.0}})
    assert cpt.aux.load_balance == 0.0 and cpt.aux.z_loss == 0.0
