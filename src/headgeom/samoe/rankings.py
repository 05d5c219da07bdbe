"""Audited targets, the source rankings and their exhaustive metrics (SAMOE §14.1, §14.4,
§14.5).

**Targets** are chosen before anything is measured: one per sequence at each of the
config's target layers, at a position first in SHA-256 order of ``family|seq_id|slot|pos``
among the eligible ones (T/8 ≤ t < T − 1, not EOS), distinct within a sequence. They read
only ids and tokens, never margins, ledger values or effects, so every variant audits the
same decisions (K12).

**Rankings** of the sources l < L of a target, all from the clean trajectory: the ledger
|c_{l→L}|, the largest write norm ‖Δ_l‖, recency (later first) and gradient×write
|∂m/∂α_l| at α = 1 (E7's α, one autograd call per target), checked against the finite
difference (K13). Ties go to the lower source layer.

**Metrics** against the exhaustive effects E_{il} = |Δm| of suppressing every source: top-
source accuracy (the method's top source is in argmax_l E, ties all count), within-target
Spearman (omitted when either vector is constant), normalised oracle regret
(max E − E_sel) / max E (targets with max E = 0 dropped).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headgeom.samoe import bootstrap, checks
from headgeom.samoe.ledger import Targets
from headgeom.samoe.model import MoEModel, site
from headgeom.samoe.suppression import Rows, suppressed_forward

#: SAMOE §14.4 [CHECK] K13: gradient×write against the finite difference at this ε …
FD_EPSILON = 1e-3
#: … within this relative error (‖g − fd‖ / ‖fd‖ over a target's sources).
FD_TOLERANCE = 0.05


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def select_targets(
    family: str, seq_ids: Sequence[str], tokens: np.ndarray, layers: Sequence[int], eos: int
) -> pd.DataFrame:
    """One target per sequence (row of ``tokens`` (S, T)) and slot j at layer ``layers[j]``:
    columns seq_index, seq_id, slot, layer, position."""
    S, T = tokens.shape
    rows = []
    for b, seq_id in enumerate(seq_ids):
        used: set[int] = set()
        eligible = [t for t in range(T // 8, T - 1) if tokens[b, t] != eos]
        for slot, layer in enumerate(layers):
            free = [t for t in eligible if t not in used]
            if not free:
                raise ValueError(f"{seq_id}: no eligible position left for slot {slot}")
            pos = min(free, key=lambda t, s=slot: _sha(f"{family}|{seq_id}|{s}|{t}"))
            used.add(pos)
            rows.append({"seq_index": b, "seq_id": seq_id, "slot": slot, "layer": int(layer),
                         "position": pos})  # fmt: skip
    return pd.DataFrame(rows)


def as_targets(frame: pd.DataFrame) -> Targets:
    return Targets(*(frame[c].to_numpy(copy=True) for c in ("seq_index", "position", "layer")))


def _alpha_hooks(alpha: torch.Tensor, t: int, L: int, z: dict) -> dict:
    """E7 with a differentiable α per source layer at position t of a one-row batch, for the
    layers before L (later writes cannot reach z_L); z_L is kept in ``z``."""
    entering: dict[int, torch.Tensor] = {}

    def keep(layer):
        return lambda s: entering.__setitem__(layer, s)

    def blend(layer):
        def fn(s_nat):
            s_in = entering[layer]
            at = s_in[:, t] + alpha[layer] * (s_nat[:, t] - s_in[:, t])
            return torch.cat([s_nat[:, :t], at[:, None], s_nat[:, t + 1 :]], dim=1)

        return fn

    fns = {}
    for layer in range(L):
        fns[site(layer, "hook_state_in")] = keep(layer)
        fns[site(layer, "hook_state_out")] = blend(layer)
    fns[site(L, "hook_router_logits")] = lambda a: z.__setitem__("z", a)
    return fns


def gradient_x_write(
    model: MoEModel, ids: torch.Tensor, targets: Targets, e2: torch.Tensor, e3: torch.Tensor
) -> torch.Tensor:
    """|∂m/∂α_l| at α = 1 (n, N) for every source l < L of each target (0 for l ≥ L): one
    backward per target through the whole forward (gates, experts, later writes, hidden
    stream), E7's blend applied at the target token with a differentiable α per layer."""
    N, device = len(model.blocks), model.wte.weight.device
    ids = ids.to(device)
    out = torch.zeros(len(targets), N, dtype=torch.float64, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # only α needs a gradient
        p.requires_grad_(False)
    try:
        for i in range(len(targets)):
            b, t, L = (int(targets.batch[i]), int(targets.position[i]), int(targets.layer[i]))
            alpha = torch.ones(N, dtype=model.wte.weight.dtype, device=device,
                               requires_grad=True)  # fmt: skip
            z: dict[str, torch.Tensor] = {}
            with torch.enable_grad(), model.hooks(_alpha_hooks(alpha, t, L, z)):
                model(ids[b : b + 1])
                m = z["z"][0, t, e2[i]] - z["z"][0, t, e3[i]]
                (grad,) = torch.autograd.grad(m, alpha)
            out[i, :L] = grad[:L].abs().double()
    finally:
        for p in params:
            p.requires_grad_(True)
    return out


@torch.no_grad()
def finite_difference(
    model: MoEModel, ids: torch.Tensor, targets: Targets, e2: torch.Tensor, e3: torch.Tensor,
    eps: float = FD_EPSILON, rows_per_forward: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(m(α_l = 1) − m(α_l = 1 − ε)) / ε (n, N) by the suppression engine, and whether any
    Top-k set of the target token changed at any layer (n, N): a selection flip. Each pass's
    rows in one forward, or ``rows_per_forward`` rows a forward (bounded memory)."""
    n, N = len(targets), len(model.blocks)
    ids = ids.to(model.wte.weight.device)
    pairs = [(i, src) for i in range(n) for src in range(int(targets.layer[i]))]
    rows = Rows(*(torch.tensor(v, dtype=torch.long, device=ids.device) for v in (
        [int(targets.batch[i]) for i, _ in pairs],
        [int(targets.position[i]) for i, _ in pairs],
        [src for _, src in pairs],
    )))  # fmt: skip
    clean_z = _router_logits_at(model, ids, Rows(targets.batch, targets.position, targets.layer),
                                1.0, rows_per_forward)  # fmt: skip
    z = _router_logits_at(model, ids, rows, 1.0 - eps, rows_per_forward)
    k = model.moe_cfg.top_k
    fd = torch.zeros(n, N, dtype=torch.float64, device=clean_z.device)
    flip = torch.zeros(n, N, dtype=torch.bool, device=clean_z.device)
    for r, (i, src) in enumerate(pairs):
        L = int(targets.layer[i])
        a, c = e2[i], e3[i]
        m_clean = clean_z[L, i, a] - clean_z[L, i, c]
        m_eps = z[L, r, a] - z[L, r, c]
        fd[i, src] = float(m_clean - m_eps) / eps
        sets_clean = clean_z[:, i].topk(k, -1).indices.sort(-1).values
        sets_eps = z[:, r].topk(k, -1).indices.sort(-1).values
        flip[i, src] = bool((sets_clean != sets_eps).any())
    return fd, flip


def _router_logits_at(model: MoEModel, ids: torch.Tensor, rows: Rows, alpha: float,
                      rows_per_forward: int | None) -> torch.Tensor:  # fmt: skip
    """The engine's router logits (N, R, E) of each row at its own position, the rows
    ``rows_per_forward`` a forward (None: all in one)."""
    R = len(rows.batch)
    step = max(R, 1) if rows_per_forward is None else rows_per_forward
    parts = []
    for lo in range(0, R, step):
        part = Rows(*(v[lo : lo + step] for v in (rows.batch, rows.position, rows.source)))
        z, _ = suppressed_forward(model, ids, part, alpha=alpha)
        parts.append(z[:, torch.arange(len(part.batch), device=z.device), part.position])
    return torch.cat(parts, 1)


def check_gradient(grad: torch.Tensor, fd: torch.Tensor, flip: torch.Tensor) -> dict:
    """K13: per target without a selection flip, ‖|g| − |fd|‖ ≤ 5% of ‖fd‖ (largest over
    targets); the number of targets it covers is logged."""
    ok = ~flip.any(-1)
    if not ok.any():
        raise ValueError("K13: every target has a selection flip at ε; nothing to compare")
    g, f = grad[ok], fd[ok].abs()
    rel = ((g - f).norm(dim=-1) / f.norm(dim=-1).clamp_min(1e-30)).max().item()
    return {**checks.enforce("K13", rel, FD_TOLERANCE, "rel",
                             what="gradient×write against the finite difference"),
            "K13.targets": int(ok.sum())}  # fmt: skip


def random_scores(family: str, seq_ids: Sequence[str], targets: pd.DataFrame, N: int) -> np.ndarray:
    """The random control's order as scores (n, N): higher = earlier in SHA-256 order of
    (family, sample id, position, target layer, candidate source); NaN for l ≥ L."""
    out = np.full((len(targets), N), np.nan)
    for i, row in enumerate(targets.itertuples()):
        stem = f"{family}|{row.seq_id}|{row.position}|{row.layer}"
        keys = [_sha(f"{stem}|{src}") for src in range(row.layer)]
        order = np.argsort(keys)  # first in SHA-256 order gets the highest score
        out[i, order] = np.arange(row.layer, 0, -1)
    return out


def recency_scores(layer: np.ndarray, N: int) -> np.ndarray:
    """Later first: score l for l < L (top = L − 1), NaN elsewhere."""
    out = np.tile(np.arange(N, dtype=np.float64), (len(layer), 1))
    out[np.arange(N)[None, :] >= np.asarray(layer)[:, None]] = np.nan
    return out


@dataclass
class RankingMetrics:
    """Per target (n,): top-source accuracy, Spearman (NaN: omitted), regret (NaN: dropped)."""

    top_source_accuracy: np.ndarray
    spearman: np.ndarray
    regret: np.ndarray
    selected: np.ndarray  # the method's top source


def ranking_metrics(
    scores: np.ndarray, effects: np.ndarray, spearman: bool = True
) -> RankingMetrics:
    """Metrics of a method's scores (n, N) against the exhaustive effects (n, N); entries
    NaN in ``scores`` are ineligible sources. Ties in the scores go to the lower layer."""
    n = len(scores)
    acc, rho, regret, sel = (np.full(n, np.nan) for _ in range(4))
    for i in range(n):
        eligible = ~np.isnan(scores[i])
        s, e = scores[i, eligible], effects[i, eligible]
        top = int(np.flatnonzero(s == s.max())[0])  # the lower source layer on ties
        sel[i] = np.flatnonzero(eligible)[top]
        acc[i] = float(e[top] == e.max())
        if e.max() > 0:
            regret[i] = (e.max() - e[top]) / e.max()
        if spearman and np.ptp(s) > 0 and np.ptp(e) > 0:
            rho[i] = _spearman(s, e)
    return RankingMetrics(acc, rho, regret, sel.astype(np.int64))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    # scipy.stats is imported here, not with the module: it takes a second to import, and
    # most of the jobs that import this module (every reader of the pools) never rank
    from scipy import stats  # scipy.stats: ~1 s, most importers never call this

    return float(stats.spearmanr(a, b).statistic)


# --------------------------------------------------------------------------- controls
@dataclass
class Controls:
    """Per target (n,): the source each matched control suppresses (SAMOE §14.4), -1 where a
    control has no candidate; every control excludes the selected source."""

    random: np.ndarray
    norm: np.ndarray
    distance: np.ndarray


def matched_controls(
    family: str, targets: pd.DataFrame, selected: np.ndarray, write_norm: np.ndarray
) -> Controls:
    """Random (first in SHA-256 order of family, sample id, position, target layer,
    candidate), norm-matched (the ‖Δ_l‖ closest to the selected write's; ties to the lower
    layer) and distance-matched (the same depth tercile ⌊3l/L⌋, first in that SHA-256 order)
    controls of each target's ``selected`` source (for LWO: its native L − 1)."""
    n = len(targets)
    out = {k: np.full(n, -1, dtype=np.int64) for k in ("random", "norm", "distance")}
    for i, row in enumerate(targets.itertuples()):
        L, sel = int(row.layer), int(selected[i])
        candidates = [src for src in range(L) if src != sel]
        if not candidates:
            continue
        stem = f"{family}|{row.seq_id}|{row.position}|{row.layer}"
        by_hash = sorted(candidates, key=lambda src, s=stem: _sha(f"{s}|{src}"))
        out["random"][i] = by_hash[0]
        gaps = [abs(write_norm[i, src] - write_norm[i, sel]) for src in candidates]
        out["norm"][i] = candidates[int(np.argmin(gaps))]
        tercile = [src for src in by_hash if 3 * src // L == 3 * sel // L]
        out["distance"][i] = tercile[0] if tercile else -1
    return Controls(**out)


def ledger_control_advantage(
    selected: np.ndarray, random: np.ndarray, norm: np.ndarray, distance: np.ndarray
) -> np.ndarray:
    """SAMOE Eq. 47 [RECONSTRUCTED, CHOICE equal weights]: |Δm| of the selected source minus
    the mean of the three controls' |Δm| (per target; NaN where a control is missing)."""
    return selected - (random + norm + distance) / 3


# --------------------------------------------------------------------------- one run's table
def ranking_table(
    scores: dict[str, np.ndarray], effects: np.ndarray, sequence: Sequence[str],
    n_resamples: int, seed: int,
) -> pd.DataFrame:  # fmt: skip
    """Every method's metrics against ``effects`` (NaN effects: ineligible, read as 0), each
    the mean over targets with sequences averaged first, with the paired sequence-bootstrap
    percentile interval (one resample matrix for every method, SAMOE §17). Random has no
    score vector, so no Spearman (§14.5). Columns: method, metric, value, low, high,
    n_targets."""
    sequence = np.asarray(sequence)
    indices = bootstrap.resample_indices(len(np.unique(sequence)), n_resamples, seed)
    rows = []
    for method, s in scores.items():
        m = ranking_metrics(s, np.nan_to_num(effects), spearman=method != "random")
        for metric, values in (("spearman", m.spearman), ("top_source_accuracy",
                               m.top_source_accuracy), ("regret", m.regret)):  # fmt: skip
            if method == "random" and metric == "spearman":
                continue
            _, per_seq = bootstrap.sequence_means(values, sequence)
            est, low, high = bootstrap.percentile_interval(per_seq, indices)
            rows.append({"method": method, "metric": metric, "value": float(est),
                         "low": float(low), "high": float(high),
                         "n_targets": int(np.isfinite(values).sum())})  # fmt: skip
    return pd.DataFrame(rows)
