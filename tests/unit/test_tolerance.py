"""Check tolerances from the dtype (docs §2.6): the formula on hand-computed cases, and the
derivation's premise on real forwards: a float32 forward stays within the tolerance of the
same model in float64, under whatever kernels this CPU runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.heads.analysis import tolerance as T
from headgeom.model import registry
from tests.helpers.examples import random_pairs
from tests.helpers.models import zoo_model


def test_formula_by_hand():
    # 4 ulps per stage · 13 stages · 2^-23 · 30
    assert T.rounding_tolerance(torch.float32, 30.0, 13) == pytest.approx(4 * 13 * 2**-23 * 30)
    assert T.rounding_tolerance(torch.float64, -30.0, 13) == pytest.approx(4 * 13 * 2**-52 * 30)
    # a scale below 1 keeps the tolerance of order-one values
    assert T.rounding_tolerance(torch.float32, 1e-9, 1) == 4 * 2**-23


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="stages must be at least 1, got 0"):
        T.rounding_tolerance(torch.float32, 1.0, 0)
    with pytest.raises(ValueError, match="scale of the compared values is NaN"):
        T.rounding_tolerance(torch.float32, float("nan"), 3)


def test_residual_worst_and_nan():
    a, b = T.Residual(1e-7, 1e-6), T.Residual(5e-6, 1e-4)
    assert a.passed and b.passed
    assert a.worst(b) is a and b.worst(a) is a  # ratio 0.1 vs 0.05: a is nearer failing
    nan = T.Residual(float("nan"), 1e-6)
    assert not nan.passed and a.worst(nan) is nan


@pytest.mark.parametrize("geometry", sorted(registry.geometry_names("gpt")))
def test_float32_forward_within_its_tolerance_of_float64(geometry):
    """The derivation's premise: float32 rounding of a whole forward is a few ulps of the
    largest logit per stage. Far inside the tolerance here, on every geometry."""
    model = zoo_model(geometry, seed=5)
    clean = random_pairs(6, (6, 8), seed=3)[0]
    with torch.no_grad():
        lo = [model(torch.as_tensor(np.asarray(c))[None], last_only=True) for c in clean]
        model64 = model.double()
        hi = [model64(torch.as_tensor(np.asarray(c))[None], last_only=True) for c in clean]
    scale = max(float(x.abs().max()) for x in hi)
    worst = max(float((a.double() - b).abs().max()) for a, b in zip(lo, hi, strict=True))
    tol = T.rounding_tolerance(torch.float32, scale, model.cfg.n_layer + 1)
    assert T.model_dtype(model64) == torch.float64
    assert worst <= tol / 2, f"{geometry}: {worst:.3g} vs tolerance {tol:.3g}"
