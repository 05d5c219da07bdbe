"""Future-routing accessibility probes (SAMOE §13): predict a later router's clean Top-1
expert from what an earlier router sees at the same position.

* **Fitting** [CHOICE §13.3]: L2 multinomial logistic regression, full-batch L-BFGS
  (scipy's L-BFGS-B, sklearn's solver; 20 correction pairs) in float64 on float32 features
  (1,000 iterations, gradient tolerance 1e-6), the penalty ‖W‖²/(2C) on the weights (not
  the bias), C chosen on calibration data only (:func:`fit_selected`); a fit that does not
  converge stops the stage (K10).
* **Preprocessing** (normative): a scaler fit on the training examples only, applied to
  calibration and final data; projected features get a second scaler.
* **Representations**: the native state, the full hidden stream, and r-dimensional
  projections of it: PCA (randomized SVD, fixed seed), random Gaussian projections / √r,
  and the supervised subspace (the row space of a fitted full-hidden classifier, from an
  SVD in float64, completed to r directions by QR with seeded Gaussian columns).
* **Scoring**: accuracy only where the Top-2 sets of source and target differ (the
  transition mask E6), per sequence then an equal-weight mean over sequences (the
  "source-cluster" accuracy [CHOICE §13.2]); pooled accuracy is kept too.
* **Devices**: the fits (L-BFGS, still float64; the MLP) and PCA's randomized SVD run on
  ``device`` (default the CPU); features come in and probes go out as numpy arrays, and the
  scalers, projections, predictions and scores stay on the host (cheap beside the fits).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import torch

from headgeom.samoe import checks

#: [CHOICE §13.3] the C grid, L-BFGS iterations, gradient tolerance and history (the
#: correction pairs kept).
C_GRID = (0.01, 0.1, 1.0, 10.0)
MAX_ITER, TOL, HISTORY = 1000, 1e-6, 20
#: K10: a fit whose largest |gradient| is still above this at the end did not converge.
CONVERGED_GRAD = 1e-5


@dataclass
class Scaler:
    """Per-feature mean and standard deviation of the training examples."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Scaler:
        x = np.asarray(x, dtype=np.float32)
        std = x.std(0)
        return cls(x.mean(0), np.where(std > 0, std, 1.0).astype(np.float32))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, dtype=np.float32) - self.mean) / self.std).astype(np.float32)


@dataclass
class Probe:
    weight: np.ndarray  # (classes, d)
    bias: np.ndarray  # (classes,)
    C: float
    converged: bool
    iterations: int
    grad_norm: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(np.asarray(x, dtype=np.float64) @ self.weight.T + self.bias, axis=1)


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


def fit_logistic(
    x: np.ndarray, y: np.ndarray, n_classes: int, C: float, init: Probe | None = None,
    device: torch.device | str | None = None,
) -> Probe:  # fmt: skip
    """Minimise mean cross-entropy + ‖W‖²/(2 C n) by L-BFGS (sklearn's
    ``LogisticRegression(C=C)`` objective divided by n, and its solver: scipy's L-BFGS-B, here
    without bounds), stopping when the largest |gradient| is below ``TOL``; converged when it
    ends below ``CONVERGED_GRAD``. ``init`` warm-starts from another fit (the objective is
    strictly convex: the optimum does not depend on it). The objective and its closed-form
    gradient (P − onehot)ᵀX / n + W / (C n), no autograd graph, run on ``device`` in float64
    (CUDA has it; the CPU is the default); scipy's two-loop recursion runs on the host."""
    device = _device(device)
    X = torch.as_tensor(np.asarray(x, dtype=np.float32), dtype=torch.float64, device=device)
    Y = torch.as_tensor(np.asarray(y), dtype=torch.long, device=device)
    n, d = X.shape
    K = n_classes
    # [W | b] as one flat vector, viewed as the weights and the bias (a column: the logits are
    # laid out (classes, n), so the reductions over classes run along contiguous rows)
    theta, grad = (torch.zeros(K * d + K, dtype=torch.float64, device=device) for _ in "ab")
    W, b = theta[: K * d].view(K, d), theta[K * d :].view(K, 1)
    grad_W, grad_b = grad[: K * d].view(K, d), grad[K * d :]
    # the onehot's part of the gradient, constant across evaluations: Σ_i onehot_i x_iᵀ, counts
    onehot_X = torch.zeros(K, d, dtype=torch.float64, device=device).index_add_(0, Y, X)
    counts = torch.bincount(Y, minlength=K).to(torch.float64)
    Y_row = Y[None, :]

    def objective(values: np.ndarray) -> tuple[float, np.ndarray]:
        theta.copy_(torch.from_numpy(values))
        z = torch.addmm(b, W, X.T)  # (classes, n)
        z -= z.amax(0, keepdim=True)
        z_true = z.gather(0, Y_row).sum()
        p = z.exp_()
        total = p.sum(0, keepdim=True)
        loss = (total.log().sum() - z_true) / n + (W * W).sum() / (2 * C * n)
        p /= total
        torch.addmm(onehot_X, p, X, beta=-1 / n, alpha=1 / n, out=grad_W)
        grad_W.add_(W, alpha=1 / (C * n))
        torch.sum(p, 1, out=grad_b).sub_(counts).div_(n)
        return loss.item(), grad.cpu().numpy().copy()

    start = np.zeros(K * d + K)
    if init is not None:
        start[: K * d], start[K * d :] = np.ravel(init.weight), init.bias
    fit = scipy.optimize.minimize(objective, start, jac=True, method="L-BFGS-B",
                                  options={"maxcor": HISTORY, "gtol": TOL, "ftol": 0.0,
                                           "maxiter": MAX_ITER})  # fmt: skip
    grad_norm = float(np.abs(fit.jac).max())  # the gradient at fit.x, as the search left it
    return Probe(fit.x[: K * d].reshape(K, d).copy(), fit.x[K * d :].copy(), C,
                 grad_norm <= CONVERGED_GRAD, int(fit.nit), grad_norm)  # fmt: skip


def check_converged(probes: Sequence[Probe]) -> dict:
    """K10: every fit converged (the count of those that did not, which must be 0)."""
    bad = sum(not p.converged for p in probes)
    return checks.enforce("K10", float(bad), 0.0, "count", what="probe fits that did not converge")


def fit_selected(
    train: tuple[np.ndarray, np.ndarray], calibration: tuple[np.ndarray, np.ndarray],
    n_classes: int, grid: Sequence[float] = C_GRID, device: torch.device | str | None = None,
) -> Probe:  # fmt: skip
    """The probe of the C in ``grid`` with the best calibration accuracy (ties: smaller C).
    The fits run in increasing C, each warm-started from the last (a regularisation path),
    on ``device``."""
    best, previous = None, None
    for C in sorted(grid):
        probe = previous = fit_logistic(*train, n_classes, C, init=previous, device=device)
        acc = float((probe.predict(calibration[0]) == calibration[1]).mean())
        if best is None or acc > best[0]:
            best = (acc, probe)
    return best[1]


def transition_mask(source_sets: np.ndarray, target_sets: np.ndarray) -> np.ndarray:
    """E6: the numeric Top-2 index sets of source and target differ (n, k) each -> (n,)."""
    return (np.sort(source_sets, -1) != np.sort(target_sets, -1)).any(-1)


def clustered_accuracy(
    pred: np.ndarray, y: np.ndarray, sequence: np.ndarray, mask: np.ndarray
) -> tuple[float, float]:
    """(equal-weight mean over sequences of the within-sequence accuracy, pooled accuracy)
    over the examples where ``mask`` holds; sequences without one are left out."""
    hit = (np.asarray(pred) == np.asarray(y))[mask]
    seq = np.asarray(sequence)[mask]
    if not hit.size:
        return float("nan"), float("nan")
    per = [hit[seq == s].mean() for s in np.unique(seq)]
    return float(np.mean(per)), float(hit.mean())


def pca_basis(
    x: np.ndarray, k: int, seed: int = 0, device: torch.device | str | None = None
) -> np.ndarray:
    """The top-k principal directions (d, k) of standardised ``x`` (randomized SVD on
    ``device``, float64; its Gaussian sketch comes from that device's generator)."""
    device = _device(device)
    X = torch.as_tensor(np.asarray(x, dtype=np.float64), device=device)
    X = X - X.mean(0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        _, _, V = torch.svd_lowrank(X, q=min(k + 10, min(X.shape)), niter=4)
    return V[:, :k].cpu().numpy()


def random_projection(d: int, k: int, seed: int) -> np.ndarray:
    """A Gaussian (d, k) projection divided by √k (seeds 0–4 in the study)."""
    return np.random.default_rng(seed).standard_normal((d, k)) / np.sqrt(k)


def supervised_subspace(coef: np.ndarray, k: int, seed: int) -> np.ndarray:
    """An orthonormal (d, k) basis whose first directions span the row space of a fitted
    classifier's (classes, d) coefficients (SVD in float64), completed by QR of
    [V_row | G] with G seeded Gaussian columns."""
    coef = np.asarray(coef, dtype=np.float64)
    _, s, vt = np.linalg.svd(coef, full_matrices=False)
    rank = int((s > s.max() * 1e-10).sum()) if s.size else 0
    rows = vt[:rank].T[:, :k]
    d = coef.shape[1]
    fill = np.random.default_rng(seed).standard_normal((d, max(k - rows.shape[1], 0)))
    q, _ = np.linalg.qr(np.concatenate([rows, fill], axis=1))
    return q[:, :k]


# --------------------------------------------------------------------------- MLP control
#: [CHOICE §13.3] the MLP probe: Adam 1e-3, batch 1024, weight decay {0, 1e-4}, early stopping
#: on calibration accuracy (patience in epochs), at most MLP_EPOCHS epochs.
MLP_LR, MLP_BATCH, MLP_DECAYS, MLP_EPOCHS, MLP_PATIENCE = 1e-3, 1024, (0.0, 1e-4), 200, 10


def fit_mlp(
    train: tuple[np.ndarray, np.ndarray], calibration: tuple[np.ndarray, np.ndarray],
    n_classes: int, width: int, seed: int, device: torch.device | str | None = None,
) -> torch.nn.Module:  # fmt: skip
    """A one-bottleneck ReLU MLP (d → width → classes), the best weight decay and epoch by
    calibration accuracy (SAMOE §13.3 [CHOICE]), trained on ``device`` (the returned net is
    there). Its initial weights and batch order come from CPU generators, so every device
    starts from the same net and visits the same batches."""
    device = _device(device)
    X = torch.as_tensor(np.asarray(train[0], dtype=np.float32), device=device)
    Y = torch.as_tensor(np.asarray(train[1]), dtype=torch.long, device=device)
    Xc = torch.as_tensor(np.asarray(calibration[0], dtype=np.float32), device=device)
    Yc = torch.as_tensor(np.asarray(calibration[1]), dtype=torch.long, device=device)
    best = (-1.0, None)
    for decay in MLP_DECAYS:
        g = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(), torch.device("cpu"):  # drawn on the CPU, then moved
            torch.manual_seed(seed)
            net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], width), torch.nn.ReLU(),
                                      torch.nn.Linear(width, n_classes))  # fmt: skip
        net = net.to(device)
        opt = torch.optim.Adam(net.parameters(), lr=MLP_LR, weight_decay=decay)
        since = 0
        for _ in range(MLP_EPOCHS):
            order = torch.randperm(len(X), generator=g, device=g.device).to(device)
            for start in range(0, len(X), MLP_BATCH):
                idx = order[start : start + MLP_BATCH]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(X[idx]), Y[idx]).backward()
                opt.step()
            with torch.no_grad():
                acc = float((net(Xc).argmax(1) == Yc).float().mean())
            if acc > best[0]:
                best, since = (acc, copy_module(net)), 0
            else:
                since += 1
                if since >= MLP_PATIENCE:
                    break
    return best[1]


def copy_module(net: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(net).eval()
