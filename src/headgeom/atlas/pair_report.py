"""A pair of checkpoints in Markdown (atlas/pairs/<pair>/pair.md): the blend dial along α,
where the probes switch, the KL between the ends, the largest drifts, the grafts that move
most and whether the change is low-rank.

Where a probe switches (:func:`switches`): an item whose answer at α = 1 (B) differs from its
answer at α = 0 (A) switches at the smallest α of the dial in [0, 1] from which its answer is
B's at every α up to 1. A skill's switch is the median over its switching items; its
**accuracy crossing** is the α in [0, 1] where its accuracy first reaches the midpoint of A's
and B's (linear between the dial's points; none when A's and B's are equal).

The **gap closed** by a variant (:func:`gap_closed`) is 1 − KL(B ‖ variant) / KL(B ‖ A): 1 at
B, 0 as far from B as A is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headgeom.atlas.report import md_table

#: The reference records (references.yaml ``method``) that are two-checkpoint views.
PAIR_METHODS = ("blend", "graft", "drift", "low_rank_delta")


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.{digits}g}"


def _crossing(alphas: np.ndarray, accuracy: np.ndarray) -> float:
    """The α in [0, 1] where ``accuracy`` (along ascending ``alphas``) first reaches the
    midpoint of its values at 0 and 1, linear between points; NaN when they are equal."""
    inside = (alphas >= 0) & (alphas <= 1)
    x, y = alphas[inside], accuracy[inside]
    start, end = y[0], y[-1]
    if start == end:
        return float("nan")
    mid, sign = (start + end) / 2, np.sign(end - start)
    for i in range(1, len(x)):
        if sign * (y[i] - mid) >= 0:
            if y[i] == y[i - 1]:
                return float(x[i])
            return float(x[i - 1] + (mid - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
    return float("nan")


def item_switches(probes: pd.DataFrame) -> pd.DataFrame:
    """One row per probe item whose answer at α = 1 differs from α = 0: skill, item, and the
    α from which its answer is B's through α = 1 (module docstring)."""
    inside = probes[(probes["alpha"] >= 0) & (probes["alpha"] <= 1)]
    rows = []
    for (skill, item), part in inside.groupby(["skill", "item"], sort=False):
        part = part.sort_values("alpha")
        answers, alphas = part["answer"].to_numpy(), part["alpha"].to_numpy()
        if alphas[0] != 0 or alphas[-1] != 1 or answers[0] == answers[-1]:
            continue
        j = len(answers) - 1
        while j > 0 and answers[j - 1] == answers[-1]:
            j -= 1
        rows.append({"skill": skill, "item": int(item), "switch_alpha": float(alphas[j])})
    return pd.DataFrame(rows, columns=["skill", "item", "switch_alpha"])


def switches(probes: pd.DataFrame) -> pd.DataFrame:
    """Per skill: items, accuracy of A and B, items whose answer switches, the median (and
    range) of their switch α, and the accuracy crossing."""
    items = item_switches(probes)
    rows = []
    for skill, part in probes.groupby("skill", sort=False):
        curve = part.groupby("alpha")["correct"].mean().sort_index()
        alphas, accuracy = curve.index.to_numpy(float), curve.to_numpy(float)
        mine = items[items["skill"] == skill]["switch_alpha"]
        rows.append({
            "skill": skill, "items": int(part["item"].nunique()),
            "accuracy_a": float(curve.get(0.0, np.nan)),
            "accuracy_b": float(curve.get(1.0, np.nan)),
            "switching": len(mine),
            "switch_median": float(mine.median()) if len(mine) else float("nan"),
            "switch_min": float(mine.min()) if len(mine) else float("nan"),
            "switch_max": float(mine.max()) if len(mine) else float("nan"),
            "accuracy_crossing": _crossing(alphas, accuracy),
        })  # fmt: skip
    return pd.DataFrame(rows)


def gap_closed(kl_to_b: pd.Series, kl_b_to_a: float) -> pd.Series:
    """1 − KL(B ‖ variant) / KL(B ‖ A) (NaN when A and B predict alike)."""
    return 1.0 - kl_to_b / kl_b_to_a if kl_b_to_a > 0 else kl_to_b * np.nan


def group_drift(drift: pd.DataFrame) -> pd.DataFrame:
    """Per tensor group: √Σ‖ΔW‖² / √Σ‖W_A‖² (the drift of the group's tensors together)."""
    sums = drift.assign(a2=drift["norm_a"] ** 2, d2=drift["norm_delta"] ** 2)
    out = sums.groupby("group", sort=False)[["a2", "d2"]].sum()
    ratio = np.where(out["a2"] > 0, np.sqrt(out["d2"]) / np.sqrt(out["a2"].where(out["a2"] > 0)),
                     np.where(out["d2"] > 0, np.inf, 0.0))  # fmt: skip
    return pd.DataFrame({"group": out.index, "drift": ratio}).reset_index(drop=True)


def markdown(
    name: str,
    sources: dict,
    blend: pd.DataFrame,
    probes: pd.DataFrame,
    drift: pd.DataFrame,
    grafts: pd.DataFrame | None,
    lowrank: pd.DataFrame | None,
    top: int = 10,
    references: dict | None = None,
) -> str:
    """The report of one pair (tables as the pair stages write them); ``references`` (the
    atlas's references.yaml) adds the article's two-checkpoint numbers, quoted as text."""
    mean = blend[blend["corpus"] == "mean"].sort_values("alpha")
    at = mean.set_index("alpha")
    kl_ab, kl_ba = float(at.loc[1.0, "kl_to_a"]), float(at.loc[0.0, "kl_to_b"])
    out = [f"# Two checkpoints: {name}", ""]
    for end in ("a", "b"):
        s = sources[end]
        where = s.get("path") or s.get("repo_id")
        sha = s.get("checkpoint_file_sha256") or ""
        out.append(f"- {end.upper()}: {s.get('format', s.get('kind'))} `{where}`"
                   + (f" (SHA-256 {sha[:16]}…)" if sha else ""))  # fmt: skip
    out += ["", f"KL(A ‖ B) = {_fmt(kl_ab, 4)}, KL(B ‖ A) = {_fmt(kl_ba, 4)} nats "
            "(mean over the corpora); per corpus:", ""]  # fmt: skip
    ends = blend[blend["alpha"].isin([0.0, 1.0])]
    rows = []
    for corpus, part in ends.groupby("corpus", sort=False):
        p = part.set_index("alpha")
        rows.append([corpus, _fmt(p.loc[1.0, "kl_to_a"], 4), _fmt(p.loc[0.0, "kl_to_b"], 4),
                     _fmt(p.loc[0.0, "top1"]), _fmt(p.loc[1.0, "top1"])])  # fmt: skip
    out.append(md_table(["corpus", "KL(A ‖ B)", "KL(B ‖ A)", "top-1 A", "top-1 B"], rows))

    acc = probes.pivot_table(index="alpha", columns="skill", values="correct", aggfunc="mean")
    skills = list(dict.fromkeys(probes["skill"]))
    out += ["## The blend dial W = (1 − α)·A + α·B", "",
            "Mean over the corpora; accuracy per skill: the share of its probe items right.",
            ""]  # fmt: skip
    rows = [[_fmt(r.alpha), _fmt(r.kl_to_a, 4), _fmt(r.kl_to_b, 4), _fmt(r.top1),
             _fmt(r.retention), *[_fmt(acc.loc[r.alpha, s]) for s in skills]]
            for r in mean.itertuples()]  # fmt: skip
    out.append(md_table(["α", "KL to A", "KL to B", "top-1", "retention", *skills], rows))

    sw = switches(probes)
    out += ["## Where the probes switch", "",
            "An item switches at the smallest α in [0, 1] from which its answer is B's up to "
            "α = 1; the crossing is where the skill's accuracy reaches the midpoint of A's and "
            "B's.", ""]  # fmt: skip
    rows = [[r.skill, r.items, _fmt(r.accuracy_a), _fmt(r.accuracy_b), r.switching,
             _fmt(r.switch_median), f"{_fmt(r.switch_min)} … {_fmt(r.switch_max)}",
             _fmt(r.accuracy_crossing)] for r in sw.itertuples()]  # fmt: skip
    out.append(md_table(["skill", "items", "accuracy A", "accuracy B", "switching",
                         "median switch α", "range", "accuracy crossing α"], rows))  # fmt: skip

    out += ["## Drift ‖W_B − W_A‖ / ‖W_A‖", "", "Per tensor group:", ""]
    groups = group_drift(drift)
    out.append(
        md_table(["group", "drift"], [[g.group, _fmt(g.drift)] for g in groups.itertuples()])
    )
    largest = drift.sort_values("drift", ascending=False).head(top)
    out += [f"The {len(largest)} tensors that moved most:", ""]
    out.append(md_table(["tensor", "group", "drift", "‖W_A‖"],
                        [[f"`{r.tensor}`", r.group, _fmt(r.drift), _fmt(r.norm_a)]
                         for r in largest.itertuples()]))  # fmt: skip

    if grafts is not None and len(grafts):
        g = grafts[grafts["corpus"] == "mean"].sort_values("kl_to_b")
        out += ["## Grafts", "", f"Mean over the corpora, the {top} closest to B first.", ""]
        rows = [[r.direction, r.group, r.layer, r.part, _fmt(r.kl_to_a, 4), _fmt(r.kl_to_b, 4),
                 _fmt(r.accuracy)] for r in g.head(top).itertuples()]  # fmt: skip
        out.append(md_table(["direction", "group", "layer", "part", "KL to A", "KL to B",
                             "accuracy"], rows))  # fmt: skip

    if lowrank is not None and len(lowrank):
        lr = lowrank[lowrank["corpus"] == "mean"].copy()
        lr["closed"] = gap_closed(lr["kl_to_b"], kl_ba)
        out += ["## Is it a low-rank change?", "",
                "A plus part of ΔW on every linear layer (every other tensor B's), mean over "
                "the corpora; gap closed = 1 − KL(B ‖ model) / KL(B ‖ A).", ""]  # fmt: skip
        rows = [[r.mode, "–" if pd.isna(r.k) else int(r.k), _fmt(r.fraction),
                 _fmt(r.delta_share), _fmt(r.kl_to_b, 4), _fmt(r.closed), _fmt(r.accuracy)]
                for r in lr.itertuples()]  # fmt: skip
        out.append(md_table(["mode", "k", "f", "share of ‖ΔW‖²", "KL to B", "gap closed",
                             "accuracy"], rows))  # fmt: skip
    if references:
        pair_views = [r for r in references["records"] if r["method"] in PAIR_METHODS]
        out += ["## The article's two-checkpoint numbers (not reproducible without the weights)",
                "", f"{references['why']}; quoted beside this pair, not compared.", ""]  # fmt: skip
        out.append(md_table(["model", "view", "group", "setting", "article"],
                            [[r["model"], r["method"], r["group"], r["setting"], r["value"]]
                             for r in pair_views]))  # fmt: skip
    return "\n".join(out) + "\n"
