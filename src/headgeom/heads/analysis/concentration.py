"""Concentration of head-patching effects, its robustness, paired model comparisons and
validation loss versus concentration (docs §10.2–10.4, §12).

Per split, e_{l,h} is the signed mean drop over examples (:func:`concentration_tables`):
E, N_eff, the top head and N_eff = N_index · N_layer|index (check C11). On the analysis split
(the evaluation split of §12) the robustness outputs add the index-permutation null,
per-example-absolute N_eff, the bootstrap interval of N_eff, N_eff within each condition and
leave-one-lexical-group-out N_eff. :func:`check_c10` reproduces e, E and N_eff from the effects
file by another route (check C10). :func:`paired_tables` compares two models on
the same examples with a paired bootstrap (§12.4, §12.6); :func:`loss_table` and
:func:`spearman_rows` relate validation loss to N_eff (§12.3, §12.7). Undefined values (every
effect zero) are null.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from headgeom import results
from headgeom.hashing import load_manifest
from headgeom.heads.analysis.effects import drops_array, matrix_columns, single_identity
from headgeom.heads.analysis.stats import (
    bootstrap_n_eff,
    concentration,
    effects_abs_from_drops,
    effects_from_drops,
    geometric_mean,
    group_weights,
    index_layer_decomposition,
    index_permutation_null,
    leave_one_group_out_n_eff,
    n_eff_batch,
    paired_bootstrap_n_eff_difference,
    percentile_interval,
    spearman,
    weighted_effects,
)
from headgeom.io import metadata_text, read_parquet_metadata, read_table

#: Check C11 (docs §18): N_eff = N_index · N_layer|index to this relative error.
C11_TOLERANCE = 1e-9
#: Check C10 (docs §18): per-head means of the per-example effects reproduce the stored
#: per-head effects, E and N_eff to this absolute error (:func:`check_c10`).
C10_TOLERANCE = 1e-5
IDENTITY = ("model", "seed", "task")
BOOTSTRAP_RNG = "numpy Generator(PCG64(seed)).integers(0, N, (n_bootstrap, N))"
PERMUTATION_RNG = "numpy Generator(PCG64(seed)); argsort of uniform keys per layer"


# ----------------------------------------------------------------------------- per model
@dataclass(frozen=True)
class Resampling:
    """Settings of the §12 robustness outputs (seeds from config)."""

    n_bootstrap: int
    bootstrap_seed: int
    n_permutations: int
    permutation_seed: int
    ci: float
    index_meaningful: bool

    def metadata(self) -> dict:
        """File metadata of the resampling (seeds and RNG streams)."""
        return {
            "n_bootstrap": self.n_bootstrap,
            "bootstrap_seed": self.bootstrap_seed,
            "bootstrap_rng": BOOTSTRAP_RNG,
            "n_permutations": self.n_permutations,
            "permutation_seed": self.permutation_seed,
            "permutation_rng": PERMUTATION_RNG,
            "ci_level": self.ci,
        }


@dataclass(frozen=True)
class Concentration:
    """The outputs of one effects file; the robustness frames only with resampling."""

    identity: dict
    heads: pd.DataFrame
    summary: pd.DataFrame
    n_layers: int
    n_heads: int
    c11: float
    robustness: pd.DataFrame | None = None
    conditions: pd.DataFrame | None = None
    logo: pd.DataFrame | None = None


def example_labels(rows: pd.DataFrame, example_ids: np.ndarray, path: str) -> pd.DataFrame:
    """condition and lexical_group of each example, in the order of ``example_ids``."""
    labels = rows.drop_duplicates(["example_id", "condition", "lexical_group"])
    if labels["example_id"].duplicated().any():
        bad = labels.loc[labels["example_id"].duplicated(), "example_id"].iloc[0]
        raise ValueError(f"{path}: example {bad!r} has more than one condition or lexical group")
    return labels.set_index("example_id").loc[example_ids, ["condition", "lexical_group"]]


def _or_none(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def split_statistics(e: np.ndarray, e_abs: np.ndarray) -> tuple[dict, np.ndarray]:
    """The per-split summary numbers of an effect matrix and its per-example-absolute twin,
    and the shares p = |e| / E."""
    stats = concentration(e)
    n_index, n_layer_given_index = index_layer_decomposition(e)
    n_eff_abs = concentration(e_abs)["N_eff"]
    top = stats["top_head"]
    numbers = {
        "E": stats["E"],
        "N_eff": _or_none(stats["N_eff"]),
        "top_head_share": _or_none(stats["top_head_share"]),
        "top_layer": None if top is None else top[0],
        "top_head": None if top is None else top[1],
        "N_index": _or_none(n_index),
        "N_layer_given_index": _or_none(n_layer_given_index),
        "N_eff_abs": _or_none(n_eff_abs),
        "N_eff_abs_ratio": _or_none(n_eff_abs / stats["N_eff"]),
    }
    return numbers, stats["p"]


def check_c10(
    effects_path: str | os.PathLike,
    heads: pd.DataFrame,
    summary: pd.DataFrame,
    n_layers: int,
    n_heads: int,
) -> float:
    """Check C10 (docs §18) on what is about to be written, from the effects file read again
    by another route than :func:`concentration_tables` (pyarrow and ``numpy.bincount``, no
    pandas reshaping, no ``stats.concentration``): per split, the per-head means of the
    per-example ``effect`` against ``heads.e``, and Σ|e| and N_eff = exp(−Σ p log p),
    p = |e|/Σ|e|, of those means against ``summary``'s E and N_eff. Returns the largest
    absolute difference (0 when every number agrees)."""
    table = read_table(effects_path, columns=["split", "layer", "head", "effect"])
    split = np.asarray(table.column("split").to_pylist(), dtype=object)
    cell = (table.column("layer").to_numpy().astype(np.int64) * n_heads
            + table.column("head").to_numpy().astype(np.int64))  # fmt: skip
    effect = table.column("effect").to_numpy().astype(np.float64)
    worst = 0.0
    for name in pd.unique(split):
        mask = split == name
        counts = np.bincount(cell[mask], minlength=n_layers * n_heads)
        means = np.bincount(cell[mask], weights=effect[mask], minlength=n_layers * n_heads)
        means = means / np.where(counts > 0, counts, 1)
        rows = heads[heads["split"] == name]
        stored = np.full(n_layers * n_heads, np.nan)
        stored[rows["layer"].to_numpy() * n_heads + rows["head"].to_numpy()] = rows["e"]
        worst = max(worst, float(np.max(np.abs(means - stored))))  # NaN (a gap) propagates
        magnitude = np.abs(means)
        total = float(magnitude.sum())
        row = summary[summary["split"] == name].iloc[0]
        worst = max(worst, abs(total - float(row["E"])))
        if total > 0 and row["N_eff"] is not None and np.isfinite(row["N_eff"]):
            p = magnitude[magnitude > 0] / total
            worst = max(worst, abs(float(np.exp(-np.sum(p * np.log(p)))) - float(row["N_eff"])))
    return worst


def robustness(
    rows: pd.DataFrame,
    example_ids: np.ndarray,
    d: np.ndarray,
    base: dict,
    settings: Resampling,
    path: str,
) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The analysis-split row and the within-condition and leave-one-group-out tables."""
    labels = example_labels(rows, example_ids, path)
    e = effects_from_drops(d)
    null, p_lower = index_permutation_null(
        e, settings.n_permutations, seed=settings.permutation_seed
    )
    boot = bootstrap_n_eff(d, settings.n_bootstrap, seed=settings.bootstrap_seed)
    ci_low, ci_high = percentile_interval(boot, settings.ci)

    cond_rows = []
    for condition in pd.unique(labels["condition"]):
        mask = (labels["condition"] == condition).to_numpy()
        stats, _ = split_statistics(effects_from_drops(d[mask]), effects_abs_from_drops(d[mask]))
        cond_rows.append(
            {
                "condition": str(condition),
                "n_examples": int(mask.sum()),
                **{k: stats[k] for k in ("E", "N_eff", "top_head_share", "N_eff_abs")},
            }
        )

    groups, n_eff_logo = [], np.array([])
    lexical = labels["lexical_group"].to_numpy()
    if len(pd.unique(lexical)) > 1:  # leaving out the only group leaves nothing
        groups, n_eff_logo = leave_one_group_out_n_eff(d, lexical)
    n_eff_all = base["N_eff"]
    rel = np.full(len(groups), np.nan)
    if n_eff_all is not None:
        rel = (n_eff_logo - n_eff_all) / n_eff_all
    logo_rows = [
        {
            "lexical_group": str(g),
            "n_dropped": int((lexical == g).sum()),
            "n_kept": int((lexical != g).sum()),
            "N_eff": _or_none(n),
            "N_eff_all": n_eff_all,
            "rel_change": _or_none(r),
        }
        for g, n, r in zip(groups, n_eff_logo, rel, strict=True)
    ]
    finite = np.isfinite(rel)
    worst = int(np.argmax(np.where(finite, np.abs(rel), -1.0))) if finite.any() else None

    row = {
        **{k: v for k, v in base.items() if k not in ("top_layer", "top_head")},
        "n_layers": d.shape[1],
        "n_heads": d.shape[2],
        "index_meaningful": settings.index_meaningful,
        "N_index_null_median": _or_none(float(np.median(null))),
        "N_index_p_lower": _or_none(p_lower),
        "n_permutations": settings.n_permutations,
        "permutation_seed": settings.permutation_seed,
        "N_eff_boot_median": _or_none(float(np.median(boot))),
        "N_eff_ci_low": _or_none(ci_low),
        "N_eff_ci_high": _or_none(ci_high),
        "ci_level": settings.ci,
        "n_bootstrap": settings.n_bootstrap,
        "bootstrap_seed": settings.bootstrap_seed,
        "n_lexical_groups": len(pd.unique(lexical)),
        "logo_max_rel_change": None if worst is None else float(abs(rel[worst])),
        "logo_max_rel_change_group": None if worst is None else str(groups[worst]),
    }
    logo = pd.DataFrame(logo_rows, columns=results.LOGO.names[4:])
    return row, pd.DataFrame(cond_rows), logo


def concentration_tables(
    effects: pd.DataFrame,
    n_layers: int | None,
    n_heads: int | None,
    analysis_split: str,
    resampling: Resampling | None,
    path: str,
) -> Concentration:
    """Heads and summary rows of every split of one effects table (one model, seed, task);
    with ``resampling``, the robustness outputs of ``analysis_split`` too. Shapes default to
    the largest layer and head in the rows."""
    if effects.empty:
        raise ValueError(f"{path}: no rows")
    identity = single_identity(effects, path)
    splits = list(pd.unique(effects["split"]))
    if resampling is not None and analysis_split not in splits:
        raise ValueError(
            f"{path}: analysis split {analysis_split!r} (config concentration.split) was "
            f"not patched; the file has splits {splits}"
        )

    heads, summary, c11, robust = [], [], 0.0, None
    for split in splits:
        rows = effects[effects["split"] == split]
        example_ids, d = drops_array(rows, n_layers, n_heads)
        e, e_abs = effects_from_drops(d), effects_abs_from_drops(d)
        stats, p = split_statistics(e, e_abs)
        if stats["N_eff"] is not None:
            product = stats["N_index"] * stats["N_layer_given_index"]
            c11 = max(c11, abs(stats["N_eff"] - product) / stats["N_eff"])
        grid = matrix_columns(e)
        heads.append(
            pd.DataFrame(
                {
                    **identity,
                    "split": split,
                    "layer": grid["layer"],
                    "head": grid["head"],
                    "e": grid["value"],
                    "p": p.reshape(-1),
                }
            )
        )
        base = {**identity, "split": split, "n_examples": d.shape[0], **stats}
        summary.append({k: v for k, v in base.items() if k in results.SUMMARY.names})
        if split == analysis_split and resampling is not None:
            robust = robustness(rows, example_ids, d, base, resampling, path)
    if c11 > C11_TOLERANCE:
        raise ArithmeticError(
            f"check C11 failed: N_eff differs from N_index·N_layer|index by {c11:.3g} "
            f"(relative) > {C11_TOLERANCE}"
        )
    summary_frame = pd.DataFrame(summary)
    for column in ("top_layer", "top_head"):
        summary_frame[column] = summary_frame[column].astype("Int32")
    out = Concentration(
        identity=identity,
        heads=pd.concat(heads, ignore_index=True),
        summary=summary_frame,
        n_layers=e.shape[0],
        n_heads=e.shape[1],
        c11=c11,
    )
    if robust is None:
        return out
    row, conditions, logo = robust
    split_id = {k: row[k] for k in (*IDENTITY, "split")}
    return replace(
        out,
        robustness=pd.DataFrame([row]),
        conditions=conditions.assign(**split_id),
        logo=logo.assign(**split_id),
    )


# ----------------------------------------------------------------------------- pairs
class Drops:
    """Per-example drops of one (model, seed) on the analysis split of an effects file."""

    def __init__(self, path: str, task: str, split: str):
        self.path = path
        columns = ["model", "seed", "task", "split", "example_id", "lexical_group"]
        rows = read_table(path, columns=[*columns, "layer", "head", "effect"]).to_pandas()
        if set(rows["task"]) != {task}:
            raise ValueError(f"{path}: expected task {task!r}, found {sorted(set(rows['task']))}")
        rows = rows[rows["split"] == split]
        if rows.empty:
            raise ValueError(f"{path}: no rows of the analysis split {split!r}")
        models, seeds = pd.unique(rows["model"]), pd.unique(rows["seed"])
        if len(models) != 1 or len(seeds) != 1:
            raise ValueError(f"{path}: expected one model and seed, found {models} {seeds}")
        self.key = (str(models[0]), int(seeds[0]))
        meta = read_parquet_metadata(path)
        key = results.TASK_DATASET_SHA256
        self.dataset_sha256 = metadata_text(meta, key, path) if key in meta else None
        shape = [int(json.loads(meta[k])) if k in meta else None for k in ("n_layers", "n_heads")]
        self.example_ids, self.d = drops_array(rows, *shape)
        groups = rows.drop_duplicates("example_id").set_index("example_id")["lexical_group"]
        self.groups = groups.loc[self.example_ids].to_numpy().astype(str)


def aligned(a: Drops, b: Drops) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d_a, d_b in A's example order, lexical groups); refuses different example sets."""
    if a.dataset_sha256 and b.dataset_sha256 and a.dataset_sha256 != b.dataset_sha256:
        raise ValueError(
            f"paired bootstrap needs identical datasets: {a.path} has task dataset "
            f"{a.dataset_sha256}, {b.path} has {b.dataset_sha256}"
        )
    ids_a, ids_b = set(a.example_ids.tolist()), set(b.example_ids.tolist())
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
        raise ValueError(
            f"paired bootstrap needs the same examples in both models: {a.path} has "
            f"{len(only_a)} example ids not in {b.path} (e.g. {only_a[:3]}) and the other "
            f"{len(only_b)} not in it (e.g. {only_b[:3]})"
        )
    order = pd.Index(b.example_ids).get_indexer(a.example_ids)
    if not np.array_equal(a.groups, b.groups[order]):
        raise ValueError(f"{a.path} and {b.path} assign different lexical groups to examples")
    return a.d, b.d[order], a.groups


def compare(
    pair: dict,
    a: Drops,
    b: Drops,
    task: str,
    split: str,
    n_bootstrap: int,
    bootstrap_seed: int,
    ci: float,
) -> tuple[dict, list[dict]]:
    """The paired row of N_eff(A) − N_eff(B) and its leave-one-group-out rows."""
    d_a, d_b, groups = aligned(a, b)
    n_eff_a = float(n_eff_batch(effects_from_drops(d_a)))
    n_eff_b = float(n_eff_batch(effects_from_drops(d_b)))
    diff = n_eff_a - n_eff_b
    boot = paired_bootstrap_n_eff_difference(d_a, d_b, n_bootstrap, seed=bootstrap_seed)
    ci_low, ci_high = percentile_interval(boot, ci)
    ident = {"task": task, "split": split, **pair}
    logo = []
    names, weights = group_weights(groups, "leave_out")
    if len(names) > 1:  # leaving out the only group leaves nothing
        logo_a = n_eff_batch(weighted_effects(weights, d_a))
        logo_b = n_eff_batch(weighted_effects(weights, d_b))
        for g, w, na, nb in zip(names, weights, logo_a, logo_b, strict=True):
            logo.append(
                {
                    **ident,
                    "lexical_group": str(g),
                    "n_kept": int(w.sum()),
                    "N_eff_a": float(na),
                    "N_eff_b": float(nb),
                    "diff": float(na - nb),
                    "sign_reversed": bool(np.sign(na - nb) * np.sign(diff) < 0),
                }
            )
    logo_diffs = [r["diff"] for r in logo]
    row = {
        **ident,
        "n_examples": len(d_a),
        "N_eff_a": n_eff_a,
        "N_eff_b": n_eff_b,
        "diff": diff,
        "ratio": n_eff_a / n_eff_b,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "ci_level": ci,
        "n_bootstrap": n_bootstrap,
        "bootstrap_seed": bootstrap_seed,
        "resolved": bool(ci_low > 0 or ci_high < 0),
        "logo_n_groups": len(logo),
        "logo_sign_reversals": sum(r["sign_reversed"] for r in logo),
        "logo_min_diff": min(logo_diffs) if logo else None,
        "logo_max_diff": max(logo_diffs) if logo else None,
        "logo_reversal_groups": ",".join(r["lexical_group"] for r in logo if r["sign_reversed"]),
    }
    return row, logo


def read_drops(paths: Sequence[str], task: str, split: str) -> dict[tuple[str, int], Drops]:
    """The analysis-split drops of each effects file by (model, seed); one file each."""
    drops: dict[tuple[str, int], Drops] = {}
    for path in paths:
        one = Drops(path, task, split)
        if one.key in drops:
            raise ValueError(f"{path} and {drops[one.key].path} both hold {one.key}")
        drops[one.key] = one
    return drops


def paired_tables(
    pairs: Sequence[dict],
    drops: Mapping[tuple[str, int], Drops],
    task: str,
    split: str,
    n_bootstrap: int,
    bootstrap_seed: int,
    ci: float,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paired and paired-LOGO frames of ``pairs`` (resolved config pairs)."""
    if not pairs:
        raise ValueError("--pairs lists no pairs; nothing to compare")
    rows, logo_rows = [], []
    for pair in pairs:
        keys = (pair["model_a"], int(pair["seed_a"])), (pair["model_b"], int(pair["seed_b"]))
        missing = [k for k in keys if k not in drops]
        if missing:
            raise ValueError(f"pair {pair['pair_label']}: no --effects file holds {missing}")
        row, logo = compare(
            pair, drops[keys[0]], drops[keys[1]], task, split, n_bootstrap, bootstrap_seed, ci
        )
        rows.append(row)
        logo_rows += logo
    return pd.DataFrame(rows), pd.DataFrame(logo_rows, columns=results.PAIRED_LOGO.names)


# ----------------------------------------------------------------------------- loss
TASKS = results.LOSS_TASKS


def read_summaries(paths: Sequence[str], split: str) -> pd.DataFrame:
    """N_eff and N_eff_abs per (model, seed, task) from robustness Parquets."""
    frames = []
    for path in paths:
        frame = read_table(path).to_pandas()
        frame = frame[frame["split"] == split]
        if frame.empty:
            raise ValueError(f"{path}: no row of the analysis split {split!r}")
        frames.append(frame[["model", "seed", "task", "N_eff", "N_eff_abs"]])
    summary = pd.concat(frames, ignore_index=True)
    if summary.duplicated(["model", "seed", "task"]).any():
        raise ValueError("--robustness files hold some (model, seed, task) more than once")
    return summary


def read_losses(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """Final validation loss per (model, seed) from checkpoint manifests."""
    rows = []
    for path in paths:
        manifest = load_manifest(path)
        missing = [k for k in ("model_name", "init_seed", "val_loss_nats") if k not in manifest]
        if missing:
            raise KeyError(f"{path}: checkpoint manifest lacks {missing}")
        rows.append(
            {
                "model": manifest["model_name"],
                "seed": int(manifest["init_seed"]),
                "val_loss": manifest["val_loss_nats"],
            }
        )
    return pd.DataFrame(rows)


def loss_table(
    summary: pd.DataFrame,
    losses: pd.DataFrame,
    models: Mapping[str, Mapping],
    base_n_head: int,
    included: Sequence[str],
) -> pd.DataFrame:
    """One row per (model, seed): validation loss, N_eff per task and their geometric mean."""
    wide = summary.pivot(index=["model", "seed"], columns="task", values="N_eff")
    missing_tasks = [t for t in TASKS if t not in wide.columns]
    if missing_tasks:
        raise ValueError(f"summaries lack tasks {missing_tasks}")
    wide = wide[list(TASKS)].add_prefix("N_eff_").reset_index()
    frame = losses.merge(wide, on=["model", "seed"], how="outer", indicator=True)
    unmatched = frame[frame["_merge"] != "both"]
    if not unmatched.empty:
        raise ValueError(
            "manifests and summaries name different (model, seed): "
            + ", ".join(
                f"{m} s{s} ({w})" for m, s, w in unmatched[["model", "seed", "_merge"]].values
            )
        )
    frame = frame.drop(columns="_merge")
    unknown = sorted(set(frame["model"]) - set(models))
    if unknown:
        raise ValueError(f"--models lacks {unknown}")
    for key in ("display_name", "geometry", "corpus", "reader_type", "n_head"):
        frame[key] = [models[m].get(key) for m in frame["model"]]
    frame["n_head"] = frame["n_head"].astype("int32")
    frame["index_meaningful"] = frame["n_head"] == base_n_head
    frame["N_eff_geomean"] = geometric_mean(frame[[f"N_eff_{t}" for t in TASKS]].to_numpy())
    frame["included"] = frame["model"].isin(included)
    return frame.sort_values(["model", "seed"]).reset_index(drop=True)


def spearman_rows(
    loss: pd.DataFrame,
    summary: pd.DataFrame,
    paper_runs: Sequence[tuple[str, int]] | None = None,
    figure3_runs: Sequence[tuple[str, int]] | None = None,
) -> pd.DataFrame:
    """Spearman ρ of loss vs geometric-mean N_eff and of N_eff vs N_eff_abs (docs §12.3).

    N_eff vs N_eff_abs is reported as the paper defines it: over the (model, seed, task)
    rows of ``paper_runs`` (subset ``paper_pairs``: the 19 base-architecture configurations
    × 3 tasks = 57 pairs in the paper study) and, within each task, over ``figure3_runs``
    (subset ``figure3``: the six corpus-S models of paper Figure 3). ``None`` takes every
    run. The older view over every run (multiscreen included) is kept as subset
    ``every_run`` (pooled, and per task)."""
    rows = []
    chosen = loss[loss["included"]]
    for subset, frame in (("all", chosen), ("base_heads", chosen[chosen["index_meaningful"]])):
        rho, p = spearman(frame["val_loss"].to_numpy(), frame["N_eff_geomean"].to_numpy())
        rows.append(_spearman_row("loss_vs_N_eff", subset, None, len(frame), rho, p))
    paper = _of_runs(summary, paper_runs)
    figure3 = _of_runs(summary, figure3_runs)
    groups = [("paper_pairs", None, paper)]
    groups += [("figure3", t, figure3[figure3["task"] == t]) for t in TASKS]
    groups += [("every_run", None, summary)]
    groups += [("every_run", t, summary[summary["task"] == t]) for t in TASKS]
    for subset, task, frame in groups:
        rho, p = spearman(frame["N_eff"].to_numpy(), frame["N_eff_abs"].to_numpy())
        rows.append(_spearman_row("N_eff_vs_N_eff_abs", subset, task, len(frame), rho, p))
    return pd.DataFrame(rows)


def _of_runs(summary: pd.DataFrame, runs: Sequence[tuple[str, int]] | None) -> pd.DataFrame:
    """The rows of ``summary`` whose (model, seed) is one of ``runs`` (all when None)."""
    if runs is None:
        return summary
    wanted = {(str(m), int(s)) for m, s in runs}
    keys = zip(summary["model"], summary["seed"].astype(int), strict=True)
    return summary[[key in wanted for key in keys]]


def _spearman_row(analysis, subset, task, n, rho, p) -> dict:
    finite = np.isfinite(rho)
    return {
        "analysis": analysis,
        "subset": subset,
        "task": task,
        "n": n,
        "rho": float(rho) if finite else None,
        "p_value": float(p) if finite else None,
    }
