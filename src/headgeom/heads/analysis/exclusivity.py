"""How far a head patch travels: the summaries of paper §5.1 (docs §11.3–11.6, §16.1).

Pure functions of the leakage rows (heads/stages/leakage.py: L, ρ, L/ρ, the direct/total responses
and the attention TV of every (source, later reader, X)) and of the per-head effects of the
concentration stage (``heads`` Parquets: e per split):

* :func:`midrank_percentile` / :func:`add_percentiles`: the mid-rank percentile
  100·(#{<} + ½#{=})/n of a pair's value among a reference set that includes it: all later
  readers of the same source (same X), or only the readers of the pair's reader layer
  (the layer-matched control);
* :func:`top_heads` / :func:`top_pairs`: the top-3 heads of a model–task by signed e
  (descending; ties in row-major order) or by |e|, and the ordered pairs l_i < l_j;
* :func:`exclusivity_tables`: the selected heads (evaluation signed and |e|, discovery
  signed, with the match count), the top-pair rows, and the long summary table that Table 1's
  "geometric exclusivity" row and the report read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

TOP_K = 3
RUN = ["model", "seed"]
RUN_TASK = ["model", "seed", "task"]
SOURCE = ["source_layer", "source_head"]
READER = ["reader_layer", "reader_head"]


# ----------------------------------------------------------------------------- percentiles
def midrank_percentile(reference: Sequence[float], value: float) -> float:
    """100·(#{r < value} + ½·#{r = value}) / n over ``reference`` (which should include
    ``value`` itself, docs §11.4); NaN for an empty reference or a NaN value."""
    ref = np.asarray(reference, dtype=float)
    ref = ref[np.isfinite(ref)]
    if len(ref) == 0 or not np.isfinite(value):
        return float("nan")
    return 100.0 * (np.sum(ref < value) + 0.5 * np.sum(ref == value)) / len(ref)


def grouped_midrank(frame: pd.DataFrame, value: str, by: list[str]) -> pd.Series:
    """The mid-rank percentile of every row's ``value`` within its ``by`` group (the group is
    the reference set, the row included): 100·(average rank − ½)/n, NaN values excluded."""
    groups = frame.groupby(by, sort=False)[value]
    rank = groups.rank(method="average")
    n = groups.transform("count")
    return 100.0 * (rank - 0.5) / n


def add_percentiles(leak: pd.DataFrame) -> pd.DataFrame:
    """``percentile_all_later`` (reference: every later reader of the same source and X)
    and ``percentile_same_layer`` (only the readers in the pair's reader layer), of L."""
    base = [*RUN_TASK, *SOURCE, "read_type"]
    return leak.assign(
        percentile_all_later=grouped_midrank(leak, "leakage", base),
        percentile_same_layer=grouped_midrank(leak, "leakage", [*base, "reader_layer"]),
    )


def tv_percentiles(leak: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, task, source, reader) with its TVs and the mid-rank percentiles of
    query-only and total TV among all later heads of the same source (docs §11.6)."""
    tv = leak[leak["read_type"] == "Q"].drop(columns="read_type")
    base = [*RUN_TASK, *SOURCE]
    return tv.assign(
        tv_query_percentile=grouped_midrank(tv, "tv_query", base),
        tv_total_percentile=grouped_midrank(tv, "tv_total", base),
    )


# ----------------------------------------------------------------------------- selection
def top_heads(e: np.ndarray, k: int = TOP_K, by: str = "signed") -> list[tuple[int, int]]:
    """The k heads (layer, head) with the largest e (``signed``, descending: the largest
    drop, docs §11.4) or |e| (``abs``), ties in row-major order."""
    e = np.asarray(e, dtype=float)
    if by not in ("signed", "abs"):
        raise ValueError(f"by must be 'signed' or 'abs', got {by!r}")
    score = e if by == "signed" else np.abs(e)
    order = np.argsort(-score.ravel(), kind="stable")[:k]
    return [tuple(int(v) for v in np.unravel_index(i, e.shape)) for i in order]


def top_pairs(heads: Sequence[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Ordered pairs (i, j) of ``heads`` with l_i < l_j (same-layer pairs excluded)."""
    return [(i, j) for i in heads for j in heads if i[0] < j[0]]


def effect_matrix_of(heads: pd.DataFrame, split: str) -> np.ndarray:
    """e (L, H) of one split from a run–task's ``heads`` rows."""
    rows = heads[heads["split"] == split]
    if rows.empty:
        raise ValueError(f"no per-head effects for split {split!r}")
    n_layer, n_head = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    e = np.full((n_layer, n_head), np.nan)
    e[rows["layer"].to_numpy(), rows["head"].to_numpy()] = rows["e"].to_numpy()
    return e


# ----------------------------------------------------------------------------- summaries
@dataclass(frozen=True)
class Exclusivity:
    heads: pd.DataFrame  # selected heads
    pairs: pd.DataFrame  # top-pair rows, both selections
    summary: pd.DataFrame  # long: one row per reported number
    figure: pd.DataFrame  # Figure 2 data rows (every pair)


SELECTIONS = {  # name -> (split, ranking)
    "evaluation": ("evaluation", "signed"),
    "evaluation_abs": ("evaluation", "abs"),
    "discovery": ("discovery", "signed"),
}


def _spearman(a: pd.Series, b: pd.Series) -> float:
    ok = a.notna() & b.notna()
    if ok.sum() < 3:
        return float("nan")
    return float(spearmanr(a[ok], b[ok]).statistic)


def exclusivity_tables(
    leak: pd.DataFrame, heads: pd.DataFrame, geometry: dict[tuple[str, int], str], split: str
) -> Exclusivity:
    """Every §5.1 number from the leakage rows ``leak`` (one split, many runs and tasks),
    the per-head effects ``heads`` (all splits) and each run's geometry."""
    leak = add_percentiles(leak)
    leak["geometry"] = [
        geometry[(m, int(s))] for m, s in zip(leak["model"], leak["seed"], strict=True)
    ]
    selected, pair_rows = [], []
    for (model, seed, task), group in leak.groupby(RUN_TASK, sort=False):
        run_heads = heads[(heads["model"] == model) & (heads["seed"] == seed)]
        run_heads = run_heads[run_heads["task"] == task]
        for name, (sel_split, by) in SELECTIONS.items():
            if sel_split not in set(run_heads["split"]):
                continue
            e = effect_matrix_of(run_heads, sel_split)
            chosen = top_heads(e, by=by)
            for rank, (layer, head) in enumerate(chosen):
                selected.append(
                    dict(model=model, seed=seed, task=task, selection=name, split=sel_split,
                         ranking=by, rank=rank + 1, layer=layer, head=head, e=e[layer, head])
                )  # fmt: skip
            if name == "evaluation_abs":
                continue  # logged only (docs §11.4)
            for i, j in top_pairs(chosen):
                hit = group[
                    (group["source_layer"] == i[0])
                    & (group["source_head"] == i[1])
                    & (group["reader_layer"] == j[0])
                    & (group["reader_head"] == j[1])
                ]
                pair_rows.append(hit.assign(selection=name))
    heads_out = pd.DataFrame(selected)
    pairs = (
        pd.concat(pair_rows, ignore_index=True) if pair_rows else leak.iloc[:0].assign(selection="")
    )
    tv = tv_percentiles(leak)
    pairs = pairs.merge(
        tv[[*RUN_TASK, *SOURCE, *READER, "tv_query_percentile", "tv_total_percentile"]],
        on=[*RUN_TASK, *SOURCE, *READER],
        how="left",
    )
    summary = _summary(leak, pairs, tv, heads_out, split)
    top_eval = pairs[pairs["selection"] == "evaluation"]
    keys = [*RUN_TASK, *SOURCE, *READER, "read_type"]
    flagged = leak.merge(top_eval[keys].assign(is_top_pair=True), on=keys, how="left")
    flagged["is_top_pair"] = flagged["is_top_pair"].fillna(False).astype(bool)
    return Exclusivity(heads_out, pairs, summary, flagged)


def _summary(leak, pairs, tv, heads, split) -> pd.DataFrame:
    rows: list[dict] = []

    def add(quantity, value, scope, n=None, model=None, seed=None, task=None, X=None):
        rows.append(
            dict(quantity=quantity, scope=scope, model=model, seed=seed, task=task,
                 read_type=X, value=float(value), n=None if n is None else int(n))
        )  # fmt: skip

    # §11.3: typical pair, median L/ρ, Spearman(L, ρ): pooled over tasks and per task
    for X, by_x in leak.groupby("read_type", sort=False):
        for (model, seed), g in by_x.groupby(RUN, sort=False):
            add("median_leakage", g["leakage"].median(), "run", len(g), model, seed, X=X)
            add("median_leakage_over_rho", g["leakage_over_rho"].median(), "run", len(g),
                model, seed, X=X)  # fmt: skip
            add("spearman_leakage_rho", _spearman(g["leakage"], g["rho"]), "run", len(g),
                model, seed, X=X)  # fmt: skip
            for task, t in g.groupby("task", sort=False):
                add("median_leakage", t["leakage"].median(), "run_task", len(t), model, seed,
                    task, X)  # fmt: skip
                add("median_leakage_over_rho", t["leakage_over_rho"].median(), "run_task",
                    len(t), model, seed, task, X)  # fmt: skip
                add("spearman_leakage_rho", _spearman(t["leakage"], t["rho"]), "run_task",
                    len(t), model, seed, task, X)  # fmt: skip
    run_task = [r for r in rows if r["quantity"] == "spearman_leakage_rho" and r["task"]]
    for X in dict.fromkeys(r["read_type"] for r in run_task):
        values = [r["value"] for r in run_task if r["read_type"] == X]
        add("spearman_leakage_rho_min", np.nanmin(values), "run_task_range", len(values), X=X)
        add("spearman_leakage_rho_max", np.nanmax(values), "run_task_range", len(values), X=X)
    # §11.4: top pairs (evaluation and discovery selections), all models and by geometry
    for selection, sel in pairs.groupby("selection", sort=False):
        prefix = "" if selection == "evaluation" else f"{selection}_"
        scopes = [("all", sel)] + [(f"geometry:{g}", s) for g, s in sel.groupby("geometry")]
        for scope, s in scopes:
            for X, p in s.groupby("read_type", sort=False):
                n = len(p)
                add(f"{prefix}top_pairs", n, scope, n, X=X)
                add(f"{prefix}top_pair_percentile_median", p["percentile_all_later"].median(),
                    scope, n, X=X)  # fmt: skip
                add(f"{prefix}top_pair_share_above_90", np.mean(p["percentile_all_later"] > 90),
                    scope, n, X=X)  # fmt: skip
                add(f"{prefix}top_pair_leakage_over_rho_median", p["leakage_over_rho"].median(),
                    scope, n, X=X)  # fmt: skip
                add(f"{prefix}layer_matched_percentile_median",
                    p["percentile_same_layer"].median(), scope, n, X=X)  # fmt: skip
                add(f"{prefix}layer_matched_share_above_90",
                    np.mean(p["percentile_same_layer"] > 90), scope, n, X=X)  # fmt: skip
    # discovery re-selection: how many top heads match the evaluation selection
    if not heads.empty and {"evaluation", "discovery"} <= set(heads["selection"]):
        key = [*RUN_TASK, "layer", "head"]
        ev, di = (heads[heads["selection"] == s][key] for s in ("evaluation", "discovery"))
        add("discovery_heads_matching", len(ev.merge(di, on=key)), "all", len(ev))
        ab = heads[heads["selection"] == "evaluation_abs"][key]
        add("abs_ranking_heads_matching", len(ev.merge(ab, on=key)), "all", len(ev))
    # §11.5: direct vs total, top pairs and all pairs, per X
    top = pairs[pairs["selection"] == "evaluation"]
    for scope, frame in (("top_pairs", top), ("all_pairs", leak)):
        for X, p in frame.groupby("read_type", sort=False):
            for column in ("response_cosine", "response_norm_ratio", "response_projection"):
                add(f"{column}_median", p[column].median(), scope, p[column].count(), X=X)
    # §11.6: attention TV for the evaluation top-3 sources and every later head
    top_q = top[top["read_type"] == "Q"]
    if len(top_q):
        all_sources = tv.merge(
            heads[heads["selection"] == "evaluation"]
            .rename(columns={"layer": "source_layer", "head": "source_head"})[[*RUN_TASK, *SOURCE]]
            .drop_duplicates()
        )
        n = len(top_q)
        add("tv_query_exceeds_keys_share", np.mean(top_q["tv_query"] > top_q["tv_keys"]),
            "top_pairs", n)  # fmt: skip
        for column in ("tv_query", "tv_keys", "tv_direct", "tv_total"):
            add(f"{column}_median", top_q[column].median(), "top_pairs", n)
        add("tv_query_median", all_sources["tv_query"].median(), "all_later_heads",
            len(all_sources))  # fmt: skip
        add("tv_query_percentile_median", top_q["tv_query_percentile"].median(), "top_pairs", n)
        add("tv_total_percentile_median", top_q["tv_total_percentile"].median(), "top_pairs", n)
        pair_keys = top_q[[*RUN_TASK, *SOURCE, *READER]].assign(_top=True)
        other = all_sources.merge(pair_keys, how="left", on=[*RUN_TASK, *SOURCE, *READER])
        other = other[other["_top"].isna()]
        for column in ("tv_direct", "tv_total"):
            add(f"{column}_median", other[column].median(), "other_later_heads", len(other))
        joined = all_sources  # the Q rows: L^Q of each (source, later head) beside its TV
        per_source = [
            _spearman(g["leakage"], g["tv_query"])
            for _, g in joined.groupby([*RUN_TASK, *SOURCE], sort=False)
        ]
        add("spearman_q_leakage_tv_query_median", np.nanmedian(per_source), "top3_sources",
            len(per_source))  # fmt: skip
    out = pd.DataFrame(rows)
    out["split"] = split
    out["seed"] = out["seed"].astype("Int64")
    out["n"] = out["n"].astype("Int64")
    return out
