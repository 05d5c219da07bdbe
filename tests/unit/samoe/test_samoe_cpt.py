"""SAMOE §7: the continued-pretraining loop on a tiny upcycled model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.samoe.config import AuxConfig, CPTConfig
from headgeom.samoe.cpt import continued_pretraining, objective
from headgeom.samoe.recipe import LR_GROUPS, peak_lr
from headgeom.samoe.upcycle import upcycle
from headgeom.training.data import sample_batch
from tests.helpers import samoe as h

CPT = CPTConfig(steps=12, batch_size=4, lr=3e-3, shared_freeze_steps=5, warmup_steps=2)


def _tokens(n=4000, seed=0):
    # a repeating pattern the model can learn quickly, with some noise
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(h.N_VOCAB - 1), n // (h.N_VOCAB - 1) + 1)[:n]
    noise = rng.random(n) < 0.05
    return np.where(noise, rng.integers(0, h.N_VOCAB, n), base).astype(np.int64)


def _model(variant="persistent", seed=42):
    return upcycle(h.dense_gpt().state_dict(), h.CFG, h.MOE, variant, seed)


def test_the_loss_falls_and_the_log_has_one_row_per_update():
    model, tokens = _model(), _tokens()
    log = continued_pretraining(model, tokens, CPT, data_seed=1729)
    assert list(log["step"]) == list(range(1, CPT.steps + 1))
    assert log["loss"].iloc[-3:].mean() < log["loss"].iloc[:3].mean()
    assert np.isfinite(log[["load_balance", "z_loss", "grad_norm"]].to_numpy()).all()
    # each group's logged LR follows the recipe: shared 0 through the freeze, then rising
    assert (log.loc[log["step"] <= CPT.shared_freeze_steps, "lr_shared"] == 0).all()
    assert log.loc[log["step"] == CPT.shared_freeze_steps + 1, "lr_shared"].item() > 0
    for group in LR_GROUPS:
        assert log[f"lr_{group}"].max() <= peak_lr(group, CPT) * (1 + 1e-12)


def test_the_frozen_shared_expert_is_unchanged_until_the_freeze_ends():
    model = _model()

    def shared():
        return {k: v.clone() for k, v in model.state_dict().items() if ".moe.shared." in k}

    before, seen = shared(), {}
    cpt = CPTConfig(**{**CPT.to_dict(), "steps": 8, "shared_freeze_steps": 6, "aux": AuxConfig()})
    continued_pretraining(model, _tokens(), cpt, data_seed=1729,
                          on_step=lambda step, row: seen.__setitem__(step, shared()))  # fmt: skip
    for step in range(1, 7):  # updates 1..6 have shared LR 0: not one byte moves
        assert all(torch.equal(before[k], seen[step][k]) for k in before), step
    assert any(not torch.equal(before[k], seen[8][k]) for k in before)  # and then it trains


def test_the_loss_is_cross_entropy_plus_the_weighted_aux_losses():
    model, tokens = _model(), _tokens()
    x, y = sample_batch(tokens, 1, 2, h.CFG.n_ctx, 1729)
    _, parts = objective(model, x, y, CPT)
    want = parts["loss"] + 0.01 * parts["load_balance"] + 1e-3 * parts["z_loss"]
    assert parts["total_loss"] == pytest.approx(want, rel=1e-6)
    # by hand: the cross-entropy of the logits
    logits = model(x)
    logp = torch.log_softmax(logits.double(), -1)
    ce = -logp.gather(-1, y[..., None]).mean().item()
    assert parts["loss"] == pytest.approx(ce, rel=1e-5)
    off = CPTConfig(**{**CPT.to_dict(), "aux": AuxConfig(load_balance=0.0, z_loss=0.0)})
    _, parts_off = objective(model, x, y, off)
    assert parts_off["total_loss"] == pytest.approx(parts_off["loss"], rel=1e-7)


def test_training_is_deterministic_and_the_variants_share_the_batches():
    a, b = _model(), _model()
    log_a = continued_pretraining(a, _tokens(), CPT, data_seed=1729)
    log_b = continued_pretraining(b, _tokens(), CPT, data_seed=1729)
    assert log_a.equals(log_b)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(),
                                                 strict=True))  # fmt: skip


def test_the_state_variants_learn_to_write():
    # the write head starts at exactly zero and the router's state columns give it gradient
    model = _model("latest")
    continued_pretraining(model, _tokens(), CPT, data_seed=1729)
    written = [b.write.proj.weight.abs().max().item() for b in model.blocks[:-1]]
    assert max(written) > 0
    assert model.blocks[-1].write.proj.weight.abs().max().item() == 0  # no router reads it


def test_a_stopped_run_resumes_to_the_same_bytes(tmp_path):
    """Stop after update 3 (a signal), resume: the model, the optimizer's effect and the log
    equal an uninterrupted run's exactly; a state of another run is refused."""
    from headgeom.training.preemption import Preempted
    from headgeom.training.state import Resume, ResumeMismatchError

    cpt = CPTConfig(steps=6, batch_size=2, warmup_steps=1, shared_freeze_steps=1)
    tokens = _tokens()
    straight = _model()
    log = continued_pretraining(straight, tokens, cpt, data_seed=7)

    model = _model()
    resume = Resume(tmp_path / "state.safetensors", {"run": "a"})
    calls = iter([None, None, "SIGTERM"])
    with pytest.raises(Preempted):
        continued_pretraining(model, tokens, cpt, 7, resume=resume, stop=lambda: next(calls, None))
    assert resume.path.exists()
    with pytest.raises(ResumeMismatchError, match="different identity"):
        continued_pretraining(_model(), tokens, cpt, 7,
                              resume=Resume(resume.path, {"run": "b"}))  # fmt: skip
    fresh = _model()  # a new process: nothing but the state file carries over
    resumed = continued_pretraining(fresh, tokens, cpt, 7, resume=resume)
    pd.testing.assert_frame_equal(resumed, log, check_exact=True)
    for (name, a), (_, b) in zip(straight.state_dict().items(), fresh.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    assert not resume.path.exists()  # done: the state is removed


class GradRecorder:
    """Every update's gradients (before clipping), by parameter name: Adam normalises each
    coordinate, so near-zero gradients (a key bias, a rarely chosen expert) turn summation
    noise into LR-sized steps; the gradients are what accumulation must reproduce."""

    def __init__(self, monkeypatch, model):
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.steps: list[dict[str, torch.Tensor]] = []
        clip = torch.nn.utils.clip_grad_norm_

        def record(params, *args, **kwargs):
            params = list(params)
            self.steps.append({self.names[id(p)]: p.grad.clone() for p in params
                               if p.grad is not None and id(p) in self.names})  # fmt: skip
            return clip(params, *args, **kwargs)

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record)


def assert_same_grads(a: list[dict], b: list[dict], atol: float = 1e-6) -> None:
    assert len(a) == len(b) and len(a) > 0
    for step, (ga, gb) in enumerate(zip(a, b, strict=True), 1):
        assert ga.keys() == gb.keys(), step
        for name, g in ga.items():
            torch.testing.assert_close(gb[name], g, rtol=0, atol=atol, msg=f"{step} {name}")


def test_micro_batches_accumulate_to_the_whole_batchs_gradient():
    """Without the batch-level aux losses the objective is a mean over equal micro-batches,
    so accumulating two halves gives the whole batch's gradient (up to summation order)."""
    cfg = CPTConfig(steps=3, batch_size=4, lr=3e-3, shared_freeze_steps=1, warmup_steps=1,
                    aux=AuxConfig(load_balance=0.0, z_loss=0.0))  # fmt: skip
    grads = []
    for micro in (0, 2):
        model = _model()
        with pytest.MonkeyPatch.context() as patch:
            rec = GradRecorder(patch, model)
            log = continued_pretraining(model, _tokens(), CPTConfig(**{**cfg.__dict__,
                                        "micro_batch": micro}), data_seed=7)  # fmt: skip
        grads.append((rec.steps, log))
    (whole, log_whole), (halves, log_halves) = grads
    assert_same_grads(whole, halves)
    np.testing.assert_allclose(log_halves["loss"], log_whole["loss"], rtol=0, atol=1e-6)


def test_bf16_autocast_trains_near_the_float32_run():
    cfg = CPTConfig(steps=4, batch_size=4, lr=3e-3, shared_freeze_steps=1, warmup_steps=1)
    fp32 = continued_pretraining(_model(), _tokens(), cfg, data_seed=7)
    bf16 = continued_pretraining(
        _model(), _tokens(), CPTConfig(**{**cfg.__dict__, "precision": "bf16"}), data_seed=7
    )
    assert not np.array_equal(bf16["loss"], fp32["loss"])  # autocast was on
    np.testing.assert_allclose(bf16["loss"], fp32["loss"], rtol=0, atol=0.05)


@pytest.mark.parametrize(("micro", "ranks"), [(3, 1), (0, 3), (2, 4)])
def test_a_batch_that_does_not_split_is_refused(micro, ranks):
    cfg = CPTConfig(batch_size=4, micro_batch=micro)
    with pytest.raises(ValueError, match="batch_size 4"):
        cfg.accumulation(ranks)


def test_precision_and_micro_batch_are_checked():
    with pytest.raises(ValueError, match="precision"):
        CPTConfig(precision="fp16")
    with pytest.raises(ValueError, match="micro_batch"):
        CPTConfig(micro_batch=-1)
