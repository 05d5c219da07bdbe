"""Small synthetic edit-atlas result tables for the atlas page's tests, written as the atlas
stages write them: the results contract's tables (profile, effects, retention, summary,
compression, and a pair's blend, probes, grafts, drift and low-rank tables) through their
:class:`headgeom.results.ResultTable` (headgeom.atlas.results), at the workflow's paths
(headgeom.atlas.paths.TEMPLATES) under a study's results folder. One model of
:data:`N_LAYER` layers over :data:`CORPORA` and, optionally, one pair of checkpoints whose
probes switch answers at known α.

Values are random but built so the tests can see them: every KL, and every mean over the
corpora in the summary, has four decimals in [0.1, 1) (what a chart's tooltip shows is then
the number itself), and each probe's answer changes exactly at :data:`SWITCH_AT`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom.atlas import results
from headgeom.atlas.edits import Edit
from headgeom.atlas.paths import TEMPLATES
from headgeom.io import write_parquet

MODEL = "tiny-lm"
PAIR = "base-vs-tuned"
N_LAYER = 4
CORPORA = ("en", "code", "de")
SKILLS = ("sva", "quote")
ALPHAS = (-0.25, 0.0, 0.25, 0.4, 0.5, 0.75, 1.0, 1.25, 1.5)
#: probe -> (expected, the α from which the model answers it, the answer before)
SWITCH_AT = {"chat-1": ("<turn|>", 0.4, "the"), "chat-2": ("Paris", 0.75, "London")}
MODEL_TABLES = ("profile", "effects", "retention", "summary", "compression")
PAIR_TABLES = tuple(results.PAIR_TABLES)
#: the results contract's tables: the model's, then a pair's
CONTRACT = {"profile": results.PROFILE, "effects": results.EFFECTS,
            "retention": results.RETENTION, "summary": results.SUMMARY,
            "compression": results.COMPRESSION, **results.PAIR_TABLES}  # fmt: skip
SCHEMAS = {t: c.schema for t, c in CONTRACT.items()}
FILES = {t: TEMPLATES[t] for t in MODEL_TABLES}


def model_paths(root: Path) -> dict[str, Path]:
    """Each model table's file under the results folder ``root``."""
    return {t: root / FILES[t] for t in MODEL_TABLES}


def pairs(root: Path) -> dict[str, Path]:
    """The pair's folder under ``root``."""
    return {PAIR: root / "atlas" / "pairs" / PAIR}


def everywhere(layer: int, target: str) -> bool:
    """Every layer at once: layer -1 of any target but the token embedding (no layer)."""
    return layer < 0 and target != "embed"


def _kl(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(rng.uniform(0.1, 0.9999, size=n), 4)


def _per_corpus(keys: pd.DataFrame, rng, columns) -> pd.DataFrame:
    """``keys`` × each corpus, with ``columns`` ({name: draw(n)}) drawn per corpus."""
    return pd.concat(
        [keys.assign(corpus=c, **{k: f(len(keys)) for k, f in columns.items()}) for c in CORPORA],
        ignore_index=True,
    )


def _with_mean(keys: pd.DataFrame, rng, columns) -> pd.DataFrame:
    """:func:`_per_corpus` and a "mean" corpus: the mean of the corpora's values."""
    parts = _per_corpus(keys, rng, columns)
    mean = parts.groupby(list(keys.columns), sort=False, dropna=False)[list(columns)].mean()
    mean = mean.reset_index()
    return pd.concat([parts, mean.assign(corpus="mean").round(4)], ignore_index=True)


def _edits(ple: bool) -> pd.DataFrame:
    """Every edit of a model with (``ple``) or without a PLE branch, as atlas_edits lists
    them: each kind's targets layer by layer, then in every layer at once (layer -1)."""
    targets = {"zero": ["attn", "mlp", *(["ple"] if ple else [])],
               "average": ["attn", "mlp", *(["ple"] if ple else [])],
               "rows_mean": ["embed", *(["ple"] if ple else [])], "skip": ["layer"]}  # fmt: skip
    edits = []
    for kind, names in targets.items():
        for target in names:
            if target == "embed":
                edits.append(Edit(kind, target))
                continue
            edits += [Edit(kind, target, la) for la in range(N_LAYER)] + [Edit(kind, target)]
    return pd.DataFrame(
        [(e.label, e.kind, e.target, -1 if e.layer is None else e.layer) for e in edits],
        columns=["edit", "kind", "target", "layer"],
    )


def model_tables(rng: np.random.Generator, ple: bool, volume_knob: bool) -> dict:
    blocks = ["attn", "mlp", *(["ple"] if ple else [])]
    carried = rng.uniform(0.3, 1.0, size=N_LAYER)
    profile = pd.DataFrame(
        [(la, b, f"L{la}.{b}") for la in range(N_LAYER) for b in blocks],
        columns=["layer", "block", "label"],
    )
    n = len(profile)
    profile["write_size"] = rng.lognormal(0.0, 1.0, size=n)
    profile["constant_part"] = rng.uniform(0.0, 1.0, size=n)
    profile["knob_rms"] = rng.uniform(0.5, 3.0, size=n) if volume_knob else np.nan
    profile["old_state_carried"] = carried[profile["layer"].to_numpy()]
    keys = _edits(ple)
    effects = _per_corpus(
        keys, rng, {"kl": lambda n: _kl(rng, n), "delta_top1": lambda n: rng.normal(0, 5, n)}
    )
    effects["top1_base"] = 0.5
    effects["n_positions"] = 4096
    summary = (
        effects.groupby(["edit", "kind", "target", "layer"], sort=False)[["kl", "delta_top1"]]
        .mean()
        .reset_index()
    )
    summary["kl"] = summary["kl"].round(4)  # four decimals, as every KL here (the tooltips)
    retention = []
    for skill in SKILLS:
        kept = rng.integers(0, 21, len(keys))
        retention.append(keys.assign(skill=skill, n_items=24, n_base_correct=20, n_kept=kept,
                                     retention=kept / 20))  # fmt: skip
    summary["mean_retention"] = np.mean([r["retention"].to_numpy() for r in retention], axis=0)
    retention = pd.concat(retention, ignore_index=True)
    rows = [("original", "all", "bf16", 4_000_000)]
    for group, size in [("embedding", 1_000_000), ("attention", 1_200_000), ("mlp", 1_800_000),
                        *([("ple_table", 2_000_000)] if ple else [])]:  # fmt: skip
        rows += [(m, group, "group 64", size * bits // 16) for m, bits in
                 (("int8", 8), ("int4", 4), ("int2", 2))]  # fmt: skip
    rows += [("low_rank", "embedding", f"k={k}", 1_000 * k) for k in (8, 32)]
    rows += [
        ("prune", "embedding", "N=1000", 300_000),
        ("mixed", "all", "int4, int8 on 1", 1_500_000),
    ]
    comp = pd.DataFrame(rows, columns=["method", "group", "setting", "bytes"])
    comp["bytes_original"] = 4_000_000
    comp = _with_mean(
        comp, rng, {"kl": lambda n: _kl(rng, n), "delta_top1": lambda n: rng.normal(0, 2, n),
                    "retention": lambda n: rng.uniform(0.8, 1.0, n)},
    )  # fmt: skip
    return {"profile": profile, "effects": effects, "retention": retention, "summary": summary,
            "compression": comp}  # fmt: skip


def pair_tables(rng: np.random.Generator) -> dict:
    ends = {"kl_to_a": lambda n: _kl(rng, n), "kl_to_b": lambda n: _kl(rng, n),
            "top1": lambda n: rng.uniform(0.3, 0.6, n),
            "retention": lambda n: rng.uniform(0.5, 1.0, n),
            "accuracy": lambda n: rng.uniform(0.5, 1.0, n)}  # fmt: skip
    blend = _with_mean(pd.DataFrame({"pair": PAIR, "alpha": ALPHAS}), rng, ends)
    probes = pd.DataFrame(
        [
            (PAIR, a, "chat", item, probe, f"prompt of {probe}",
             expected if a >= at else before, expected)
            for item, (probe, (expected, at, before)) in enumerate(SWITCH_AT.items())
            for a in ALPHAS
        ],
        columns=["pair", "alpha", "skill", "item", "probe", "prompt", "answer", "expected"],
    )  # fmt: skip
    probes["correct"] = probes["answer"] == probes["expected"]
    probes["lead"] = rng.normal(0, 2, len(probes))
    grafts = [
        (d, g, -1, "group")
        for d in ("b_into_a", "a_into_b")
        for g in ("embedding", "attention", "mlp")
    ]
    grafts += [("b_into_a", "norms", la, p) for la in range(N_LAYER) for p in ("norms", "linear")]
    grafts = pd.DataFrame(grafts, columns=["direction", "group", "layer", "part"])
    grafts = grafts.assign(pair=PAIR, n_tensors=3)
    grafts = _with_mean(grafts, rng, ends)
    tensors = [(f"model.layers.{la}.{t}", g, k, la) for la in range(N_LAYER) for t, g, k in
               (("self_attn.q_proj.weight", "attention", "linear"),
                ("self_attn.o_proj.weight", "attention", "linear"),
                ("mlp.down_proj.weight", "mlp", "linear"),
                ("input_layernorm.weight", "norms", "norm"))]  # fmt: skip
    tensors += [("model.embed_tokens.weight", "embedding", "table", -1),
                ("model.norm.weight", "norms", "norm", -1)]  # fmt: skip
    drift = pd.DataFrame(tensors, columns=["tensor", "group", "kind", "layer"]).assign(pair=PAIR)
    drift["norm_a"] = rng.uniform(1.0, 5.0, len(drift))
    drift["drift"] = rng.uniform(0.0, 0.4, len(drift))
    drift["norm_delta"] = drift["drift"] * drift["norm_a"]
    modes = [(m, k, None) for m in ("top", "random", "minus_top") for k in (1, 4, 16)]
    modes += [("fraction", None, f) for f in (0.25, 0.5)]
    lowrank = pd.DataFrame(modes, columns=["mode", "k", "fraction"]).assign(pair=PAIR)
    lowrank["k"] = lowrank["k"].astype("Int64")  # null for the fractions
    lowrank["delta_share"] = rng.uniform(0.0, 1.0, len(lowrank))
    lowrank = _with_mean(lowrank, rng, ends)
    return {"blend": blend, "probes": probes, "grafts": grafts, "drift": drift, "lowrank": lowrank}


def write(path: Path, table: str, frame: pd.DataFrame) -> None:
    """Write ``frame`` as the atlas does: a contract table through its ResultTable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    CONTRACT[table].write(path, frame)


def write_malformed(path: Path, table: str, frame: pd.DataFrame) -> None:
    """Write ``frame`` with the schema's columns it has (a column left out on purpose)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([f for f in SCHEMAS[table] if f.name in frame])
    write_parquet(path, frame[schema.names], schema)


def write_atlas(
    root: Path,
    seed: int = 0,
    ple: bool = True,
    volume_knob: bool = True,
    pair: bool = True,
    skip: tuple[str, ...] = (),
) -> dict[tuple[str, str | None], pd.DataFrame]:
    """Write the synthetic atlas under the results folder ``root`` (:func:`model_paths`,
    :func:`pairs`), leaving out the tables named in ``skip``; the frames written, by (table,
    pair or None)."""
    rng = np.random.default_rng(seed)
    written = {}
    paths = model_paths(root)
    for table, frame in model_tables(rng, ple, volume_knob).items():
        if table not in skip:
            write(paths[table], table, frame)
            written[(table, None)] = frame
    if pair:
        for table, frame in pair_tables(rng).items():
            if table not in skip:
                write(pairs(root)[PAIR] / f"{table}.parquet", table, frame)
                written[(table, PAIR)] = frame
    return written
