"""The SA-MoE paper's tables and figures (SAMOE §18) and the comparison with its reference
numbers (§22), each a pure function of the study's Parquets and config.

Every table is a :class:`headgeom.render.Table` (the tidy frame is the CSV; Markdown
and LaTeX print the same cells); every figure is drawn from a tidy frame written beside it as
CSV. The comparison follows SAMOE §22's rule: toy magnitudes are not expected to match, so
each row says whether the **direction** agrees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from headgeom.render import Block, Table  # noqa: E402

VARIANT_LABEL = {"ordinary": "Ordinary", "latest": "LWO", "persistent": "P"}
COLOURS = {"ordinary": "#7f7f7f", "latest": "#1f77b4", "persistent": "#d62728"}


def fmt(v, spec: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def interval(mean, low, high, spec: str = "{:+.3f}") -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "—"
    if low is None or (isinstance(low, float) and math.isnan(low)):
        return spec.format(mean)
    return f"{spec.format(mean)} [{spec.format(low)}, {spec.format(high)}]"


def _table(name: str, frame: pd.DataFrame, cells: pd.DataFrame, caption: str) -> Table:
    return Table(name=name, frame=frame, blocks=[Block(cells=cells)], caption=caption)


@dataclass
class Inputs:
    """What the tables and figures read."""

    config: Mapping
    counts: pd.DataFrame
    seed_means: pd.DataFrame
    contrasts: pd.DataFrame
    history: pd.DataFrame  # every state run's targets
    probes: pd.DataFrame  # every state run's probes
    rankings: pd.DataFrame  # every state run's ranking metrics (bootstrap intervals)
    audit_cost: pd.DataFrame  # the pilot of each family
    runtime: pd.DataFrame  # the runtime medians of each family
    checks: pd.DataFrame  # per run: check, residual, tolerance
    # per run and layer ≥ 1: the history metrics over every final-pool decision (SAMOE §10.3)
    history_pool: pd.DataFrame | None = None
    # per run: the pool records' clamped and write coordinates and the dense perplexity
    pool_records: pd.DataFrame | None = None
    # per (family, seed): the seed registry's checks (samoe/seeds.json: K1, K3, K5)
    seed_checks: pd.DataFrame | None = None

    def mean(self, family, variant, quantity, key="") -> pd.Series | None:
        m = self.seed_means
        row = m[(m.family == family) & (m.variant == variant) & (m.quantity == quantity)
                & (m.key == key)]  # fmt: skip
        return None if row.empty else row.iloc[0]

    def contrast(self, family, quantity, variant, reference, key="") -> pd.Series | None:
        c = self.contrasts
        if c.empty:
            return None
        row = c[(c.family == family) & (c.quantity == quantity) & (c.variant == variant)
                & (c.reference == reference) & (c.key == key)]  # fmt: skip
        return None if row.empty else row.iloc[0]


# --------------------------------------------------------------------------- tables
def table1(x: Inputs) -> Table:
    """Params, active params, FLOPs, ΔPPL %, Δmacro pp, verdict (paper Table 1)."""
    rows = []
    for r in x.counts.itertuples(index=False):
        ppl = x.contrast(r.family, "ppl", r.variant, "ordinary")
        macro = x.contrast(r.family, "macro", r.variant, "ordinary")
        verdict = None
        if ppl is not None and macro is not None:
            verdict = ("supported" if ppl.decision == macro.decision == "supported" else
                       "not supported" if "not supported" in (ppl.decision, macro.decision)
                       else "inconclusive")  # fmt: skip
        rows.append({
            "family": r.family, "variant": r.variant, "total_params": r.total_params,
            "active_params": r.active_params, "flops_per_token": r.flops_per_token,
            "active_rel": r.active_rel, "flops_rel": r.flops_rel,
            **{f"ppl_rel_{k}": (None if ppl is None else ppl[k]) for k in ("mean", "low", "high")},
            **{f"macro_pp_{k}": (None if macro is None else macro[k])
               for k in ("mean", "low", "high")},
            "ppl_decision": None if ppl is None else ppl.decision,
            "macro_decision": None if macro is None else macro.decision,
            "verdict": verdict,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Params": frame.total_params.map("{:,}".format),
        "Active": frame.active_params.map("{:,}".format),
        "Active Δ": frame.active_rel.map(lambda v: f"{100 * v:+.2f}%"),
        "FLOPs/token": frame.flops_per_token.map("{:,}".format),
        "FLOPs Δ": frame.flops_rel.map(lambda v: f"{100 * v:+.2f}%"),
        "ΔPPL %": [interval(*(None if pd.isna(r.ppl_rel_mean) else 100 * r[f"ppl_rel_{k}"]
                              for k in ("mean", "low", "high")), spec="{:+.2f}")
                   for _, r in frame.iterrows()],
        "Δmacro pp": [interval(r.macro_pp_mean, r.macro_pp_low, r.macro_pp_high, "{:+.2f}")
                      for _, r in frame.iterrows()],
        "Verdict": frame.verdict.fillna("—"),
    })  # fmt: skip
    return _table(
        "table1",
        frame,
        cells,
        "Table 1. Cost and quality against the matched Ordinary MoE (three-seed "
        "means, 95% t-intervals; non-inferiority: PPL ≤ +1%, macro ≥ −1 pp).",
    )


def config_table(name: str, block: Mapping, caption: str) -> Table:
    flat = pd.json_normalize(dict(block), sep=".").iloc[0]
    frame = pd.DataFrame({"key": flat.index, "value": [str(v) for v in flat.to_numpy()]})
    return _table(name, frame, frame.rename(columns={"key": "Key", "value": "Value"}), caption)


def table4(x: Inputs) -> Table:
    frame = x.counts.copy()
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Total": frame.total_params.map("{:,}".format),
        "Active": frame.active_params.map("{:,}".format),
        "FLOPs/token": frame.flops_per_token.map("{:,}".format),
        "Writes (MiB)": frame.trace_writes_mib.map("{:.3f}".format),
        "Live state (MiB)": frame.trace_state_mib.map("{:.4f}".format),
        "Writes + Top-3 (MiB)": frame.trace_writes_top3_mib.map("{:.3f}".format),
    })  # fmt: skip
    return _table("table4", frame, cells, "Table 4. Parameter counts, analytical FLOPs per "
                  "token and trace sizes (bf16) per sequence.")  # fmt: skip


def table7(x: Inputs) -> Table:
    c = x.contrasts
    frame = c[c.quantity.isin(["accuracy", "macro"]) & (c.reference == "ordinary")].copy()
    frame["task"] = frame.key.where(frame.quantity == "accuracy", "macro")
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL), "Task": frame.task,
        "Δ pp vs Ordinary": [interval(r.mean, r.low, r.high, "{:+.2f}")
                             for r in frame.itertuples()],
        "Per seed": frame.per_seed.map(lambda v: ", ".join(f"{x:+.2f}" for x in v)),
    })  # fmt: skip
    return _table("table7", frame.drop(columns="task"), cells, "Table 7. Task-level accuracy "
                  "differences to the matched Ordinary MoE (percentage points).")  # fmt: skip


def table10(x: Inputs) -> Table:
    frame = x.checks[x.checks.check.isin(["K6", "K7", "K8"])].copy()
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Seed": frame.seed.astype(str), "Check": frame.check,
        "Max abs. residual": frame.residual.map("{:.3g}".format),
        "Tolerance": frame.tolerance.map("{:.0e}".format),
    })  # fmt: skip
    return _table("table10", frame, cells, "Table 10. Ledger reconstruction (float32): K6 "
                  "Σ c − ωᵀs_L, K7 router logits, K8 state-only replay.")  # fmt: skip


def table16(x: Inputs) -> Table:
    m = x.seed_means
    frame = m[m.quantity == "set_change_rate"].copy()
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL), "λ": frame.key,
        "Set-change rate": [interval(100 * r.mean, 100 * r.low, 100 * r.high, "{:.1f}")
                            for r in frame.itertuples()],
        "Per seed (%)": frame.per_seed.map(lambda v: " / ".join(f"{100 * x:.2f}" for x in v)),
    })  # fmt: skip
    return _table("table16", frame, cells, "Table 16. Local state suppression: Top-2 "
                  "set-change rate (%) at each λ, layer 0 excluded.")  # fmt: skip


def table_history(x: Inputs) -> Table:
    m = x.seed_means
    quantities = {"non_recent": ("Non-recent share", 100), "ess": ("ESS (writes)", 1),
                  "max_share": ("Largest-source share", 100),
                  "signed_state_term": ("Signed state term", 1)}  # fmt: skip
    frame = m[m.quantity.isin(list(quantities))].copy()
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Quantity": frame.quantity.map(lambda q: quantities[q][0]),
        "Mean [95% CI]": [
            interval(*(quantities[r.quantity][1] * v for v in (r.mean, r.low, r.high)), "{:.3f}")
            for r in frame.itertuples()
        ],
    })  # fmt: skip
    return _table("table_history", frame, cells, "Distributed history of the audited targets "
                  "(paper §5.3, App. C.2): shares in %, sequence means first.")  # fmt: skip


def table_history_pool(x: Inputs) -> Table:
    """SAMOE §10.3's supplement: the history metrics over every decision at layer ≥ 1 of the
    final pool (per run: kept-weighted means over the layers; then the mean over seeds),
    beside the audited targets' (their seed means), and the clamped coordinates."""
    hp = x.history_pool if x.history_pool is not None else pd.DataFrame()
    rows = []
    for (f, v), g in hp.groupby(["family", "variant"], sort=False) if len(hp) else ():
        per_seed = []
        for _, r in g.groupby("seed", sort=False):
            kept, n = r.n_kept.to_numpy(), r.n_decisions.to_numpy()
            w = kept / kept.sum() if kept.sum() else kept * 0.0
            per_seed.append({m: float((r[m].fillna(0).to_numpy() * w).sum())
                             for m in ("non_recent", "ess", "max_share")}
                            | {"signed_state_term": float((r.signed_state_term.to_numpy() * n)
                                                          .sum() / n.sum()),
                               "n_decisions": int(n.sum()), "n_kept": int(kept.sum())})  # fmt: skip
        every = pd.DataFrame(per_seed).mean()
        clamped = None
        if x.pool_records is not None and len(x.pool_records):
            pr = x.pool_records[(x.pool_records.family == f) & (x.pool_records.variant == v)]
            if len(pr):
                clamped = (int(pr.clamped_final.sum()), int(pr.coordinates_final.sum()))
        for quantity in ("non_recent", "ess", "max_share", "signed_state_term"):
            target = x.mean(f, v, quantity)
            rows.append({"family": f, "variant": v, "quantity": quantity,
                         "every_decision": every[quantity],
                         "targets": None if target is None else target["mean"],
                         "n_decisions": int(every["n_decisions"]),
                         "n_kept": int(every["n_kept"]),
                         "clamped_coordinates": None if clamped is None else clamped[0],
                         "write_coordinates": None if clamped is None else clamped[1]})  # fmt: skip
    columns = [
        "family",
        "variant",
        "quantity",
        "every_decision",
        "targets",
        "n_decisions",
        "n_kept",
        "clamped_coordinates",
        "write_coordinates",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    label = {"non_recent": ("Non-recent share (%)", 100), "ess": ("ESS (writes)", 1),
             "max_share": ("Largest-source share (%)", 100),
             "signed_state_term": ("Signed state term", 1)}  # fmt: skip
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Quantity": frame.quantity.map(lambda q: label[q][0]),
        "Every decision (L ≥ 1)": [fmt(label[r.quantity][1] * r.every_decision)
                                   for r in frame.itertuples()],
        "Audited targets": [fmt(None if r.targets is None or pd.isna(r.targets)
                                else label[r.quantity][1] * r.targets)
                            for r in frame.itertuples()],
        "Decisions (kept)": [f"{r.n_decisions:,} ({r.n_kept:,})" for r in frame.itertuples()],
        "Clamped coordinates": ["—" if pd.isna(r.clamped_coordinates) else
                                f"{int(r.clamped_coordinates):,} of "
                                f"{int(r.write_coordinates):,}" for r in frame.itertuples()],
    })  # fmt: skip
    return _table("table_history_pool", frame, cells, "Distributed history over every routing "
                  "decision at layer ≥ 1 of the final pool (SAMOE §10.3's supplement; per seed "
                  "the decisions with mass A > 0 weighted equally, then the mean over seeds) "
                  "beside the audited targets (sequence means first): the targets are not "
                  "typical decisions. Clamped coordinates: write coordinates of the final pool "
                  "where the persistent clip acted (|s_l + u_l| > c).")  # fmt: skip


#: The step-0 identity (K1) in the seed registry: key, what it counts.
STEP0 = (
    ("check_K1.writes_mismatches", "nonzero step-0 writes (P and LWO)"),
    ("check_K1.logits_mismatches", "router logits differing, P vs LWO"),
    ("check_K1.ordinary_logits_mismatches", "router logits differing, Ordinary vs P"),
    ("check_K1.ordinary_outputs_max_abs_residual", "output logits, largest Ordinary − P gap"),
)


def table_step0(x: Inputs) -> Table:
    """K1 of every (family, seed) from the seed registry: at step 0 the persistent and
    latest variants compute what the Ordinary MoE computes (SAMOE §5.4)."""
    sc = x.seed_checks if x.seed_checks is not None else pd.DataFrame()
    rows = [{"family": r["family"], "seed": int(r["seed"]), "check": label, "key": key,
             "value": r[key]} for _, r in sc.iterrows() for key, label in STEP0
            if key in r and not pd.isna(r[key])]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["family", "seed", "check", "key", "value"])
    cells = pd.DataFrame({"Family": frame.family, "Seed": frame.seed.astype(str),
                          "Step-0 comparison": frame.check,
                          "Value": frame.value.map(lambda v: f"{v:g}")})  # fmt: skip
    return _table("table_step0", frame, cells, "Step-0 identity (K1, SAMOE §5.4): every write "
                  "exactly 0, and the three variants' router logits and outputs bitwise equal "
                  "(0 is the only value that passes).")  # fmt: skip


def table_quality_dense(x: Inputs) -> Table:
    """Each run's final-pool perplexity beside its dense source's on the same sequences
    (imported families: the model it was upcycled from)."""
    pr = x.pool_records if x.pool_records is not None else pd.DataFrame()
    columns = ["family", "variant", "seed", "ppl", "ppl_dense", "ppl_rel_dense"]
    frame = (pr[[c for c in columns if c in pr]].copy() if len(pr) and "ppl_dense" in pr
             else pd.DataFrame(columns=columns))  # fmt: skip
    cells = pd.DataFrame({
        "Family": frame.family, "Variant": frame.variant.map(VARIANT_LABEL),
        "Seed": frame.seed.astype(str), "PPL": frame.ppl.map(lambda v: fmt(v, "{:.3f}")),
        "Dense PPL": frame.ppl_dense.map(lambda v: fmt(v, "{:.3f}")),
        "Δ vs dense": frame.ppl_rel_dense.map(
            lambda v: fmt(None if pd.isna(v) else 100 * v, "{:+.2f}%")),
    })  # fmt: skip
    return _table("table_quality_dense", frame, cells, "Final-pool perplexity of each run "
                  "beside its dense source's on the same sequences (imported families; a toy "
                  "family's dense source is not measured here).")  # fmt: skip


def table_state_geometry(x: Inputs) -> Table:
    m = x.seed_means
    frame = m[m.quantity.isin(["state_norm", "clamp_fraction"])].copy()
    wide = frame.pivot_table(index=["family", "key"], columns=["quantity", "variant"],
                             values="mean", aggfunc="first")  # fmt: skip
    wide = wide.reset_index().sort_values(["family", "key"], key=lambda s: s.map(
        lambda v: int(v) if str(v).isdigit() else v))  # fmt: skip
    cols = {"Family": wide["family"], "Layer": wide["key"]}
    for variant in ("latest", "persistent"):
        if ("state_norm", variant) in wide:
            cols[f"‖s‖ {VARIANT_LABEL[variant]}"] = wide[("state_norm", variant)].map(fmt)
    if ("clamp_fraction", "persistent") in wide:
        cols["At clamp P (%)"] = wide[("clamp_fraction", "persistent")].map(
            lambda v: fmt(100 * v, "{:.2f}")
        )
    return _table("table_state_geometry", frame, pd.DataFrame(cols), "State geometry: mean "
                  "‖s_l‖₂ per layer and the share of P coordinates at the clamp (three-seed "
                  "means).")  # fmt: skip


def table8(x: Inputs) -> Table:
    rows = []
    for family in x.config["families"]:
        long = {tuple(p) for p in x.config["probes"]["long_horizon"]}
        for src, tgt in x.config["probes"]["pairs"]:
            rows.append({"family": family, "source": src, "target": tgt, "horizon": tgt - src,
                         "long_horizon": (src, tgt) in long})  # fmt: skip
    frame = pd.DataFrame(rows)
    yes_no = {True: "yes", False: "no"}
    cells = pd.DataFrame({
        "Family": frame.family,
        "Source → target": [f"{a} → {b}" for a, b in zip(frame.source, frame.target, strict=True)],
        "Horizon": frame.horizon.astype(str),
        "Long-horizon endpoint": frame.long_horizon.map(yes_no),
    })  # fmt: skip
    return _table("table8", frame, cells, "Table 8. The frozen probe pairs (toy horizons 2 "
                  "and 4 stand for the paper's 4 and 8).")  # fmt: skip


def _probe_means(x: Inputs) -> pd.DataFrame:
    m = x.seed_means[x.seed_means.quantity == "probe_accuracy"].copy()
    m[["representation", "budget"]] = m.key.str.split("|", expand=True)
    m["budget"] = m.budget.astype(int)
    return m


def table9(x: Inputs) -> Table:
    """Figure 3's numbers: six-pair mean accuracy per budget (P native, LWO native, P
    hidden-r) and P − LWO native with its interval."""
    m = _probe_means(x)
    rows = []
    for (family, budget), g in m.groupby(["family", "budget"]):

        def get(variant, rep, g=g):
            row = g[(g.variant == variant) & (g.representation == rep)]
            return None if row.empty else row.iloc[0]

        d = x.contrast(family, "probe_accuracy", "persistent", "latest", f"native|{budget}")
        rows.append({"family": family, "budget": budget,
                     **{f"{name}_{k}": (None if get(v, r) is None else get(v, r)[k])
                        for name, v, r in (("p_native", "persistent", "native"),
                                           ("lwo_native", "latest", "native"),
                                           ("p_hidden", "persistent", "hidden_r"))
                        for k in ("mean", "low", "high")},
                     **{f"diff_{k}": (None if d is None else d[k])
                        for k in ("mean", "low", "high")},
                     "diff_all_positive": None if d is None else bool(d.all_positive)})  # fmt: skip
    frame = pd.DataFrame(rows)

    def pct(prefix):
        return [interval(*(None if pd.isna(r[f"{prefix}_mean"]) else 100 * r[f"{prefix}_{k}"]
                           for k in ("mean", "low", "high")), spec="{:.1f}")
                for _, r in frame.iterrows()]  # fmt: skip

    cells = pd.DataFrame({"Family": frame.family, "Budget": frame.budget.map("{:,}".format),
                          "P native": pct("p_native"), "LWO native": pct("lwo_native"),
                          "P hidden-r": pct("p_hidden"),
                          "P − LWO native (pp)": pct("diff")})  # fmt: skip
    return _table("table9", frame, cells, "Table 9. Compact access (Figure 3): transition-only, "
                  "sequence-clustered Top-1 accuracy (%), equal-pair mean over all pairs, "
                  "three-seed means [95% t-CI].")  # fmt: skip


def table17(x: Inputs) -> Table:
    """The long-horizon persistence endpoint per seed (paper Table 17)."""
    rows = []
    for family in x.config["families"]:
        p, lwo = (x.mean(family, v, "long_horizon_accuracy") for v in ("persistent", "latest"))
        d = x.contrast(family, "long_horizon_accuracy", "persistent", "latest")
        if p is None or lwo is None:
            continue
        for i, seed in enumerate(x.config["seeds"]):
            rows.append({"family": family, "seed": seed, "persistent": p.per_seed[i],
                         "latest": lwo.per_seed[i],
                         "difference": p.per_seed[i] - lwo.per_seed[i]})  # fmt: skip
        if d is not None:
            rows.append({"family": family, "seed": None, "persistent": p["mean"],
                         "latest": lwo["mean"], "difference": d["mean"], "low": d.low,
                         "high": d.high, "all_positive": bool(d.all_positive)})  # fmt: skip
    frame = pd.DataFrame(rows)
    cells = pd.DataFrame({
        "Family": frame.family,
        "Seed": frame.seed.map(lambda s: "mean" if pd.isna(s) else str(int(s))),
        "P (%)": frame.persistent.map(lambda v: fmt(100 * v, "{:.2f}")),
        "LWO (%)": frame.latest.map(lambda v: fmt(100 * v, "{:.2f}")),
        "P − LWO (pp)": [interval(100 * r.difference, 100 * r.get("low", float("nan")),
                                  100 * r.get("high", float("nan")), "{:+.2f}")
                         for _, r in frame.iterrows()],
    })  # fmt: skip
    return _table(
        "table17",
        frame,
        cells,
        "Table 17. Long-horizon persistence endpoint: native-"
        "state accuracy at the top budget over the long-horizon pairs, per seed.",
    )


def table18(x: Inputs) -> Table:
    """Every representation at the top budget (the supplementary controls, App. B.9)."""
    m = _probe_means(x)
    m = m[m.budget == m.budget.max()]
    cells = pd.DataFrame({"Family": m.family, "Variant": m.variant.map(VARIANT_LABEL),
                          "Representation": m.representation,
                          "Accuracy (%)": [
                              interval(100 * r.mean, 100 * r.low, 100 * r.high, "{:.1f}")
                              for r in m.itertuples()
                          ]})  # fmt: skip
    return _table("table18", m.drop(columns="per_seed"), cells, "Table 18. Every probe "
                  "representation at the top budget (controls are not parameter-matched to the "
                  "state pathway: they measure accessibility).")  # fmt: skip


METHOD_LABEL = {"ledger": "Ledger (absolute c)", "norm": "Largest write norm",
                "recency": "Recency", "gradient": "Gradient×write", "random": "Random",
                "li_variance": "Li variance", "li_boundary": "Li Top-2 boundary"}  # fmt: skip


def table11(x: Inputs) -> Table:
    """Seed-42 (ranking_seed) Persistent rankings against the exhaustive effects, with
    paired sequence-bootstrap intervals (paper Table 11: one checkpoint)."""
    seed = x.config["interventions"]["ranking_seed"]
    r = x.rankings[(x.rankings.variant == "persistent") & (x.rankings.seed == seed)]
    wide = {}
    for row in r.itertuples():
        wide.setdefault((row.family, row.method), {})[row.metric] = interval(
            row.value, row.low, row.high, "{:.3f}"
        )
    cells = pd.DataFrame([{"Family": f, "Method": METHOD_LABEL[m],
                           "Spearman": v.get("spearman", "—"),
                           "Top-source accuracy": v.get("top_source_accuracy", "—"),
                           "Regret": v.get("regret", "—")}
                          for (f, m), v in wide.items()])  # fmt: skip
    n = int(x.rankings.n_targets.max()) if not x.rankings.empty else 0
    return _table("table11", r, cells, f"Table 11. Source rankings of the seed-{seed} "
                  f"Persistent checkpoint against exhaustive suppression ({n} targets; "
                  "sequence-bootstrap 95% intervals; a single checkpoint).")  # fmt: skip


def table12(x: Inputs) -> Table:
    """Ordinary-MoE post-hoc attribution (paper Table 12): every score's ranking metrics
    against the oracle, three-seed means with t-intervals (Li's methods are not compared
    with SA-MoE write effects: other audit objects)."""
    m = x.seed_means[x.seed_means.quantity.str.startswith("ranking_")
                     & (x.seed_means.variant == "ordinary")].copy()  # fmt: skip
    m["metric"] = m.quantity.str.removeprefix("ranking_")
    labels = {**METHOD_LABEL, "gradient": "Gradient×component", "norm": "Largest-component norm"}
    cells = pd.DataFrame({"Family": m.family, "Method": m.key.map(labels), "Metric": m.metric,
                          "Mean [95% t-CI]": [interval(r.mean, r.low, r.high, "{:.3f}")
                                              for r in m.itertuples()]})  # fmt: skip
    return _table("table12", m.drop(columns="per_seed"), cells, "Table 12. Post-hoc "
                  "attribution on the Ordinary MoE: residual components (attention, shared, "
                  "routed per earlier layer) against the oracle, three seeds.")  # fmt: skip


def table12_samoe(x: Inputs) -> Table:
    """The same ranking metrics, three-seed means with t-intervals, both state variants."""
    m = x.seed_means[x.seed_means.quantity.str.startswith("ranking_")
                     & (x.seed_means.variant != "ordinary")].copy()  # fmt: skip
    m["metric"] = m.quantity.str.removeprefix("ranking_")
    cells = pd.DataFrame({"Family": m.family, "Variant": m.variant.map(VARIANT_LABEL),
                          "Method": m.key.map(METHOD_LABEL), "Metric": m.metric,
                          "Mean [95% t-CI]": [interval(r.mean, r.low, r.high, "{:.3f}")
                                              for r in m.itertuples()]})  # fmt: skip
    return _table("table_rankings_seeds", m.drop(columns="per_seed"), cells, "Source rankings "
                  "over the three seeds (SAMOE §14.5 with `ranking_all_seeds`).")  # fmt: skip


def table14(x: Inputs) -> Table:
    """Suppression outcomes of P's ledger-selected and LWO's native source, Eq. 47 and the
    persistence endpoints (paper Table 14, Figure 4)."""
    names = {
        "selected_abs_margin_change": "Target Δm, absolute",
        "selected_jaccard_downstream": "Downstream Top-2 divergence",
        "selected_output_kl": "Output KL (nats)",
        "ledger_advantage": "Ledger-control advantage (Eq. 47)",
    }
    for h in x.config["interventions"]["persistence_horizons"]:
        names[f"persistence_margin_change|{h}"] = f"Δm (absolute), suppressing {h} layers back"
    rows = []
    for family in x.config["families"]:
        for name, label in names.items():
            q, _, k = name.partition("|")
            p, lwo = (x.mean(family, v, q, k) for v in ("persistent", "latest"))
            d = x.contrast(family, q, "persistent", "latest", k)
            rows.append({"family": family, "quantity": name, "label": label,
                         **{f"p_{s}": None if p is None else p[s] for s in ("mean", "low", "high")},
                         **{f"lwo_{s}": None if lwo is None else lwo[s]
                            for s in ("mean", "low", "high")},
                         **{f"diff_{s}": None if d is None else d[s]
                            for s in ("mean", "low", "high")},
                         "diff_per_seed": None if d is None else list(d.per_seed)})  # fmt: skip
    frame = pd.DataFrame(rows)

    def col(prefix):
        return [interval(r[f"{prefix}_mean"], r[f"{prefix}_low"], r[f"{prefix}_high"], "{:.4f}")
                for _, r in frame.iterrows()]  # fmt: skip

    cells = pd.DataFrame(
        {
            "Family": frame.family,
            "Outcome": frame.label,
            "P": col("p"),
            "LWO": col("lwo"),
            "P − LWO": col("diff"),
            "P − LWO per seed": frame.diff_per_seed.map(
                lambda v: "—" if v is None else ", ".join(f"{x:+.4f}" for x in v)
            ),
        }
    )
    return _table("table14", frame, cells, "Table 14. Full-forward suppression of the selected "
                  "source (P: the ledger's top; LWO: its native L − 1): three-seed means, "
                  "95% t-intervals, sequence means first.")  # fmt: skip


def table5(x: Inputs) -> Table:
    r = x.runtime
    cells = pd.DataFrame({"Family": r.family, "Variant": r.variant.map(VARIANT_LABEL),
                          "Measurement": r.measurement, "Batch": r.batch.astype(str),
                          "Median (ms)": r.median_s.map(lambda v: f"{1000 * v:.2f}")})  # fmt: skip
    return _table("table5", r, cells, "Table 5. Runtime medians of full-length passes on this "
                  "machine (descriptive: FLOPs are the cost model).")  # fmt: skip


def table13(x: Inputs) -> Table:
    a = x.audit_cost.copy()
    plain = a[a.phase == "plain_forward"].set_index(["family", "variant", "seed"]).wall_s
    keys = pd.MultiIndex.from_frame(a[["family", "variant", "seed"]])
    a["plain_ratio"] = a.wall_s.to_numpy() / plain.reindex(keys).to_numpy()
    cells = pd.DataFrame({"Family": a.family, "Variant": a.variant.map(VARIANT_LABEL),
                          "Phase": a.phase, "Passes": a.passes.astype(str),
                          "Objects": a.n_objects.astype(str), "Targets": a.n_targets.astype(str),
                          "Retained (KiB)": a.retained_bytes.map(lambda b: f"{b / 1024:.1f}"),
                          "Wall (ms)": a.wall_s.map(lambda v: f"{1000 * v:.2f}"),
                          "× plain forward": a.plain_ratio.map(
                              lambda v: fmt(v, "{:.2f}"))})  # fmt: skip
    return _table("table13", a, cells, "Table 13. Audit-cost pilot: one batch of 8 frozen "
                  "sequences, the 4 targets of the first; objects are source interventions "
                  "(state variants) or residual components (Ordinary); each phase's wall time "
                  "also as a multiple of the same batch's plain forward (no hook), timed in "
                  "the same job.")  # fmt: skip


#: Paper Table 22: the replication scope of each quantity (SAMOE §17).
SCOPE = (
    ("quality (PPL, downstream)", "three seeds, paired t-intervals", "table1, table7"),
    ("local state suppression", "three seeds, t-intervals", "table16, figure2a"),
    ("future-routing probes", "three seeds, t-intervals", "table9, table17, table18, figure3"),
    ("distributed history", "three seeds, t-intervals", "table_history"),
    ("suppression outcomes and Eq. 47", "three seeds, t-intervals", "table14, figure4"),
    ("ordinary-MoE attribution", "three seeds, t-intervals", "table12"),
    ("rankings (Table 11)", "the ranking-seed Persistent checkpoint, sequence bootstrap",
     "table11"),
    ("ledger reconstruction", "every state checkpoint", "table10"),
    ("audit cost, runtime", "the ranking-seed checkpoints, descriptive", "table5, table13"),
    ("state geometry", "three seeds, descriptive", "table_state_geometry"),
)  # fmt: skip


def table22(x: Inputs) -> Table:
    frame = pd.DataFrame(SCOPE, columns=["quantity", "scope", "outputs"])
    cells = frame.rename(columns={"quantity": "Quantity", "scope": "Replication scope",
                                  "outputs": "Outputs"})  # fmt: skip
    return _table("table22", frame, cells, f"Table 22. Scope: seeds {x.config['seeds']} are the "
                  "replication unit; bootstrap draws are not training replicates.")  # fmt: skip


def table6(x: Inputs) -> Table:
    """The downstream protocol (paper Table 6): the toy suite's, or the paper's tasks through
    lm-evaluation-harness (their harness-default splits)."""
    from headgeom.samoe import harness  # torch (~2 s) for one table's metric names
    from headgeom.samoe.downstream import PRIMARY  # torch, as above

    ds = x.config["downstream"]
    rows = []
    for task in ds["tasks"]:
        if task in harness.SPLITS:
            _, n, choices, scoring = harness.SPLITS[task]
            rows.append({"task": task, "metric": harness.PRIMARY[task], "n": n,
                         "choices": choices, "scoring": scoring})  # fmt: skip
            continue
        n = ds["arith"]["n"] if task == "arith" else ds["n_per_task"]
        choices = 4 if task == "arith" else 2
        scoring = "summed log-likelihood of each choice"
        if task == "arith":
            scoring += ", divided by its character length"
        rows.append({"task": task, "metric": PRIMARY.get(task, "acc_norm"), "n": n,
                     "choices": choices, "scoring": scoring})  # fmt: skip
    frame = pd.DataFrame(rows)
    cells = frame.rename(columns=str.capitalize).astype(str)
    caption = (
        "Table 6. Downstream protocol: zero-shot multiple "
        "choice, ties to the lowest index; macro = the mean of the primary metrics."
    )
    if ds.get("run_harness", True) is False:  # offline: the suite is named, not run
        caption += (" Not run in this study (downstream.run_harness: false; lm-evaluation-"
                    "harness reads its datasets from the Hub): quality is perplexity only, "
                    "and Table 7 and Table 1's Δmacro are empty.")  # fmt: skip
    return _table("table6", frame, cells, caption)


TABLES: dict[str, Callable[[Inputs], Table]] = {
    "table1": table1,
    "table2": lambda x: config_table("table2", x.config["moe"], "Table 2. MoE configuration."),
    "table3": lambda x: config_table(
        "table3", x.config["cpt"], "Table 3. Continued-pretraining configuration."
    ),  # fmt: skip
    "table4": table4,
    "table5": table5,
    "table6": table6,
    "table7": table7,
    "table10": table10,
    "table8": table8,
    "table9": table9,
    "table11": table11,
    "table12": table12,
    "table13": table13,
    "table14": table14,
    "table16": table16,
    "table17": table17,
    "table18": table18,
    "table22": table22,
    "table_history": table_history,
    "table_history_pool": table_history_pool,
    "table_quality_dense": table_quality_dense,
    "table_step0": table_step0,
    "table_rankings_seeds": table12_samoe,
    "table_state_geometry": table_state_geometry,
}


# --------------------------------------------------------------------------- figures
def figure1(x: Inputs):
    """Toy Figure 1: the waterfall of c_{l→L} of one target (P, first seed, first target)."""
    h = x.history[x.history.variant == "persistent"]
    if h.empty:
        h = x.history
    seed = sorted(h.seed.unique())[0]
    target = h[h.seed == seed].iloc[0]
    c = list(target.contributions)
    frame = pd.DataFrame({"source_layer": range(len(c)), "contribution": c,
                          "cumulative": pd.Series(c).cumsum()})  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = frame.cumulative - frame.contribution
    ax.bar(frame.source_layer, frame.contribution, bottom=bottom,
           color=["#d62728" if v >= 0 else "#1f77b4" for v in frame.contribution])  # fmt: skip
    ax.axhline(target.state_term, color="k", ls="--", lw=1, label=r"$\omega^\top s_L$ (state term)")
    ax.set_xlabel("source layer l")
    ax.set_ylabel(r"cumulative $c_{\ell \to L}$")
    ax.set_title(f"Routing ledger of {target.seq_id} t={target.position}, L={target.layer} "
                 f"({VARIANT_LABEL[target.variant]}, seed {seed})", fontsize=9)  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, frame.assign(
        seq_id=target.seq_id,
        position=int(target.position),
        layer=int(target.layer),
        variant=target.variant,
        seed=int(seed),
    )


def figure2a(x: Inputs):
    """Set-change rate against λ, P and LWO (paper Fig. 2a)."""
    m = x.seed_means
    frame = m[m.quantity == "set_change_rate"].assign(lam=lambda d: d.key.astype(float))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for variant, g in frame.groupby("variant"):
        g = g.sort_values("lam")
        ax.errorbar(g.lam, 100 * g["mean"], yerr=[100 * (g["mean"] - g.low),
                    100 * (g.high - g["mean"])], marker="o", capsize=3,
                    color=COLOURS[variant], label=VARIANT_LABEL[variant])  # fmt: skip
    ax.set_xlabel("λ (state term scale at one router)")
    ax.set_ylabel("Top-2 set-change rate (%)")
    ax.invert_xaxis()
    ax.legend()
    fig.tight_layout()
    return fig, frame.drop(columns="per_seed")


def figure2b(x: Inputs):
    """P − LWO per seed: the long-horizon accessibility endpoint (pp) (paper Fig. 2b)."""
    rows = []
    for family in x.config["families"]:
        d = x.contrast(family, "long_horizon_accuracy", "persistent", "latest")
        if d is None:
            continue
        for seed, v in zip(x.config["seeds"], d.per_seed, strict=True):
            rows.append({"family": family, "endpoint": "long-horizon accessibility (pp)",
                         "seed": seed, "difference": 100 * v, "mean": 100 * d["mean"],
                         "low": 100 * d.low, "high": 100 * d.high})  # fmt: skip
        for h in x.config["interventions"]["persistence_horizons"]:
            e = x.contrast(family, "persistence_margin_change", "persistent", "latest", str(h))
            if e is None:
                continue
            for seed, v in zip(x.config["seeds"], e.per_seed, strict=True):
                rows.append({"family": family, "endpoint": f"abs Δm, {h} layers back",
                             "seed": seed, "difference": v, "mean": e["mean"], "low": e.low,
                             "high": e.high})  # fmt: skip
    frame = pd.DataFrame(rows)
    endpoints = list(dict.fromkeys(frame.endpoint))
    fig, axes = plt.subplots(1, len(endpoints), figsize=(3.2 * len(endpoints), 3.5),
                             squeeze=False)  # fmt: skip
    for ax, endpoint in zip(axes[0], endpoints, strict=True):
        g = frame[frame.endpoint == endpoint]
        ax.scatter([0] * len(g), g.difference, color="#d62728", zorder=3, label="seeds")
        m = g.iloc[0]
        ax.errorbar([0.2], [m["mean"]], yerr=[[m["mean"] - m.low], [m.high - m["mean"]]],
                    fmt="s", color="k", capsize=4, label="mean, 95% t-CI")  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlim(-0.5, 0.7)
        ax.set_xticks([])
        ax.set_title(endpoint, fontsize=9)
        ax.set_ylabel("P − LWO")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig, frame


def figure3(x: Inputs):
    """Accuracy against budget: P native, LWO native, P hidden-r (paper Fig. 3)."""
    m = _probe_means(x)
    lines = (("persistent", "native", "P native", "#d62728", "-"),
             ("latest", "native", "LWO native", "#1f77b4", "-"),
             ("persistent", "hidden_r", "P hidden-r", "#d62728", "--"))  # fmt: skip
    keep = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for variant, rep, label, colour, style in lines:
        g = m[(m.variant == variant) & (m.representation == rep)].sort_values("budget")
        if g.empty:
            continue
        keep.append(g.assign(line=label))
        ax.errorbar(g.budget, 100 * g["mean"], yerr=[100 * (g["mean"] - g.low),
                    100 * (g.high - g["mean"])], marker="o", capsize=3, color=colour,
                    ls=style, label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("training examples (budget)")
    ax.set_ylabel("Top-1 accuracy, transition-only (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, pd.concat(keep).drop(columns="per_seed")


def figure4(x: Inputs):
    """|Δm|, downstream Jaccard and output KL of the selected source, P and LWO, with the
    per-seed P − LWO (paper Fig. 4)."""
    outcomes = {
        "selected_abs_margin_change": "target |Δm|",
        "selected_jaccard_downstream": "downstream Top-2 divergence",
        "selected_output_kl": "output KL (nats)",
    }
    rows = []
    for family in x.config["families"]:
        for q, label in outcomes.items():
            for v in ("persistent", "latest"):
                m = x.mean(family, v, q)
                if m is not None:
                    rows.append({"family": family, "outcome": label, "variant": v,
                                 "mean": m["mean"], "low": m.low, "high": m.high,
                                 "per_seed": list(m.per_seed)})  # fmt: skip
    frame = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(outcomes), figsize=(10, 3.3))
    for ax, label in zip(axes, outcomes.values(), strict=True):
        g = frame[frame.outcome == label]
        for i, r in enumerate(g.itertuples()):
            ax.bar(i, r.mean, color=COLOURS[r.variant], yerr=[[r.mean - r.low], [r.high - r.mean]],
                   capsize=4)  # fmt: skip
            ax.scatter([i] * len(r.per_seed), r.per_seed, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(g)), [VARIANT_LABEL[v] for v in g.variant])
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    return fig, frame


FIGURES = {"figure1": figure1, "figure2a": figure2a, "figure2b": figure2b, "figure3": figure3,
           "figure4": figure4}  # fmt: skip


# --------------------------------------------------------------------------- comparison
#: Why a compared row can differ at toy scale (printed where the direction does not agree).
NOTES = {
    "active_params_overhead": "the toy's state is r/d = 0.25 of a tiny model (d = 64, FFN 128): "
    "the router's state block and the write head weigh more than at d = 576/640",
}


def comparison(x: Inputs, references: Mapping) -> pd.DataFrame:
    """SAMOE §22 beside this run, one row per compared quantity and family: the paper's
    numbers (SmolLM2, Gemma), ours, and whether the direction agrees."""
    rows = []

    def row(family, name, ours, expected, agrees, note=""):
        rows.append({"family": family, "quantity": name,
                     "paper_smollm2": references[name]["smollm2"],
                     "paper_gemma": references[name]["gemma"], "ours": ours,
                     "expected_direction": expected, "agrees": agrees,
                     "note": NOTES.get(name, "") if agrees is False else note})  # fmt: skip

    bounds = x.config["noninferiority"]
    for family in x.counts.family.unique():
        counts = x.counts[x.counts.family == family].set_index("variant")
        if "persistent" in counts.index:
            rel = counts.loc["persistent", "active_rel"]
            row(family, "active_params_overhead", f"{100 * rel:+.2f}%",
                "< 1% extra active parameters", bool(rel < 0.01))  # fmt: skip
        ppl = x.contrast(family, "ppl", "persistent", "ordinary")
        if ppl is not None:
            text = interval(*(100 * ppl[k] for k in ("mean", "low", "high")), spec="{:+.2f}")
            row(family, "ppl_rel_persistent", f"{text} %", "PPL ratio inside the +1% bound",
                bool(ppl.high < bounds["ppl_rel"]))  # fmt: skip
        macro = x.contrast(family, "macro", "persistent", "ordinary")
        if macro is not None:
            text = interval(macro["mean"], macro.low, macro.high, "{:+.2f}")
            row(family, "macro_pp_persistent", f"{text} pp", "Δmacro above −1 pp",
                bool(macro.low > -bounds["macro_pp"]))  # fmt: skip
        p0, l0 = (x.mean(family, v, "set_change_rate", "0") for v in ("persistent", "latest"))
        if p0 is not None and l0 is not None:
            row(family, "state_use_lambda0",
                f"P {100 * p0['mean']:.1f}%, LWO {100 * l0['mean']:.1f}%", "P set-change > LWO",
                bool(p0["mean"] > l0["mean"]))  # fmt: skip
        nr = x.mean(family, "persistent", "non_recent")
        if nr is not None:
            text = interval(*(100 * nr[k] for k in ("mean", "low", "high")), spec="{:.1f}")
            row(family, "non_recent_share", f"{text}%", "> 50%", bool(nr["mean"] > 0.5))
        lh = x.contrast(family, "long_horizon_accuracy", "persistent", "latest")
        if lh is not None:
            text = interval(*(100 * lh[k] for k in ("mean", "low", "high")), spec="{:+.1f}")
            row(
                family,
                "long_horizon_p_minus_lwo",
                f"{text} pp",
                "P − LWO > 0",
                bool(lh["mean"] > 0),
                "" if lh.all_positive else "not every seed positive",
            )
        top = x.probes.budget.max() if not x.probes.empty else None
        compact = x.contrast(family, "probe_accuracy", "persistent", "latest", f"native|{top}")
        if compact is not None:
            text = interval(*(100 * compact[k] for k in ("mean", "low", "high")), spec="{:+.1f}")
            row(
                family,
                "compact_access_p_minus_lwo",
                f"{text} pp",
                "P − LWO > 0",
                bool(compact["mean"] > 0),
            )
        hid, nat = (x.mean(family, "persistent", "probe_accuracy", f"{r}|{top}")
                    for r in ("hidden_r", "native"))  # fmt: skip
        if hid is not None and nat is not None:
            row(family, "hidden_vs_native", f"P hidden-r {100 * hid['mean']:.1f}%, P native "
                f"{100 * nat['mean']:.1f}%", "hidden-r ≥ P native at the top budget",
                bool(hid["mean"] >= nat["mean"]))  # fmt: skip
        seed = x.config["interventions"]["ranking_seed"]
        r = x.rankings[(x.rankings.family == family) & (x.rankings.variant == "persistent")
                       & (x.rankings.seed == seed) & (x.rankings.metric == "spearman")]  # fmt: skip
        rho = r.set_index("method").value
        if {"gradient", "ledger", "norm"} <= set(rho.index):
            row(family, "ranking_spearman_seed42",
                f"ledger {rho['ledger']:.3f}, norm {rho['norm']:.3f}, gradient×write "
                f"{rho['gradient']:.3f}", "gradient×write > ledger > norm",
                bool(rho["gradient"] > rho["ledger"] > rho["norm"]))  # fmt: skip
        li_rho, g_rho = (x.mean(family, "ordinary", "ranking_spearman", k)
                         for k in ("li_variance", "gradient"))  # fmt: skip
        if li_rho is not None and g_rho is not None:
            li_text = interval(li_rho["mean"], li_rho.low, li_rho.high, "{:.3f}")
            g_text = interval(g_rho["mean"], g_rho.low, g_rho.high, "{:.3f}")
            row(family, "ordinary_li_spearman", f"Li {li_text}, gradient×component {g_text}",
                "gradient×component > Li", bool(g_rho["mean"] > li_rho["mean"]))  # fmt: skip
        k14 = x.checks[(x.checks.family == family) & x.checks.check.str.startswith("K14")]
        if not k14.empty:
            worst = k14.groupby("check").residual.max()
            text = ", ".join(f"{c.split('.')[-1]} {v:.2e}" for c, v in worst.items())
            row(family, "li_reconstruction", text, "≤ 1e-5", bool(worst.max() <= 1e-5))
        adv = x.mean(family, "persistent", "ledger_advantage")
        if adv is not None:
            row(family, "ledger_control_advantage_p",
                interval(adv["mean"], adv.low, adv.high, "{:.3f}"), "P advantage > 0",
                bool(adv["mean"] > 0))  # fmt: skip
        cons = [
            x.mean(family, "persistent", q)
            for q in (
                "selected_abs_margin_change",
                "selected_jaccard_downstream",
                "selected_output_kl",
            )
        ]
        if all(c is not None for c in cons):
            row(
                family,
                "consequences_p",
                f"abs Δm {cons[0]['mean']:.3f}, Top-2 divergence "
                f"{cons[1]['mean']:.3f}, KL {cons[2]['mean']:.4f}",
                "descriptive",
                None,
            )
        described = (("ess", "ess", 1, "{:.2f}"),
                     ("largest_source_share", "max_share", 100, "{:.1f}"),
                     ("signed_state_term", "signed_state_term", 1, "{:.3f}"))  # fmt: skip
        for name, quantity, scale, spec in described:
            m = x.mean(family, "persistent", quantity)
            if m is not None:
                text = interval(*(scale * m[k] for k in ("mean", "low", "high")), spec=spec)
                row(family, name, text + ("%" if scale == 100 else ""), "descriptive", None)
        pilot = x.audit_cost[(x.audit_cost.family == family) & (x.audit_cost.phase == "capture")]
        n_pilot = int(pilot.n_targets.max()) if not pilot.empty else 0
        pilot = pilot.set_index("variant").n_objects
        if {"persistent", "ordinary"} <= set(pilot.index):
            row(family, "audit_pilot_counts", f"{pilot['persistent']} source interventions, "
                f"{pilot['ordinary']} components over {n_pilot} targets",
                "3 components per source",
                bool(pilot["ordinary"] == 3 * pilot["persistent"]))  # fmt: skip
        k6 = x.checks[(x.checks.family == family) & (x.checks.check == "K6")]
        if not k6.empty:
            worst = k6.residual.max()
            row(family, "ledger_reconstruction", f"max {worst:.2e}", "< 1e-5 (tolerance 1e-4)",
                bool(worst < 1e-5))  # fmt: skip
    return pd.DataFrame(rows)
