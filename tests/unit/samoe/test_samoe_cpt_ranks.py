"""SAMOE §7 at paper scale: continued pretraining over several ranks (torch.distributed,
gloo on CPU here, NCCL on a cluster) takes the step one process takes with the same
micro-batches: rank r's share is the r-th slice of each batch, gradients averaged."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from headgeom.samoe.config import CPTConfig
from headgeom.samoe.cpt import continued_pretraining
from tests.unit.samoe.test_samoe_cpt import GradRecorder, _model, _tokens, assert_same_grads

CPT = CPTConfig(steps=3, batch_size=4, lr=3e-3, shared_freeze_steps=1, warmup_steps=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, n: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=n)
    torch.set_num_threads(1)
    try:
        model = _model()
        with pytest.MonkeyPatch.context() as mp_:
            rec = GradRecorder(mp_, model)
            log = continued_pretraining(model, _tokens(), CPT, data_seed=7)
        if rank == 0:
            torch.save({"grads": rec.steps, "loss": log["loss"].tolist(),
                        "grad_norm": log["grad_norm"].tolist()}, out)  # fmt: skip
    finally:
        torch.distributed.destroy_process_group()


def _recorded(cfg: CPTConfig) -> tuple[list[dict], list[float], list[float]]:
    model = _model()
    with pytest.MonkeyPatch.context() as patch:
        rec = GradRecorder(patch, model)
        log = continued_pretraining(model, _tokens(), cfg, data_seed=7)
    return rec.steps, log["loss"].tolist(), log["grad_norm"].tolist()


def test_two_ranks_take_the_one_process_step_with_the_same_micro_batches(tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_rank, args=(2, _free_port(), out), nprocs=2, join=True)
    got = torch.load(out)
    grads, loss, grad_norm = _recorded(CPTConfig(**{**CPT.__dict__, "micro_batch": 2}))
    assert_same_grads(grads, got["grads"])
    assert max(abs(a - b) for a, b in zip(got["loss"], loss, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(got["grad_norm"], grad_norm, strict=True)) < 1e-5
    # and another split (the whole batch in one pass) is not the same step: the aux losses
    # are batch-level, so the comparison can tell the splits apart
    whole, _, _ = _recorded(CPT)
    assert len(whole) == len(grads)
    assert max((whole[0][k] - g).abs().max() for k, g in grads[0].items()) > 1e-5
