"""The SA-MoE analyses' device path on the CPU (no test here needs a GPU): the device flag's
choices and refusals, and for capture and the ledger, suppression, gradient×write, the
probes, Li attribution and perplexity, that an explicit ``torch.device("cpu")`` gives
bitwise what the default gives, and that every tensor the library makes takes its device
from its inputs (run inside ``torch.device("meta")``, a tensor made on the default device
would be a meta tensor and fail or differ). The CUDA path is this code with the model and
inputs on a GPU; it has not been run on one here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from headgeom.runtime import analysis_device
from headgeom.samoe import li, probes
from headgeom.samoe.capture import capture
from headgeom.samoe.ledger import (
    Targets,
    boundary_pair,
    history_metrics,
    ledger,
    state_only_replay,
)
from headgeom.samoe.quality import perplexity
from headgeom.samoe.rankings import finite_difference, gradient_x_write
from headgeom.samoe.suppression import Rows, check_hook_no_op, suppression_outcomes
from tests.helpers import samoe as h

CPU = torch.device("cpu")


def same(a, b) -> None:
    """Bitwise equality of two results: tensors, arrays, dataclasses, tuples, floats."""
    if isinstance(a, torch.Tensor):
        assert a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, strict=True)
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            same(getattr(a, field.name), getattr(b, field.name))
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b or (a != a and b != b), (a, b)  # NaN equals NaN here


def on_default_meta(fn):
    """``fn()`` with the default device set to meta: a tensor made without a device (or
    from the default one) lands there and cannot meet the CPU inputs unnoticed."""
    with torch.device("meta"):
        return fn()


@pytest.fixture(scope="module")
def persistent():
    model = h.random_model("persistent", seed=3, write_std=0.4)
    ids = h.token_ids(batch=3, seq=24, seed=1)
    targets = Targets([0, 1, 2, 2], [10, 15, 20, 8], [4, 5, 3, 5])
    return model, ids, targets


@pytest.fixture(scope="module")
def ordinary():
    model = h.random_model("ordinary", seed=4)
    ids = h.token_ids(batch=3, seq=24, seed=2)
    targets = Targets([0, 1, 2, 0], [10, 15, 20, 21], [3, 5, 4, 2])
    return model, ids, targets


# --------------------------------------------------------------------------- the flag
def test_the_device_flag_resolves_auto_and_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert analysis_device("auto") == CPU
    assert analysis_device("cpu") == CPU


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_is_refused_naming_the_flag(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=rf"--device {name}: torch sees no CUDA device") as err:
        analysis_device(name)
    assert "--device auto" in str(err.value) and "--device cpu" in str(err.value)


@pytest.mark.parametrize("name", ["gpu", "mps", "meta", ""])
def test_other_devices_are_refused_naming_the_flag(name):
    with pytest.raises(ValueError, match="--device .*use --device auto, cpu or cuda"):
        analysis_device(name)


# --------------------------------------------------------------------------- capture, ledger
def test_capture_and_ledger_explicit_cpu_equal_the_default(persistent):
    model, ids, targets = persistent
    cap = capture(model, ids)
    led = ledger(model, cap, targets)
    rep = state_only_replay(model, cap, targets, led)
    hist = history_metrics(led.contributions, targets.layer)
    cap_cpu = capture(model.to(CPU), ids.to(CPU))
    led_cpu = ledger(model, cap_cpu, targets.to(CPU))
    same(cap_cpu, cap)
    same(led_cpu, led)
    same(state_only_replay(model, cap_cpu, targets.to(CPU), led_cpu), rep)
    same(history_metrics(led_cpu.contributions, targets.layer.to(CPU)), hist)
    assert cap.logits.device == CPU and led.contributions.device == CPU


def test_capture_and_ledger_make_no_tensor_on_the_default_device(persistent):
    model, ids, targets = persistent
    cap = capture(model, ids)
    led = ledger(model, cap, targets)

    def run():
        c = capture(model, ids)
        d = ledger(model, c, targets)
        return c, d, state_only_replay(model, c, targets, d)

    cap_m, led_m, rep_m = on_default_meta(run)
    same(cap_m, cap)
    same(led_m, led)
    same(rep_m, state_only_replay(model, cap, targets, led))


# --------------------------------------------------------------------------- interventions
def test_suppression_and_gradients_explicit_cpu_equal_the_default(persistent):
    model, ids, targets = persistent
    cap = capture(model, ids)
    led = ledger(model, cap, targets)
    want = (suppression_outcomes(model, ids, cap, targets),
            gradient_x_write(model, ids, targets, led.e2, led.e3),
            finite_difference(model, ids, targets, led.e2, led.e3))  # fmt: skip
    model_cpu, ids_cpu, targets_cpu = model.to(CPU), ids.to(CPU), targets.to(CPU)
    got = (suppression_outcomes(model_cpu, ids_cpu, cap, targets_cpu),
           gradient_x_write(model_cpu, ids_cpu, targets_cpu, led.e2, led.e3),
           finite_difference(model_cpu, ids_cpu, targets_cpu, led.e2, led.e3))  # fmt: skip
    same(got, want)
    meta = on_default_meta(lambda: (
        suppression_outcomes(model, ids, cap, targets),
        gradient_x_write(model, ids, targets, led.e2, led.e3),
        finite_difference(model, ids, targets, led.e2, led.e3)))  # fmt: skip
    same(meta, want)
    rows = Rows(targets.batch, targets.position, targets.layer - 1)
    assert on_default_meta(lambda: check_hook_no_op(model, ids, rows)) == check_hook_no_op(
        model, ids, rows)  # fmt: skip


# --------------------------------------------------------------------------- Li
def test_li_explicit_cpu_equals_the_default(ordinary):
    model, ids, targets = ordinary
    cap = capture(model, ids)
    e2, e3 = boundary_pair(cap, targets)

    def run(m, x, t):
        return (li.attribute(m, x, cap, t, e2, e3), li.gradient_x_component(m, x, t, e2, e3),
                li.oracle_effects(m, x, t, e2, e3))  # fmt: skip

    want = run(model, ids, targets)
    same(run(model.to(CPU), ids.to(CPU), targets.to(CPU)), want)
    same(on_default_meta(lambda: run(model, ids, targets)), want)


# --------------------------------------------------------------------------- probes
def _blobs(n=300, d=6, k=3, seed=0, spread=0.6):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * 3
    y = rng.integers(0, k, n)
    return (centres[y] + spread * rng.standard_normal((n, d))).astype(np.float32), y


def test_probe_fits_explicit_cpu_equal_the_default():
    x, y = _blobs()
    xc, yc = _blobs(n=120, seed=1)
    for device in (CPU, "cpu"):
        same(probes.fit_selected((x, y), (xc, yc), 3, (0.1, 1.0), device=device),
             probes.fit_selected((x, y), (xc, yc), 3, (0.1, 1.0)))  # fmt: skip
        same(probes.pca_basis(x, 3, seed=0, device=device), probes.pca_basis(x, 3, seed=0))
    net = probes.fit_mlp((x, y), (xc, yc), 3, 4, seed=7)
    net_cpu = probes.fit_mlp((x, y), (xc, yc), 3, 4, seed=7, device=CPU)
    for a, b in zip(net.state_dict().values(), net_cpu.state_dict().values(), strict=True):
        same(a, b)
    # and nothing falls back on the default device
    same(on_default_meta(lambda: probes.fit_logistic(x, y, 3, C=1.0, device=CPU)),
         probes.fit_logistic(x, y, 3, C=1.0))  # fmt: skip
    # (not the MLP: Adam keeps its step count on the default device, torch's own choice)


# --------------------------------------------------------------------------- quality
def test_perplexity_follows_the_model_device(ordinary):
    model, ids, _ = ordinary
    want = perplexity(model, ids)
    assert perplexity(model.to(CPU), ids.to(CPU)) == want
    assert on_default_meta(lambda: perplexity(model, ids)) == want
