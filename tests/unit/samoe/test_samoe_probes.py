"""SAMOE §13: probe fitting, preprocessing, masks, clustered accuracy, projections."""

from __future__ import annotations

import numpy as np
import pytest

from headgeom.samoe import probes
from headgeom.samoe.checks import CheckFailed


def _blobs(n=300, d=6, k=3, seed=0, spread=0.6):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * 3
    y = rng.integers(0, k, n)
    return (centres[y] + spread * rng.standard_normal((n, d))).astype(np.float32), y


def test_the_fit_is_the_penalised_optimum():
    x, y = _blobs()
    probe = probes.fit_logistic(x, y, 3, C=1.0)
    assert probe.converged and probe.grad_norm <= probes.CONVERGED_GRAD
    # first-order optimality by hand, in float64: Xᵀ(P − Y)/n + W/(C n) = 0 and Σ(P − Y) = 0
    X, n = x.astype(np.float64), len(y)
    logits = X @ probe.weight.T + probe.bias
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    onehot = np.eye(3)[y]
    grad_w = (p - onehot).T @ X / n + probe.weight / (1.0 * n)
    grad_b = (p - onehot).mean(0)
    assert np.abs(grad_w).max() < 1e-5 and np.abs(grad_b).max() < 1e-5
    assert (probe.predict(x) == y).mean() > 0.95


def test_a_smaller_c_shrinks_the_weights_and_calibration_chooses():
    x, y = _blobs()
    small, large = probes.fit_logistic(x, y, 3, 0.01), probes.fit_logistic(x, y, 3, 10.0)
    assert np.linalg.norm(small.weight) < np.linalg.norm(large.weight)
    xc, yc = _blobs(seed=1)
    chosen = probes.fit_selected((x, y), (xc, yc), 3)
    accs = {C: (probes.fit_logistic(x, y, 3, C).predict(xc) == yc).mean() for C in probes.C_GRID}
    assert accs[chosen.C] == max(accs.values())
    assert chosen.C == min(C for C, a in accs.items() if a == max(accs.values()))


def test_k10_stops_on_a_fit_that_did_not_converge():
    ok = probes.fit_logistic(*_blobs(), 3, 1.0)
    assert probes.check_converged([ok])["check_K10_mismatches"] == 0
    bad = probes.Probe(ok.weight, ok.bias, 1.0, False, probes.MAX_ITER, 1e-2)
    with pytest.raises(CheckFailed, match="K10"):
        probes.check_converged([ok, bad])


def test_the_scaler_is_fit_on_training_data_only():
    rng = np.random.default_rng(0)
    train = rng.normal(2.0, 3.0, size=(500, 4))
    other = rng.normal(-5.0, 1.0, size=(100, 4))
    scale = probes.Scaler.fit(train)
    z = scale(other)
    np.testing.assert_allclose(z, (other - train.mean(0)) / train.std(0), rtol=1e-5, atol=1e-5)
    assert abs(scale(train).mean()) < 1e-5


def test_transition_mask_and_clustered_accuracy_by_hand():
    src = np.array([[0, 1], [2, 3], [1, 0], [4, 5]])
    tgt = np.array([[1, 0], [2, 4], [0, 2], [5, 4]])
    assert probes.transition_mask(src, tgt).tolist() == [False, True, True, False]
    pred = np.array([1, 1, 0, 0, 1, 1])
    y = np.array([1, 0, 0, 0, 0, 1])
    seq = np.array(["a", "a", "a", "b", "b", "c"])
    mask = np.array([True, True, True, True, True, False])
    clustered, pooled = probes.clustered_accuracy(pred, y, seq, mask)
    assert clustered == pytest.approx((2 / 3 + 1 / 2) / 2)  # c has no masked example
    assert pooled == pytest.approx(3 / 5)


def test_projections():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 10)) @ np.diag([5, 4, 3] + [0.1] * 7)
    basis = probes.pca_basis(x, 3, seed=0)
    # the top principal directions of a diagonal covariance are the first 3 axes
    assert np.abs(basis[3:]).max() < 0.1 and np.allclose(
        np.abs(basis.T @ basis), np.eye(3), atol=1e-8
    )
    proj = probes.random_projection(10, 4, seed=2)
    assert proj.shape == (10, 4) and np.array_equal(proj, probes.random_projection(10, 4, seed=2))
    coef = rng.standard_normal((3, 10))
    q = probes.supervised_subspace(coef, 6, seed=1)
    assert np.allclose(q.T @ q, np.eye(6), atol=1e-10)
    # the classifier's rows lie in the span of the first directions
    np.testing.assert_allclose(q @ (q.T @ coef.T), coef.T, atol=1e-10)


def test_the_fit_matches_torch_lbfgs_on_the_old_layout():
    """An independent optimiser (torch.optim.LBFGS on the (n, classes) closure the stage used
    before, kept in benchmarks/samoe_probe_fits.py) reaches the same optimum."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "samoe_probe_fits.py"
    spec = importlib.util.spec_from_file_location("samoe_probe_fits", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    x, y = bench.blobs(400, 8, k=5)
    for C in (0.1, 10.0):
        ours = probes.fit_logistic(x, y, 5, C)
        theirs, _ = bench.fit_torch(x, y, 5, C)
        assert ours.converged and theirs.converged
        scale = np.abs(theirs.weight).max()
        assert np.abs(ours.weight - theirs.weight).max() <= 1e-4 * scale
        assert np.abs(ours.bias - theirs.bias).max() <= 1e-4 * max(np.abs(theirs.bias).max(), 1)
        assert (ours.predict(x) == theirs.predict(x)).mean() >= 0.99
