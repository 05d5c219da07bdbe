"""The clamp analyses of one model and task (docs §13.3, §15.3): pair clamps, the lumped lane
clamp and the two-order path decomposition, with checks C12 and C13.

Heads are ranked by their signed evaluation effect e_{l,h}, largest first (docs §11.4
CHOICE); every measured quantity is a mean drop e_C = mean_x (LD_clean − LD_patched,C)
from one call of the clamp engine (headgeom.heads.analysis.clamps) for all cases of the task.

* **Pairs** (Figure 6d–e): top-3 heads, ordered pairs (i, j) with l_i < l_j; reduction
  r = (e_∅ − e_C)/e_∅ with C = {j} (head) and C = MLPs from l_i on (mlps). r may be
  negative or exceed 1 (a reduction under intervention, not a flow).
* **Lumped lane clamp**: for the top-5 heads together, shift s = 0..H−1 clamps, for each
  source (l, h), every head of index (h + s) mod H in the layers after l (no MLP clamp);
  reduction of the sum Σ_i e_i. s = 0 is the source's own index; [CHOICE] the control is the
  mean over the H − 1 other shifts (each source's index shifted alike).
* **Paths** (Figure 8): top-5 heads, Δ(∅), Δ(later heads), Δ(MLPs), Δ(both); order A
  (release the MLP clamp first): direct = Δ(both), via MLPs = Δ(later heads) − direct, via
  attention = Δ(∅) − Δ(later heads); order B (release the head clamp first): via attention′
  = Δ(MLPs) − direct, via MLPs′ = Δ(∅) − Δ(MLPs); interaction
  I = Δ(∅) − Δ(later heads) − Δ(MLPs) + Δ(both).

Checks: C12 (every component clamped, nothing patched → clean logits) and C13 (both clamp
conditions — later heads + MLPs, and every component but the source — reproduce the
closed-form direct term); Δ(∅) must also reproduce the stored effects (as check C9). All
three compare two routes to one value, so their tolerances follow from the model's dtype
and its largest |logit| (``analysis.tolerance``), not from fixed float32 numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headgeom.heads.analysis import clamps
from headgeom.heads.analysis.clamps import Case
from headgeom.heads.analysis.tolerance import Residual, forward_tolerance

N_PAIR_HEADS = 3
N_PATH_HEADS = 5

PAIR_COLUMNS = [
    "source_layer", "source_head", "source_rank", "later_layer", "later_head", "later_rank",
    "same_index", "e_unclamped", "e_head_clamped", "e_mlps_clamped", "reduction_head",
    "reduction_mlps",
]  # fmt: skip
PATH_COLUMNS = [
    "rank", "layer", "head", "e_stored", "delta_none", "delta_later_heads", "delta_mlps",
    "delta_both", "delta_all_but_source", "direct_closed_form", "direct", "via_mlps_a",
    "via_attention_a", "via_attention_b", "via_mlps_b", "interaction",
]  # fmt: skip
LUMPED_COLUMNS = [
    "index_shift", "same_index", "n_sources", "sources", "sum_unclamped", "sum_clamped",
    "reduction",
]  # fmt: skip


def top_heads(e: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` heads of largest signed e (L, H), ties by (layer, head)."""
    flat = np.asarray(e, dtype=np.float64).reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))[:k]
    H = e.shape[1]
    return [(int(i // H), int(i % H)) for i in order]


def reduction(unclamped: float, clamped: float) -> float | None:
    return None if unclamped == 0 else (unclamped - clamped) / unclamped


def label(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


def decompose(d_none, d_heads, d_mlps, d_both) -> dict[str, float]:
    """Order A and order B parts and the interaction of the four Δs (docs §15.3)."""
    direct = d_both
    return {
        "direct": direct,
        "via_mlps_a": d_heads - direct,
        "via_attention_a": d_none - d_heads,
        "via_attention_b": d_mlps - direct,
        "via_mlps_b": d_none - d_mlps,
        "interaction": d_none - d_heads - d_mlps + d_both,
    }


@dataclass(frozen=True)
class ClampResult:
    pairs: pd.DataFrame
    paths: pd.DataFrame
    lumped: pd.DataFrame
    c12: Residual
    c13: Residual
    effects: Residual


def clamp_analyses(
    model, inputs, e_stored: np.ndarray, lumped: bool, batch_size: int, max_rows: int
) -> ClampResult:
    """Pairs, paths and (when ``lumped``) the lumped lane clamp of one task's examples
    (``inputs``: headgeom.data.task_files.PatchInputs) whose stored effects are ``e_stored``
    (L, H); the checks are computed, not enforced (the stage enforces them)."""
    args = (inputs.clean_ids, inputs.ref_ids, inputs.correct, inputs.incorrect)
    H = model.cfg.n_head
    tops = top_heads(e_stored, max(N_PAIR_HEADS, N_PATH_HEADS))
    pair_heads, path_heads = tops[:N_PAIR_HEADS], tops[:N_PATH_HEADS]
    cases: dict[Case, int] = {}

    def need(case: Case) -> Case:
        cases.setdefault(case, len(cases))
        return case

    def conditions(src):
        later, mlps = clamps.later_heads(model, src[0]), clamps.mlps_from(model, src[0])
        return {
            "delta_none": need(Case(src)),
            "delta_later_heads": need(Case(src, later)),
            "delta_mlps": need(Case(src, mlps)),
            "delta_both": need(Case(src, later | mlps)),
            "delta_all_but_source": need(Case(src, clamps.everything(model).without(src))),
        }

    path_cases = {src: conditions(src) for src in path_heads}
    pair_list = [
        (i, j) for i in pair_heads for j in pair_heads if i[0] < j[0]
    ]  # ordered: earlier i, later j
    pair_cases = {
        (i, j): (Case(i, clamps.ClampSet(heads=frozenset({j}))), path_cases[i]["delta_mlps"])
        for i, j in pair_list
    }
    for head_case, _ in pair_cases.values():
        need(head_case)
    shifts = range(H) if lumped else range(0)
    lumped_cases = {
        s: [need(Case(src, clamps.same_index_later(model, src[0], (src[1] + s) % H)))
            for src in path_heads]
        for s in shifts
    }  # fmt: skip
    ordered = sorted(cases, key=cases.get)
    clean_ld, patched = clamps.clamp_patch(model, *args, ordered, batch_size, max_rows)
    e = (clean_ld[:, None] - patched).mean(axis=0)

    def mean(case: Case) -> float:
        return float(e[cases[case]])

    direct = clamps.direct_drops(model, *args, path_heads, batch_size).mean(axis=0)
    rank = {src: r for r, src in enumerate(tops)}
    paths, c13, residual = [], 0.0, 0.0
    for s, src in enumerate(path_heads):
        deltas = {k: mean(c) for k, c in path_cases[src].items()}
        c13 = max(
            c13,
            abs(deltas["delta_both"] - direct[s]),
            abs(deltas["delta_all_but_source"] - direct[s]),
        )
        residual = max(residual, abs(deltas["delta_none"] - e_stored[src]))
        parts = decompose(*(deltas[k] for k in list(deltas)[:4]))
        paths.append(
            {"rank": rank[src], "layer": src[0], "head": src[1], "e_stored": e_stored[src],
             **deltas, "direct_closed_form": float(direct[s]), **parts}
        )  # fmt: skip
    pairs = []
    for (i, j), (head_case, mlp_case) in pair_cases.items():
        e_u = mean(Case(i))
        pairs.append(
            {"source_layer": i[0], "source_head": i[1], "source_rank": rank[i],
             "later_layer": j[0], "later_head": j[1], "later_rank": rank[j],
             "same_index": i[1] == j[1], "e_unclamped": e_u,
             "e_head_clamped": mean(head_case), "e_mlps_clamped": mean(mlp_case),
             "reduction_head": reduction(e_u, mean(head_case)),
             "reduction_mlps": reduction(e_u, mean(mlp_case))}
        )  # fmt: skip
    rows = []
    total = sum(mean(Case(src)) for src in path_heads)
    for s, members in lumped_cases.items():
        clamped = sum(mean(c) for c in members)
        rows.append(
            {"index_shift": s, "same_index": s == 0, "n_sources": len(path_heads),
             "sources": ",".join(label(x) for x in path_heads), "sum_unclamped": total,
             "sum_clamped": clamped, "reduction": reduction(total, clamped)}
        )  # fmt: skip
    c12, scale = clamps.check_c12(model, *args, batch_size)
    tol = forward_tolerance(model, scale)  # every route parts at block 0 at the latest
    return ClampResult(
        pd.DataFrame(pairs, columns=PAIR_COLUMNS),
        pd.DataFrame(paths, columns=PATH_COLUMNS),
        pd.DataFrame(rows, columns=LUMPED_COLUMNS),
        Residual(c12, tol),
        Residual(c13, tol),
        Residual(residual, tol),
    )


def require_checks(result: ClampResult, where: str) -> None:
    """Fail (ValueError) when C12, C13 or the stored-effects agreement is violated."""
    failed = [
        f"{name} {r.value:.3g} > {r.tolerance:.3g}"
        for name, r in (
            ("C12", result.c12),
            ("C13", result.c13),
            ("Δ(∅) vs stored effects", result.effects),
        )
        if not r.passed
    ]
    if failed:
        raise ValueError(f"{where}: clamp checks failed: {'; '.join(failed)}")


@dataclass(frozen=True)
class ClampTables:
    """The three clamp tables of one run (every task) and each check's worst residual (the
    task nearest its tolerance)."""

    pairs: pd.DataFrame
    paths: pd.DataFrame
    lumped: pd.DataFrame
    c12: Residual
    c13: Residual
    effects: Residual


def clamp_tables(model, tasks, split: str, lumped: bool, batch_size: int, max_rows: int):
    """Every task of one run: ``tasks`` is a list of ``(identity, inputs, e_stored)`` with
    identity the (model, seed, task) dict, inputs the split's PatchInputs and e_stored its
    (L, H) effects. Fails (ValueError naming the task) when a check is violated."""
    parts: dict[str, list[pd.DataFrame]] = {"pairs": [], "paths": [], "lumped": []}
    worst: dict[str, Residual] = {}
    for identity, inputs, e_stored in tasks:
        out = clamp_analyses(model, inputs, e_stored, lumped, batch_size, max_rows)
        require_checks(out, f"{identity} split {split}")
        for name in parts:
            frame = getattr(out, name)
            parts[name].append(frame.assign(**identity, split=split))  # empty: columns only
        for key in ("c12", "c13", "effects"):
            r = getattr(out, key)
            worst[key] = worst[key].worst(r) if key in worst else r
    frames = {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}
    return ClampTables(frames["pairs"], frames["paths"], frames["lumped"], **worst)
