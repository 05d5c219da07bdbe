"""Small synthetic edit-atlas result tables for the atlas page's tests, written as the atlas
stages write them (the column names and types of ATLAS_SCHEMA.md, spelled out here, not
taken from the page's code): one model of :data:`N_LAYER` layers over :data:`CORPORA` (plus
"mean" rows) and, optionally, one pair of checkpoints whose probes switch answers at known α.

Values are random but built so the tests can see them: every KL has four decimals in
[0.1, 1) (what a chart's tooltip shows is then the number itself), and each probe's answer
changes exactly at :data:`SWITCH_AT`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom.io import write_parquet

MODEL = "tiny-lm"
PAIR = "base-vs-tuned"
N_LAYER = 4
CORPORA = ("en", "code", "de")
SKILLS = ("sva", "quote")
ALPHAS = (-0.25, 0.0, 0.25, 0.4, 0.5, 0.75, 1.0, 1.25, 1.5)
#: probe -> (expected, the α from which the model answers it, the answer before)
SWITCH_AT = {"chat-1": ("<turn|>", 0.4, "the"), "chat-2": ("Paris", 0.75, "London")}

_S, _I, _F, _B = pa.string(), pa.int64(), pa.float64(), pa.bool_()
_EDIT_KEY = [("edit", _S), ("scope", _S), ("layer", _I), ("block", _S)]
_ENDS = [("kl_to_a", _F), ("kl_to_b", _F), ("retention", _F)]
SCHEMAS = {
    "profile": [("model", _S), ("layer", _I), ("block", _S), ("write_size", _F),
                ("constant_part", _F), ("volume_knob", _F), ("old_state_carried", _F)],
    "edits": [("model", _S), *_EDIT_KEY, ("corpus", _S), ("kl", _F), ("delta_top1", _F),
              ("n_tokens", _I)],
    "retention": [("model", _S), *_EDIT_KEY, ("skill", _S), ("n_items", _I), ("retained", _I),
                  ("retention", _F)],
    "compression": [("model", _S), ("method", _S), ("group", _S), ("setting", _S),
                    ("bytes", _I), ("bytes_original", _I), ("corpus", _S), ("kl", _F),
                    ("delta_top1", _F), ("retention", _F)],
    "blend": [("pair", _S), ("alpha", _F), ("corpus", _S), *_ENDS],
    "probes": [("pair", _S), ("alpha", _F), ("probe", _S), ("prompt", _S), ("answer", _S),
               ("expected", _S), ("correct", _B), ("lead", _F)],
    "grafts": [("pair", _S), ("direction", _S), ("group", _S), ("layer", _I), ("part", _S),
               ("corpus", _S), *_ENDS],
    "drift": [("pair", _S), ("tensor", _S), ("group", _S), ("layer", _I), ("drift", _F)],
    "lowrank": [("pair", _S), ("mode", _S), ("k", _I), ("corpus", _S), *_ENDS],
}  # fmt: skip
MODEL_TABLES = ("profile", "edits", "retention", "compression")
PAIR_TABLES = ("blend", "probes", "grafts", "drift", "lowrank")


def _kl(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(rng.uniform(0.1, 0.9999, size=n), 4)


def _per_corpus(keys: pd.DataFrame, rng, columns) -> pd.DataFrame:
    """``keys`` × (each corpus, then "mean": the mean of the corpora's values, four
    decimals), with ``columns`` ({name: draw(n)}) drawn per corpus."""
    parts = [keys.assign(corpus=c, **{k: f(len(keys)) for k, f in columns.items()})
             for c in CORPORA]  # fmt: skip
    mean = keys.assign(corpus="mean")
    for k in columns:
        mean[k] = np.round(np.mean([p[k].to_numpy() for p in parts], axis=0), 4)
    return pd.concat([*parts, mean], ignore_index=True)


def model_tables(rng: np.random.Generator, ple: bool, volume_knob: bool) -> dict:
    blocks = ["attn", "mlp", *(["ple"] if ple else [])]
    layers = range(N_LAYER)
    carried = rng.uniform(0.3, 1.0, size=N_LAYER)
    profile = pd.DataFrame(
        [(MODEL, la, b) for la in layers for b in blocks], columns=["model", "layer", "block"]
    )
    n = len(profile)
    profile["write_size"] = rng.lognormal(0.0, 1.0, size=n)
    profile["constant_part"] = rng.uniform(0.0, 1.0, size=n)
    profile["volume_knob"] = rng.uniform(0.5, 3.0, size=n) if volume_knob else None
    profile["old_state_carried"] = carried[profile["layer"].to_numpy()]
    keys = [("zero", "block", la, b) for la in layers for b in blocks]
    keys += [("average", "block", la, b) for la in layers for b in blocks]
    keys += [("rows_mean", "block", la, "ple") for la in layers if ple]
    keys += [("rows_mean", "block", -1, "embedding")]
    keys += [("skip", "block", la, "layer") for la in layers]
    keys += [(e, "everywhere", -1, b) for e in ("zero", "average") for b in ("attn", "mlp")]
    keys = pd.DataFrame(keys, columns=["edit", "scope", "layer", "block"]).assign(model=MODEL)
    edits = _per_corpus(
        keys, rng, {"kl": lambda n: _kl(rng, n), "delta_top1": lambda n: rng.normal(0, 5, n)}
    )
    edits["n_tokens"] = 4096
    retention = []
    for skill in SKILLS:
        part = keys.assign(skill=skill, n_items=20, retained=rng.integers(0, 21, len(keys)))
        retention.append(part.assign(retention=part["retained"] / part["n_items"]))
    mean = keys.assign(skill="mean", n_items=40)
    mean["retained"] = sum(r["retained"].to_numpy() for r in retention)
    mean["retention"] = np.mean([r["retention"].to_numpy() for r in retention], axis=0)
    retention = pd.concat([*retention, mean], ignore_index=True)
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
    comp = pd.DataFrame(rows, columns=["method", "group", "setting", "bytes"]).assign(model=MODEL)
    comp["bytes_original"] = 4_000_000
    comp = _per_corpus(
        comp, rng, {"kl": lambda n: _kl(rng, n), "delta_top1": lambda n: rng.normal(0, 2, n),
                    "retention": lambda n: rng.uniform(0.8, 1.0, n)},
    )  # fmt: skip
    return {"profile": profile, "edits": edits, "retention": retention, "compression": comp}


def pair_tables(rng: np.random.Generator) -> dict:
    ends = {"kl_to_a": lambda n: _kl(rng, n), "kl_to_b": lambda n: _kl(rng, n),
            "retention": lambda n: rng.uniform(0.5, 1.0, n)}  # fmt: skip
    blend = _per_corpus(pd.DataFrame({"pair": PAIR, "alpha": ALPHAS}), rng, ends)
    probes = pd.DataFrame(
        [
            (PAIR, a, probe, f"prompt of {probe}", expected if a >= at else before, expected)
            for probe, (expected, at, before) in SWITCH_AT.items()
            for a in ALPHAS
        ],
        columns=["pair", "alpha", "probe", "prompt", "answer", "expected"],
    )
    probes["correct"] = probes["answer"] == probes["expected"]
    probes["lead"] = rng.normal(0, 2, len(probes))
    grafts = [
        (d, g, -1, "group")
        for d in ("b_into_a", "a_into_b")
        for g in ("embedding", "attention", "mlp")
    ]
    grafts += [("b_into_a", "norms", la, p) for la in range(N_LAYER) for p in ("norms", "linear")]
    grafts = pd.DataFrame(grafts, columns=["direction", "group", "layer", "part"]).assign(pair=PAIR)
    grafts = _per_corpus(grafts, rng, ends)
    tensors = [(f"model.layers.{la}.{t}", g, la) for la in range(N_LAYER) for t, g in
               (("self_attn.q_proj.weight", "attention"), ("self_attn.o_proj.weight", "attention"),
                ("mlp.down_proj.weight", "mlp"), ("input_layernorm.weight", "norms"))]  # fmt: skip
    tensors += [("model.embed_tokens.weight", "embedding", -1), ("model.norm.weight", "norms", -1)]
    drift = pd.DataFrame(tensors, columns=["tensor", "group", "layer"]).assign(pair=PAIR)
    drift["drift"] = rng.uniform(0.0, 0.4, len(drift))
    lowrank = pd.DataFrame(
        [(m, k) for m in ("top", "random", "fraction", "minus_top") for k in (1, 4, 16)],
        columns=["mode", "k"],
    ).assign(pair=PAIR)
    lowrank = _per_corpus(lowrank, rng, ends)
    return {"blend": blend, "probes": probes, "grafts": grafts, "drift": drift, "lowrank": lowrank}


def write(path: Path, table: str, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(SCHEMAS[table])
    write_parquet(path, frame[[n for n in schema.names if n in frame]], _subset(schema, frame))


def _subset(schema: pa.Schema, frame: pd.DataFrame) -> pa.Schema:
    """The schema's fields that ``frame`` has (a malformed table lacks one on purpose)."""
    return pa.schema([f for f in schema if f.name in frame])


def write_atlas(
    root: Path,
    seed: int = 0,
    ple: bool = True,
    volume_knob: bool = True,
    pair: bool = True,
    skip: tuple[str, ...] = (),
) -> dict[tuple[str, str | None], pd.DataFrame]:
    """Write the synthetic atlas under ``root`` (``<root>/<MODEL>/<table>.parquet``,
    ``<root>/pairs/<PAIR>/<table>.parquet``), leaving out the tables named in ``skip``;
    the frames written, by (table, pair or None)."""
    rng = np.random.default_rng(seed)
    written = {}
    for table, frame in model_tables(rng, ple, volume_knob).items():
        if table not in skip:
            write(root / MODEL / f"{table}.parquet", table, frame)
            written[(table, None)] = frame
    if pair:
        for table, frame in pair_tables(rng).items():
            if table not in skip:
                write(root / "pairs" / PAIR / f"{table}.parquet", table, frame)
                written[(table, PAIR)] = frame
    return written
