"""Seed statistics of an SA-MoE study (SAMOE §17, §11): every per-run quantity averaged over
the seeds with its Student-t interval (``seed_means``), and the paired contrasts
(``contrasts``): each variant against the same seed's Ordinary MoE for quality (PPL on the
log scale, accuracy in percentage points, with the non-inferiority decision) and Persistent
against latest-write-only for the state analyses.

    python -m headgeom.samoe.stages.stats --config-json '{...}' --quality q1 q2 ... \\
        --local-suppression
        l1 ... --history h1 ... --state-geometry g1 ... --seeds seeds.json \\
        --seed-means seed_means.parquet --contrasts contrasts.parquet
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from headgeom.hashing import content_hash
from headgeom.io import read_json
from headgeom.model.config import ModelConfig
from headgeom.samoe import counts, results
from headgeom.samoe.checkpoint import checkpoint_header
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.hub import HubSource
from headgeom.samoe.quality import Contrast, decide, paired_contrast, relative
from headgeom.samoe.stats import sequence_mean, t_interval

#: Quantities whose P − LWO contrast the paper reports (SAMOE §12, App. C.2).
STATE_CONTRASTS = (
    "set_change_rate",
    "non_recent",
    "ess",
    "max_share",
    "signed_state_term",
    "probe_accuracy",
    "long_horizon_accuracy",
    "selected_abs_margin_change",
    "selected_jaccard_downstream",
    "selected_output_kl",
    "ledger_advantage",
    "persistence_margin_change",
)


def probe_values(probes: pd.DataFrame) -> list[tuple]:
    """Per run: the Figure-3 aggregate (equal-pair mean over every pair, per representation
    and budget), the long-horizon endpoint (native, top budget, the long pairs) and P's
    hidden-r minus native at the top budget (SAMOE §13.4: the two aggregates kept apart)."""
    rows = []
    for (f, v, s), g in probes.groupby(["family", "variant", "seed"], sort=False):
        top = g.budget.max()
        for (rep, budget), h in g.groupby(["representation", "budget"], sort=False):
            rows.append((f, v, s, "probe_accuracy", f"{rep}|{budget}", h.accuracy.mean()))
        native = g[(g.representation == "native") & (g.budget == top)]
        rows.append(
            (f, v, s, "long_horizon_accuracy", "", native[native.long_horizon].accuracy.mean())
        )
        hidden = g[(g.representation == "hidden_r") & (g.budget == top)]
        if not hidden.empty:
            rows.append(
                (
                    f,
                    v,
                    s,
                    "hidden_minus_native",
                    "",
                    hidden.accuracy.mean() - native.accuracy.mean(),
                )
            )
    return rows


def intervention_values(interventions: pd.DataFrame, horizons: list[int]) -> list[tuple]:
    """Per run, sequence means first (SAMOE §14.3): the three outcomes of the selected source
    (Figure 4), Eq. 47's ledger-control advantage with each control's own difference, and
    the persistence endpoints (suppressing exactly h layers back)."""
    rows = []
    for (f, v, s), g in interventions.groupby(["family", "variant", "seed"], sort=False):
        sel = g[g.role == "selected"]
        for column in ("abs_margin_change", "jaccard_downstream", "output_kl"):
            rows.append((f, v, s, f"selected_{column}", "", sequence_mean(sel[column], sel.seq_id)))
        per_target = g[g.role != ""].pivot_table(
            index=["seq_id", "slot"], columns="role", values="abs_margin_change", aggfunc="first"
        )
        controls = [c for c in ("random", "norm", "distance") if c in per_target]
        if "selected" in per_target and len(controls) == 3:
            seqs = per_target.index.get_level_values(0)
            adv = per_target["selected"] - per_target[controls].mean(axis=1, skipna=False)
            rows.append((f, v, s, "ledger_advantage", "", sequence_mean(adv.to_numpy(), seqs)))
            for c in controls:
                diff = (per_target["selected"] - per_target[c]).to_numpy()
                rows.append((f, v, s, "ledger_minus_control", c, sequence_mean(diff, seqs)))
        for h in horizons:
            back = g[g.source == g.layer - h]
            rows.append((f, v, s, "persistence_margin_change", str(h),
                         sequence_mean(back.abs_margin_change, back.seq_id)))  # fmt: skip
    return rows


def ranking_values(rankings: pd.DataFrame) -> list[tuple]:
    """Per run: each method's ranking metrics (their three-seed means are Table 12's kind)."""
    return [(r.family, r.variant, r.seed, f"ranking_{r.metric}", r.method, r.value)
            for r in rankings.itertuples(index=False)]  # fmt: skip


def per_run_values(quality, local, history, geometry, probes, interventions, rankings,
                   horizons) -> pd.DataFrame:  # fmt: skip
    """One row per (family, variant, seed, quantity, key): the value of that run."""
    rows = []
    q = quality[quality["metric"].isin(["ppl", "primary"])]
    for r in q.itertuples(index=False):
        quantity = "ppl" if r.metric == "ppl" else ("macro" if r.subset == "macro" else "accuracy")
        key = "" if r.subset in ("all", "macro") else r.subset
        rows.append((r.family, r.variant, r.seed, quantity, key, r.value))
    for r in local[~local["layer0"]].itertuples(index=False):
        rows.append(
            (r.family, r.variant, r.seed, "set_change_rate", f"{r.lam:g}", r.set_change_rate)
        )
    for (f, v, s), g in history.groupby(["family", "variant", "seed"], sort=False):
        for quantity, column in (("non_recent", "non_recent"), ("ess", "ess"),
                                 ("max_share", "max_share"), ("signed_state_term", "state_term"),
                                 ("margin", "margin")):  # fmt: skip
            rows.append((f, v, s, quantity, "", sequence_mean(g[column], g["seq_id"])))
    for r in geometry.itertuples(index=False):
        rows.append((r.family, r.variant, r.seed, "state_norm", str(r.layer), r.mean_norm))
        rows.append((r.family, r.variant, r.seed, "clamp_fraction", str(r.layer), r.clamp_fraction))
    rows += probe_values(probes)
    rows += intervention_values(interventions, horizons)
    rows += ranking_values(rankings)
    return pd.DataFrame(rows, columns=["family", "variant", "seed", "quantity", "key", "value"])


def seed_means(values: pd.DataFrame, seeds: list[int]) -> pd.DataFrame:
    rows = []
    for (f, v, q, k), g in values.groupby(["family", "variant", "quantity", "key"], sort=False):
        per_seed = g.set_index("seed")["value"].reindex(seeds).dropna()
        mean, low, high = t_interval(per_seed.to_numpy())
        rows.append({"family": f, "variant": v, "quantity": q, "key": k, "mean": mean,
                     "low": low, "high": high, "per_seed": per_seed.tolist(),
                     "n_seeds": len(per_seed)})  # fmt: skip
    return pd.DataFrame(rows)


def paired(a, b, log: bool) -> Contrast:
    """The paired seed contrast; with one seed its difference and no interval (a decision
    against a bound is then inconclusive)."""
    if len(a) >= 2:
        return paired_contrast(a, b, log=log)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = np.log(a) - np.log(b) if log else a - b
    return Contrast(tuple(d.tolist()), float(d.mean()), math.nan, math.nan)


def contrast_row(f, q, k, v, ref, scale, a, b, bound=math.nan, worse_is_higher=None) -> dict:
    c = paired(a, b, log=scale == "log_ratio")
    if scale == "log_ratio":
        c = relative(c)
    elif scale == "percentage_points":
        c = type(c)(tuple(100 * x for x in c.per_seed), 100 * c.mean, 100 * c.low, 100 * c.high)
    decision = None if worse_is_higher is None else decide(c.low, c.high, bound, worse_is_higher)
    return {"family": f, "quantity": q, "key": k, "variant": v, "reference": ref, "scale": scale,
            "mean": c.mean, "low": c.low, "high": c.high, "per_seed": list(c.per_seed),
            "n_seeds": len(c.per_seed), "all_positive": all(x > 0 for x in c.per_seed),
            "bound": bound, "decision": decision}  # fmt: skip


def contrasts(values: pd.DataFrame, seeds: list[int], bounds: dict) -> pd.DataFrame:
    table = values.pivot_table(index=["family", "quantity", "key", "seed"], columns="variant",
                               values="value", aggfunc="first")  # fmt: skip
    rows = []
    for (f, q, k), g in table.groupby(level=[0, 1, 2], sort=False):
        g = g.droplevel([0, 1, 2]).reindex(seeds)
        if q in ("ppl", "macro", "accuracy") and "ordinary" in g:
            for v in (c for c in g.columns if c != "ordinary"):
                # only the overall PPL and the macro carry a bound and a decision
                if q == "ppl":
                    bound, worse_is_higher = (
                        (bounds["ppl_rel"], True) if k == "" else (math.nan, None)
                    )
                    scale = "log_ratio"
                else:
                    bound, worse_is_higher = (
                        (bounds["macro_pp"], False) if q == "macro" else (math.nan, None)
                    )
                    scale = "percentage_points"
                rows.append(contrast_row(f, q, k, v, "ordinary", scale, g[v], g["ordinary"],
                                         bound, worse_is_higher))  # fmt: skip
        pair = ["persistent", "latest"]
        if q in STATE_CONTRASTS and set(pair) <= set(g.columns) and g[pair].notna().all().all():
            rows.append(contrast_row(f, q, k, "persistent", "latest", "difference",
                                     g["persistent"], g["latest"]))  # fmt: skip
    return pd.DataFrame(rows)


def family_shape(family: str, path: Path, fam: dict) -> counts.FamilyShape:
    """The shapes of a family's dense checkpoint: the workspace GPT's, or an imported model's
    (its config from the header; T the family's ``seq_len``, else the paper's)."""
    header = checkpoint_header(path)
    if "hub" not in header:
        return counts.toy_shape(ModelConfig.from_dict(header["model_config"]), family)
    paper = counts.PAPER_SHAPES.get(fam.get("paper_shape") or fam.get("hf", {}).get("repo_id"))
    seq_len = fam.get("seq_len") or (paper.seq_len if paper is not None else None)
    return counts.hub_shape(HubSource.from_dict(header["hub"]).hf_config(), family, seq_len)


def counts_frame(dense: dict[str, Path], moe: dict, variants: list[str],
                 families: dict | None = None) -> pd.DataFrame:  # fmt: skip
    """SAMOE §8 counts of every (family, variant) from the dense source's shapes."""
    rows = []
    for family, path in dense.items():
        shape = family_shape(family, path, (families or {}).get(family, {}))
        moe_cfg = MoEConfig.from_dict(moe)
        ordinary = counts.counts(shape, moe_cfg, "ordinary")
        trace = counts.trace_sizes(shape, moe_cfg)
        for variant in variants:
            c = counts.counts(shape, moe_cfg, variant)
            rows.append({"family": family, "variant": variant, "total_params": c.total,
                         "active_params": c.active, "flops_per_token": c.flops_per_token,
                         "active_rel": c.active / ordinary.active - 1,
                         "flops_rel": c.flops_per_token / ordinary.flops_per_token - 1,
                         "trace_writes_mib": trace.writes if variant != "ordinary" else 0.0,
                         "trace_state_mib": trace.live_state if variant != "ordinary" else 0.0,
                         "trace_writes_top3_mib": trace.writes_and_top3})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    for name in ("quality", "local-suppression", "history", "state-geometry", "probes",
                 "interventions", "rankings"):  # fmt: skip
        parser.add_argument(f"--{name}", nargs="*", type=Path, default=[])
    parser.add_argument("--dense-json", required=True, help="family -> dense checkpoint")
    for name in ("seeds", "seed-means", "contrasts", "counts"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    registry = read_json(args.seeds)
    values = per_run_values(results.read_runs(args.quality, results.QUALITY),
                            results.read_runs(args.local_suppression, results.LOCAL_SUPPRESSION),
                            results.read_runs(args.history, results.HISTORY),
                            results.read_runs(args.state_geometry, results.STATE_GEOMETRY),
                            results.read_runs(args.probes, results.PROBES),
                            results.read_runs(args.interventions, results.INTERVENTIONS),
                            results.read_runs(args.rankings, results.RANKINGS),
                            cfg["interventions"]["persistence_horizons"])  # fmt: skip
    seeds = [int(s) for s in cfg["seeds"]]
    means = seed_means(values, seeds)
    paired = contrasts(values, seeds, cfg["noninferiority"])
    meta = {"config": cfg, "config_hash": content_hash(cfg),
            "seed_registry_hash": registry["content_hash"]}  # fmt: skip
    dense = {f: Path(p) for f, p in json.loads(args.dense_json).items()}
    results.COUNTS.write(args.counts, counts_frame(dense, cfg["moe"], cfg["variants"],
                                                   cfg.get("families")), meta)  # fmt: skip
    results.SEED_MEANS.write(args.seed_means, means, meta)
    results.CONTRASTS.write(args.contrasts, paired, meta)
    quality = paired[paired["decision"].notna()] if len(paired) else paired
    for r in quality.itertuples(index=False):
        print(f"{r.family} {r.variant} {r.quantity}: {r.mean:+.4g} [{r.low:+.4g}, {r.high:+.4g}] "
              f"→ {r.decision}", file=sys.stderr)  # fmt: skip
    print(f"seed statistics: {len(means)} seed means, {len(paired)} contrasts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
