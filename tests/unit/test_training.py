"""Training library: schedule, loader, validation loss, optimizer groups, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from headgeom.checkpoint import save_checkpoint
from headgeom.training import (
    TrainConfig,
    build_model,
    lr_at,
    parse_run_config,
    sample_batch,
    train,
    validation_loss,
)

N_CTX = 16
MODEL = {"n_ctx": N_CTX, "n_layer": 2, "n_head": 2, "d_model": 16, "d_head": 8, "d_mlp": 32}
TRAINING = {
    "steps": 30,
    "batch_size": 8,
    "lr_max": 1e-2,
    "lr_min": 1e-3,
    "warmup_steps": 5,
    "schedule": "cosine",
    "weight_decay": 0.1,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "grad_clip": 1.0,
    "eval_every": 10,
    "eval_batch_size": 4,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest (and immune to a busy machine) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_config(geometry: str = "learned", seed: int = 3, **training) -> dict:
    return {
        "model_name": geometry,
        "seed": seed,
        "data_seed": 1729,
        "model": {**MODEL, "geometry": geometry},
        "training": {**TRAINING, **training},
    }


def repetitive_corpus(n: int = 4000, period: int = 8) -> np.ndarray:
    return np.tile(np.arange(period, dtype=np.int32), n // period)


def tcfg(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**TRAINING, **kw})


# --------------------------------------------------------------------------- schedule
def test_lr_warmup_is_linear_from_zero():
    cfg = tcfg(steps=100, warmup_steps=10, lr_max=1e-3, lr_min=1e-4)
    assert lr_at(0, cfg) == 0.0
    assert lr_at(1, cfg) == pytest.approx(1e-4)
    assert lr_at(5, cfg) == pytest.approx(5e-4)
    assert lr_at(10, cfg) == pytest.approx(1e-3)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_lr_decay_endpoints_and_midpoint(schedule):
    cfg = tcfg(steps=110, warmup_steps=10, lr_max=1e-3, lr_min=1e-4, schedule=schedule)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(110, cfg) == pytest.approx(1e-4)
    assert lr_at(60, cfg) == pytest.approx(5.5e-4)  # halfway: both shapes give the mean
    quarter = 1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi / 4)) if schedule == "cosine" else 7.75e-4
    assert lr_at(35, cfg) == pytest.approx(quarter)
    decay = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))
    with pytest.raises(ValueError, match="outside"):
        lr_at(111, cfg)


def test_lr_without_warmup_starts_at_peak():
    cfg = tcfg(steps=10, warmup_steps=0, lr_max=2e-3, lr_min=2e-3)
    assert [lr_at(s, cfg) for s in (0, 5, 10)] == pytest.approx([2e-3] * 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"warmup_steps": 30}, "warmup_steps=30"),
        ({"schedule": "step"}, "schedule='step'"),
        ({"lr_min": 1.0}, "lr_min=1.0"),
        ({"betas": [0.9, 1.0]}, "betas"),
        ({"precision": "fp16"}, "precision='fp16'"),
        ({"lr_peak": 1e-3}, "unknown training config keys \\['lr_peak'\\]"),
    ],
)
def test_bad_training_config_names_key_and_value(change, message):
    with pytest.raises(ValueError, match=message):
        tcfg(**change)


def test_run_config_rejects_unknown_keys_and_n_vocab():
    with pytest.raises(ValueError, match="unknown run config keys \\['sed'\\]"):
        parse_run_config({**run_config(), "sed": 1})
    with pytest.raises(ValueError, match="n_vocab"):
        parse_run_config({**run_config(), "model": {**MODEL, "n_vocab": 9}})
    with pytest.raises(ValueError, match="unknown model config keys"):
        parse_run_config({**run_config(), "model": {**MODEL, "width": 9}})
    run = parse_run_config({**run_config(seed=42), "repository_name": "plain-learned42"})
    assert run.config_id == "plain-learned42"
    assert parse_run_config(run_config(seed=42)).config_id == "learned-s42"


# --------------------------------------------------------------------------- loader
def test_sample_batch_windows_are_shifted_slices():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = sample_batch(tokens, step=7, batch_size=5, n_ctx=N_CTX, data_seed=1729)
    assert x.shape == y.shape == (5, N_CTX) and x.dtype == torch.int64
    expected = np.random.default_rng([1729, 7]).integers(0, 1000 - N_CTX, size=5)
    np.testing.assert_array_equal(x[:, 0].numpy(), expected)
    np.testing.assert_array_equal(x.numpy(), expected[:, None] + np.arange(N_CTX))
    np.testing.assert_array_equal(y.numpy(), x.numpy() + 1)


def test_sample_batch_is_a_pure_function_of_seed_and_step():
    tokens = np.random.default_rng(0).integers(0, 50, 5000)
    run = [sample_batch(tokens, s, 4, N_CTX, 1729)[0] for s in range(1, 11)]
    resumed = [sample_batch(tokens, s, 4, N_CTX, 1729)[0] for s in range(6, 11)]  # resume at 6
    for a, b in zip(run[5:], resumed, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(run[0], run[1])
    assert not torch.equal(sample_batch(tokens, 1, 4, N_CTX, 1730)[0], run[0])


def test_sample_batch_reaches_but_never_passes_the_last_window():
    tokens = np.arange(N_CTX + 3)  # offsets 0, 1, 2 only
    x, y = sample_batch(tokens, 1, 200, N_CTX, 0)
    assert set(x[:, 0].tolist()) == {0, 1, 2}
    assert y.max().item() == N_CTX + 2
    with pytest.raises(ValueError, match="shorter than one window"):
        sample_batch(np.arange(N_CTX), 1, 1, N_CTX, 0)


# --------------------------------------------------------------------------- validation
def test_validation_loss_matches_a_hand_loop():
    model = build_model(run_config(), n_vocab=11)
    val = np.random.default_rng(1).integers(0, 11, 5 * N_CTX + 7)  # 5 windows + dropped tail
    windows = []
    for w in range((len(val) - 1) // N_CTX):
        x = torch.as_tensor(val[w * N_CTX : (w + 1) * N_CTX])[None]
        y = torch.as_tensor(val[w * N_CTX + 1 : (w + 1) * N_CTX + 1])
        with torch.no_grad():
            windows.append(F.cross_entropy(model(x)[0], y).item())
    assert len(windows) == 5
    for batch_size in (1, 2, 64):
        got = validation_loss(model, val, N_CTX, batch_size)
        assert got == pytest.approx(np.mean(windows), rel=1e-6)
    assert validation_loss(model, val[: 5 * N_CTX + 1], N_CTX, 3) == pytest.approx(got, rel=1e-6)
    with pytest.raises(ValueError, match="no 16-token window"):
        validation_loss(model, val[:N_CTX], N_CTX, 1)


# --------------------------------------------------------------------------- optimizer
def test_weight_decay_goes_to_rank_two_tensors_only():
    model = build_model(run_config(), n_vocab=11)
    decay, no_decay = model.optim_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert {"wte.weight", "wpe.weight", "blocks.0.mlp.c_fc.weight"} <= decayed
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert "ln_f.weight" in {names[id(p)] for p in no_decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


# --------------------------------------------------------------------------- loop
@pytest.fixture(scope="module")
def trained():
    """A tiny learned model trained on a period-8 corpus, plus its untrained twin."""
    run = parse_run_config(run_config())
    corpus = repetitive_corpus()
    untrained = build_model(run, n_vocab=8)
    model = build_model(run, n_vocab=8)
    result = train(model, corpus, corpus[:400], run.training, data_seed=1729, progress=False)
    return run, corpus, untrained, model, result


def test_training_reduces_loss_on_a_repetitive_corpus(trained):
    run, corpus, untrained, model, result = trained
    before = validation_loss(untrained, corpus[:400], N_CTX, 8)
    assert before > 1.9  # ≈ ln 8 at initialisation
    assert result.val_loss < 0.5 * before
    assert result.log["loss"].iloc[-5:].mean() < result.log["loss"].iloc[:5].mean() - 0.5


def test_training_log_rows(trained):
    run, _, _, _, result = trained
    log = result.log
    cfg = run.training
    assert list(log.columns) == ["step", "tokens", "loss", "lr", "grad_norm", "seconds", "val_loss"]
    assert log["step"].tolist() == list(range(1, cfg.steps + 1))
    assert log["tokens"].tolist() == [s * cfg.batch_size * N_CTX for s in log["step"]]
    assert log["lr"].tolist() == pytest.approx([lr_at(s, cfg) for s in log["step"]])
    assert log.loc[log["val_loss"].notna(), "step"].tolist() == [10, 20, 30]
    assert log["val_loss"].iloc[-1] == result.val_loss
    assert (np.diff(log["seconds"]) >= 0).all() and (log["grad_norm"] > 0).all()
    assert result.device == "cpu" and result.precision == "fp32"


def test_training_is_deterministic_to_the_checkpoint_byte(tmp_path):
    run = parse_run_config(run_config(steps=6, eval_every=3))
    corpus = repetitive_corpus(800)
    paths = []
    for i, seed in enumerate((3, 3, 4)):
        r = parse_run_config({**run.raw, "seed": seed})
        model = build_model(r, n_vocab=8)
        train(model, corpus, corpus[:200], r.training, data_seed=1729, progress=False)
        paths.append(tmp_path / f"run{i}.safetensors")
        save_checkpoint(paths[-1], model, np.arange(8))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_frozen_write_buffers_are_untouched_by_training():
    cfg = run_config("write-common-axis", steps=8, eval_every=4)
    run = parse_run_config(cfg)
    model = build_model(run, n_vocab=8)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    assert any(n.endswith("writer.basis") for n in buffers)
    frozen_ids = {id(b) for b in model.buffers()}
    optimized = {id(p) for group in model.optim_groups(0.1) for p in group["params"]}
    assert not frozen_ids & optimized
    before = model.blocks[0].attn.writer.b_O.detach().clone()
    corpus = repetitive_corpus(800)
    train(model, corpus, corpus[:200], run.training, data_seed=1729, progress=False)
    for name, buffer in model.named_buffers():
        assert not buffer.requires_grad and buffer.grad is None, name
        assert buffer.dtype == buffers[name].dtype
        assert buffer.numpy().tobytes() == buffers[name].numpy().tobytes(), name
    assert not torch.equal(model.blocks[0].attn.writer.b_O, before)  # learned b_O did train
