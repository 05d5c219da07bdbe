"""SAMOE §4: the toy dense source, trained by the workspace's loop, then upcycled."""

from __future__ import annotations

import numpy as np
import torch

from headgeom.samoe.config import DenseConfig, MoEConfig
from headgeom.samoe.dense import initial_dense, train_config, train_dense
from headgeom.samoe.upcycle import upcycle

DENSE = DenseConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_mlp=32, n_ctx=16, steps=30,
                    batch_size=4, lr_max=1e-2, lr_min=1e-3, warmup_steps=3, seed=7)  # fmt: skip
N_VOCAB = 11


def _ids(n, seed):
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(N_VOCAB - 1), n // (N_VOCAB - 1) + 1)[:n]
    return np.where(rng.random(n) < 0.05, rng.integers(0, N_VOCAB, n), base).astype(np.uint16)


def test_the_schedule_is_the_dense_configs():
    cfg = train_config(DENSE)
    assert (cfg.steps, cfg.batch_size, cfg.lr_max, cfg.lr_min, cfg.warmup_steps) == (
        30, 4, 1e-2, 1e-3, 3,
    )  # fmt: skip
    assert cfg.betas == (0.9, 0.95) and cfg.weight_decay == 0.1 and cfg.grad_clip == 1.0


def test_the_dense_source_learns_and_is_the_same_bytes_twice():
    model, result = train_dense(DENSE, _ids(3000, 0), _ids(600, 1), N_VOCAB, data_seed=1729)
    assert len(result.log) == DENSE.steps
    assert result.log["loss"].iloc[-5:].mean() < result.log["loss"].iloc[:5].mean()
    again, _ = train_dense(DENSE, _ids(3000, 0), _ids(600, 1), N_VOCAB, data_seed=1729)
    trained, start = model.state_dict(), initial_dense(DENSE, N_VOCAB).state_dict()
    assert all(torch.equal(trained[k], v) for k, v in again.state_dict().items())
    assert any(not torch.equal(trained[k], v) for k, v in start.items())


def test_the_trained_source_upcycles_into_every_variant():
    model, _ = train_dense(DENSE, _ids(3000, 0), _ids(600, 1), N_VOCAB, data_seed=1729)
    moe = MoEConfig(n_experts=4, top_k=2, state_dim=4)
    for variant in ("ordinary", "latest", "persistent"):
        sa = upcycle(model.state_dict(), model.cfg, moe, variant, seed=42)
        shared = sa.blocks[0].moe.shared.state_dict()
        dense_mlp = model.blocks[0].mlp.state_dict()
        assert all(torch.equal(shared[k], dense_mlp[k]) for k in dense_mlp)
