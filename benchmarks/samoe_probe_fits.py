"""The probes' logistic fits, ours (``headgeom.samoe.probes.fit_logistic``: scipy's
L-BFGS-B on a (classes, n) closure) beside torch's ``torch.optim.LBFGS`` on the (n, classes)
closure the stage used before, in one run, on the same features.

    python benchmarks/samoe_probe_fits.py [--threads 1] [--repeats 3]

For each shape of the toy demo's fits (n = 1,000 / 10,000 examples; d = 16 features, the
native state and the r-dimensional projections, and d = 64, the full hidden stream; 16
classes) it fits the whole C path of the study (0.01, 0.1, 1, 10, each warm-started from the
last) with both, and prints the wall time of the path (best of ``--repeats``), the objective
iterations, the ratio, how far apart the two optima are (max |ΔW| over max |W|), and the
share of predictions that agree. The objective is strictly convex: both stop within the
same gradient tolerance (1e-6) of one optimum, so they may differ only where an example's
two best classes are tied to within that tolerance.

Features are Gaussian blobs (a class's centre, unit noise), not a model's states: the fits'
cost depends on the shape and the conditioning, which blobs of moderate overlap resemble.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.runtime import set_threads
from headgeom.samoe import probes


def blobs(n: int, d: int, k: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standardised Gaussian blobs of ``k`` classes with overlapping centres."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * 0.6
    y = rng.integers(0, k, n)
    x = (centres[y] + rng.standard_normal((n, d))).astype(np.float32)
    return probes.Scaler.fit(x)(x), y


def fit_torch(x: np.ndarray, y: np.ndarray, n_classes: int, C: float,
              init: probes.Probe | None = None) -> tuple[probes.Probe, int]:  # fmt: skip
    """The reference: torch.optim.LBFGS (strong Wolfe, history 20, the same tolerance) on the
    same objective laid out (n, classes); (probe, objective evaluations)."""
    X = torch.as_tensor(x, dtype=torch.float64)
    Y = torch.as_tensor(y, dtype=torch.long)
    n, d = X.shape
    rows = torch.arange(n)
    W = torch.zeros(n_classes, d, dtype=torch.float64)
    b = torch.zeros(n_classes, dtype=torch.float64)
    if init is not None:
        W.copy_(torch.as_tensor(init.weight))
        b.copy_(torch.as_tensor(init.bias))
    W.grad, b.grad = torch.zeros_like(W), torch.zeros_like(b)
    opt = torch.optim.LBFGS([W, b], max_iter=probes.MAX_ITER, tolerance_grad=probes.TOL,
                            tolerance_change=0, history_size=probes.HISTORY,
                            line_search_fn="strong_wolfe")  # fmt: skip
    calls = [0]

    def closure():
        calls[0] += 1
        z = torch.addmm(b, X, W.T)
        z -= z.amax(1, keepdim=True)
        z_true = z[rows, Y].sum()
        p = z.exp_()
        total = p.sum(1, keepdim=True)
        loss = (total.log().sum() - z_true) / n + (W * W).sum() / (2 * C * n)
        p /= total
        p[rows, Y] -= 1.0
        torch.addmm(W, p.T, X, beta=1 / (C * n), alpha=1 / n, out=W.grad)
        torch.sum(p, 0, out=b.grad).div_(n)
        return loss

    opt.step(closure)
    closure()
    grad = max(W.grad.abs().max().item(), b.grad.abs().max().item())
    iterations = opt.state[opt._params[0]]["n_iter"]
    probe = probes.Probe(W.numpy().copy(), b.numpy().copy(), C,
                         grad <= probes.CONVERGED_GRAD, iterations, grad)  # fmt: skip
    return probe, calls[0]


def path(fit, x, y, k):
    """The C path of the study, warm-started; (probes, seconds)."""
    out, previous = [], None
    start = time.perf_counter()
    for C in probes.C_GRID:
        previous = fit(x, y, k, C, init=previous)
        out.append(previous)
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    k = 16
    evaluations = {"ours": 0, "torch": 0}  # L-BFGS iterations of the path

    def ours(x, y, k, C, init=None):
        probe = probes.fit_logistic(x, y, k, C, init=init)
        evaluations["ours"] += probe.iterations
        return probe

    def reference(x, y, k, C, init=None):
        probe, _ = fit_torch(x, y, k, C, init=init)
        evaluations["torch"] += probe.iterations
        return probe

    print(f"{'n':>6} {'d':>3} | {'ours s':>7} {'torch s':>8} {'× faster':>8} | "
          f"{'iter ours':>9} {'iter torch':>10} | {'max|ΔW|/max|W|':>15} {'agree':>6} "
          f"{'converged':>9}")  # fmt: skip
    totals = [0.0, 0.0]
    # warm-up, untimed: torch.optim's first step imports torch._dynamo (seconds)
    x, y = blobs(200, 4, k=3)
    ours(x, y, 3, 1.0)
    reference(x, y, 3, 1.0)
    for n in (1000, 10000):
        for d in (16, 64):
            x, y = blobs(n, d)
            times = {"ours": [], "torch": []}
            for _ in range(args.repeats):
                evaluations.update(ours=0, torch=0)
                a, t_ours = path(ours, x, y, k)
                b, t_torch = path(reference, x, y, k)
                times["ours"].append(t_ours)
                times["torch"].append(t_torch)
            t_ours, t_torch = min(times["ours"]), min(times["torch"])
            totals[0] += t_ours
            totals[1] += t_torch
            dw = max(np.abs(p.weight - q.weight).max() / np.abs(q.weight).max()
                     for p, q in zip(a, b, strict=True))  # fmt: skip
            agree = min(float((p.predict(x) == q.predict(x)).mean())
                        for p, q in zip(a, b, strict=True))  # fmt: skip
            converged = all(p.converged for p in a) and all(q.converged for q in b)
            print(f"{n:>6} {d:>3} | {t_ours:7.2f} {t_torch:8.2f} {t_torch / t_ours:8.2f} | "
                  f"{evaluations['ours']:>9} {evaluations['torch']:>10} | {dw:15.2e} "
                  f"{agree:6.4f} {str(converged):>9}")  # fmt: skip
    print(
        f"all four paths: ours {totals[0]:.2f} s, torch.optim.LBFGS {totals[1]:.2f} s "
        f"({totals[1] / totals[0]:.2f}× ours), {args.threads} thread(s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
