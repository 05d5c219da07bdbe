"""Training library: schedule, loader, validation loss, optimizer groups, determinism."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn import functional as F

from headgeom.model.checkpoint import save_checkpoint
from headgeom.run_config import (
    TrainConfig,
    checkpoint_manifest_name,
    checkpoint_name,
    checkpoint_schedule,
    parse_run_config,
)
from headgeom.training.data import (
    batch_at,
    check_sampling,
    lr_at,
    read_once_batch,
    sample_batch,
    validation_windows,
)
from headgeom.training.job import CorpusFiles, JobOutputs
from headgeom.training.loop import initial_model, train, validation_loss
from headgeom.training.state import Resume, ResumeMismatchError, read_resume_record

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
    model = initial_model(run_config(), n_vocab=11)
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


def test_validation_windows_cover_the_file_without_overlap():
    ids = np.arange(3 * N_CTX + 5)  # 3 whole windows (+1 target) and a dropped tail
    inputs, targets = validation_windows(ids, N_CTX)
    assert inputs.shape == targets.shape == (3, N_CTX) and inputs.dtype == torch.int64
    assert inputs.flatten().tolist() == list(range(3 * N_CTX))
    assert (targets == inputs + 1).all()  # next token
    with pytest.raises(ValueError, match="no 16-token window"):
        validation_windows(ids[:N_CTX], N_CTX)


# --------------------------------------------------------------------------- optimizer
def test_weight_decay_goes_to_rank_two_tensors_only():
    model = initial_model(run_config(), n_vocab=11)
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
    untrained = initial_model(run, n_vocab=8)
    model = initial_model(run, n_vocab=8)
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
        model = initial_model(r, n_vocab=8)
        train(model, corpus, corpus[:200], r.training, data_seed=1729, progress=False)
        paths.append(tmp_path / f"run{i}.safetensors")
        save_checkpoint(paths[-1], model, np.arange(8))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_frozen_write_buffers_are_untouched_by_training():
    cfg = run_config("write-common-axis", steps=8, eval_every=4)
    run = parse_run_config(cfg)
    model = initial_model(run, n_vocab=8)
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


# --------------------------------------------------------------------------- data orders
def test_read_once_batches_tile_the_corpus_in_order():
    """docs §3.3: step s (1-based) reads tokens[(s−1)·B·T : s·B·T + 1]."""
    B, steps = 3, 4
    tokens = np.arange(steps * B * N_CTX + 1, dtype=np.uint16)  # exactly enough
    inputs, targets = [], []
    for s in range(1, steps + 1):
        x, y = read_once_batch(tokens, s, B, N_CTX)
        assert x.shape == y.shape == (B, N_CTX) and x.dtype == torch.int64
        assert x[0, 0].item() == (s - 1) * B * N_CTX  # first input of step s
        np.testing.assert_array_equal(y.numpy(), x.numpy() + 1)
        inputs.append(x.flatten())
        targets.append(y.flatten())
    # every input token exactly once, in corpus order; the final token only as a target
    np.testing.assert_array_equal(torch.cat(inputs).numpy(), np.arange(steps * B * N_CTX))
    assert torch.cat(targets)[-1].item() == steps * B * N_CTX
    with pytest.raises(ValueError, match="read-once step 5 needs tokens"):
        read_once_batch(tokens, steps + 1, B, N_CTX)
    x, _ = batch_at(tokens, 2, B, N_CTX, data_seed=1, sampling="read_once")
    assert torch.equal(x, read_once_batch(tokens, 2, B, N_CTX)[0])  # the seed plays no part


def test_check_sampling_names_what_the_corpus_lacks():
    cfg = tcfg(steps=10, batch_size=2)
    check_sampling("read_once", 10 * 2 * N_CTX + 1, cfg, N_CTX)
    with pytest.raises(ValueError, match=r"has 320 tokens but read_once .* = 321"):
        check_sampling("read_once", 320, cfg, N_CTX)
    check_sampling("with_replacement", N_CTX + 1, cfg, N_CTX)
    with pytest.raises(ValueError, match="with_replacement sampling needs one window"):
        check_sampling("with_replacement", N_CTX, cfg, N_CTX)
    with pytest.raises(ValueError, match="sampling 'shuffled' is not known"):
        check_sampling("shuffled", 10_000, cfg, N_CTX)


def test_checkpoint_schedule_is_clipped_to_the_run():
    assert tcfg().checkpoint_steps == (0, 256, 1024, 4096, 16384)  # docs §7.3
    assert checkpoint_schedule(tcfg(steps=1250)) == (0, 256, 1024)
    assert checkpoint_schedule(tcfg(steps=30, checkpoint_steps=[30, 4, 0, 4])) == (0, 4)
    assert checkpoint_schedule(tcfg(steps=65536)) == (0, 256, 1024, 4096, 16384)
    assert checkpoint_name(256) == "step000256.safetensors"
    assert checkpoint_manifest_name(256) == "step000256.manifest.json"
    for bad, message in (
        ({"checkpoint_steps": [-1]}, "checkpoint_steps"),
        ({"checkpoint_steps": "0,256"}, "checkpoint_steps"),
        ({"resume_every": 0}, "resume_every=0"),
        ({"compile": "yes"}, "compile='yes'"),
    ):
        with pytest.raises(ValueError, match=message):
            tcfg(**bad)


def test_job_paths_default_beside_the_final_checkpoint(tmp_path):
    out = JobOutputs.beside(tmp_path / "s1" / "model.safetensors", str(tmp_path / "log.parquet"))
    assert out.checkpoint_dir == tmp_path / "s1" / "checkpoints"
    assert out.resume_dir == tmp_path / "s1" / "resume" and out.log == tmp_path / "log.parquet"
    chosen = JobOutputs.beside("m.safetensors", "l.parquet", "ck", "rs")
    assert (chosen.checkpoint_dir, chosen.resume_dir) == (Path("ck"), Path("rs"))
    assert CorpusFiles("t", "v", "w", "m.json").manifest == Path("m.json")


# --------------------------------------------------------------------------- resume
class _Stop(Exception):
    pass


def test_resume_after_an_interruption_is_bitwise_exact(tmp_path):
    """Interrupt (an exception at a checkpoint step, past the last state write), build the
    model afresh, continue from the state: same weights, buffers and log (except seconds)."""
    run = parse_run_config(
        run_config("all-common-axis", steps=14, eval_every=5, checkpoint_steps=[0, 4, 9])
    )
    cfg = dataclasses.replace(run.training, resume_every=3)
    corpus = repetitive_corpus(800)
    records = {}

    def keep(step, model, val_loss):
        records.setdefault(step, []).append(val_loss)
        return {"val_loss": val_loss}

    reference = initial_model(run, n_vocab=8)
    ref = train(
        reference, corpus, corpus[:200], cfg, data_seed=1729, progress=False, on_checkpoint=keep
    )
    assert set(ref.checkpoints) == {0, 4, 9}

    resume = Resume(tmp_path / "state.safetensors", {"config_hash": run.config_hash})

    def stop_at_9(step, model, val_loss):
        if step == 9:
            raise _Stop
        return keep(step, model, val_loss)

    with pytest.raises(_Stop):
        train(
            initial_model(run, n_vocab=8),
            corpus,
            corpus[:200],
            cfg,
            data_seed=1729,
            progress=False,
            resume=resume,
            on_checkpoint=stop_at_9,
        )
    assert read_resume_record(resume.path)["step"] == 6  # written at 3 and 6
    random.seed(99)  # the state restores the RNGs too
    model = initial_model(run, n_vocab=8)
    result = train(
        model,
        corpus,
        corpus[:200],
        cfg,
        data_seed=1729,
        progress=False,
        resume=resume,
        on_checkpoint=keep,
    )
    assert result.resumed_from == 6
    assert sorted(result.checkpoints) == [0, 4, 9]  # 0 and 4 restored from the state
    for (name, a), (_, b) in zip(
        reference.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes(), name
    pd.testing.assert_frame_equal(
        ref.log.drop(columns="seconds"), result.log.drop(columns="seconds"), check_exact=True
    )
    assert ref.checkpoints[9]["val_loss"] == result.checkpoints[9]["val_loss"]
    assert (np.diff(result.log["seconds"]) >= 0).all()


def test_a_state_of_another_run_is_refused_untouched(tmp_path):
    run = parse_run_config(run_config(steps=4, warmup_steps=1, eval_every=2))
    cfg = dataclasses.replace(run.training, resume_every=2)
    corpus = repetitive_corpus(400)
    resume = Resume(tmp_path / "state.safetensors", {"config_hash": "a" * 64})
    train(
        initial_model(run, n_vocab=8),
        corpus,
        corpus[:100],
        cfg,
        data_seed=1729,
        progress=False,
        resume=resume,
    )
    before = resume.path.read_bytes()
    other = Resume(resume.path, {"config_hash": "b" * 64})
    model = initial_model(run, n_vocab=8)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        ResumeMismatchError, match=f"config_hash: state has '{'a' * 64}', this run has '{'b' * 64}'"
    ):
        train(model, corpus, corpus[:100], cfg, data_seed=1729, progress=False, resume=other)
    assert resume.path.read_bytes() == before
    assert all(torch.equal(init[k], v) for k, v in model.state_dict().items())


# --------------------------------------------------------------------------- frozen maps
def test_frozen_maps_are_cast_once_and_follow_their_buffers():
    """The activation-dtype copy of a frozen map is reused across steps, and a new buffer
    value (load_state_dict), dtype or module copy gets a fresh one."""
    run = parse_run_config(run_config("all-rotated-self", steps=4, warmup_steps=1))
    model = initial_model(run, n_vocab=8)
    writer, reader = model.blocks[1].attn.writer, model.blocks[1].attn.reader
    ids = torch.arange(8).view(1, 8)
    with torch.no_grad():
        before = model(ids)
        cached = writer.__dict__["_cast_cache"][1]
        assert model(ids).equal(before) and writer.__dict__["_cast_cache"][1] is cached
    expected = (writer.scale * writer.basis).float()
    assert cached.dtype == torch.float32 and torch.equal(cached, expected)
    # a different basis through load_state_dict changes the output: no stale copy
    state = model.state_dict()
    swapped = {**state, "blocks.1.attn.writer.basis": state["blocks.0.attn.writer.basis"]}
    swapped["blocks.1.attn.reader.basis"] = state["blocks.0.attn.reader.basis"]
    model.load_state_dict(swapped)
    with torch.no_grad():
        after = model(ids)
    assert not after.equal(before)
    assert torch.equal(writer.__dict__["_cast_cache"][1], (writer.scale * writer.basis).float())
    assert torch.equal(reader.__dict__["_cast_cache"][1], reader.basis.float())
    reference = initial_model(run, n_vocab=8)  # no cache yet: computes from the buffers
    reference.load_state_dict(swapped)
    with torch.no_grad():
        assert reference(ids).equal(after)
        assert model.double()(ids).dtype == torch.float64  # a dtype change re-casts
    assert writer.__dict__["_cast_cache"][1].dtype == torch.float64


def test_bf16_autocast_forward_casts_frozen_maps_to_bf16_once():
    """The GPU path's autocast, exercised on CPU: frozen maps are cached in bf16, the model
    runs and its loss stays close to the fp32 one."""
    run = parse_run_config(run_config("all-rotated", steps=4, warmup_steps=1))
    model = initial_model(run, n_vocab=8)
    ids = torch.arange(16).remainder(8).view(2, 8)
    with torch.no_grad():
        exact = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
    assert logits.dtype == torch.bfloat16
    block = model.blocks[1].attn
    assert block.reader.__dict__["_cast_cache"][1].dtype == torch.bfloat16
    assert block.writer.__dict__["_cast_cache"][1].dtype == torch.bfloat16
    approx = F.cross_entropy(logits.float().flatten(0, 1), ids.roll(-1, 1).flatten())
    assert approx.item() == pytest.approx(exact.item(), rel=2e-2)
