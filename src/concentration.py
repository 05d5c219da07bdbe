"""Concentration of head-patching effects per split (METHODS §10.1–10.3).

    python src/concentration.py --effects effects.parquet \\
        --out-summary summary.parquet --out-heads heads.parquet

Per split, e_{l,h} is the signed mean drop over examples. The heads file has one row per
(split, layer, head) with e and its share p = |e|/E; the summary has one row per split with
E, N_eff, the top-head share and head, and the index/layer decomposition. Undefined values
(every effect zero) are null.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headgeom.hashing import sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, write_parquet
from headgeom.patching import drops_array, metadata_text
from headgeom.stats import concentration, effects_from_drops, index_layer_decomposition

#: Check C11 (METHODS §18): N_eff = N_index · N_layer|index to this relative error.
C11_TOLERANCE = 1e-9
IDENTITY = ("model", "seed", "task")
#: Provenance keys of the effects file that the outputs repeat.
CARRIED_METADATA = ("checkpoint_sha256", "manifest_content_hash", "task_dataset_sha256")

HEADS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
        ("layer", pa.int32()),
        ("head", pa.int32()),
        ("e", pa.float64()),
        ("p", pa.float64()),
    ]
)
HEADS_DESCRIPTIONS = {
    "e": "signed mean drop e_{l,h} over the split's examples, logit units (METHODS §10.1)",
    "p": "share |e_{l,h}| / E; null when every effect is zero (METHODS §10.2)",
}
SUMMARY_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
        ("n_examples", pa.int64()),
        ("E", pa.float64()),
        ("N_eff", pa.float64()),
        ("top_head_share", pa.float64()),
        ("top_layer", pa.int32()),
        ("top_head", pa.int32()),
        ("N_index", pa.float64()),
        ("N_layer_given_index", pa.float64()),
    ]
)
SUMMARY_DESCRIPTIONS = {
    "n_examples": "examples averaged into e",
    "E": "Σ|e_{l,h}|, logit units: separate single-head interventions, not a joint one",
    "N_eff": "exp of the Shannon entropy (nats) of p: effective number of heads",
    "top_head_share": "max |e| / E",
    "top_layer": "layer of the head with the largest |e| (first in row-major order on ties)",
    "top_head": "head index of that head",
    "N_index": "exp H(index marginal q_h = Σ_l p_{l,h}) (METHODS §10.3)",
    "N_layer_given_index": "exp Σ_h q_h H(layer | h); N_eff = N_index · N_layer_given_index",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", required=True, help="effects Parquet (src/patch_heads.py)")
    parser.add_argument("--out-summary", required=True, help="per-split summary Parquet")
    parser.add_argument("--out-heads", required=True, help="per-head effects Parquet")
    return parser.parse_args(argv)


def single_identity(frame: pd.DataFrame, path: str) -> dict:
    identity = {}
    for column in IDENTITY:
        values = pd.unique(frame[column])
        if len(values) != 1:
            raise ValueError(f"{path}: expected one {column}, found {list(values)}")
        identity[column] = values[0].item() if hasattr(values[0], "item") else values[0]
    return identity


def _or_none(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    effects = pq.read_table(args.effects).to_pandas()
    if effects.empty:
        raise ValueError(f"{args.effects}: no rows")
    meta = read_parquet_metadata(args.effects)
    carried = {k: metadata_text(meta, k, args.effects) for k in CARRIED_METADATA if k in meta}
    shape = {k: int(json.loads(meta[k])) for k in ("n_layers", "n_heads") if k in meta}
    identity = single_identity(effects, args.effects)

    heads, summary, c11 = [], [], 0.0
    for split in pd.unique(effects["split"]):
        _, d = drops_array(
            effects[effects["split"] == split], shape.get("n_layers"), shape.get("n_heads")
        )
        e = effects_from_drops(d)  # (L, H)
        stats = concentration(e)
        n_index, n_layer_given_index = index_layer_decomposition(e)
        if np.isfinite(stats["N_eff"]):
            c11 = max(c11, abs(stats["N_eff"] - n_index * n_layer_given_index) / stats["N_eff"])
        n_layers, n_heads = e.shape
        heads.append(
            pd.DataFrame(
                {
                    **identity,
                    "split": split,
                    "layer": np.repeat(np.arange(n_layers), n_heads),
                    "head": np.tile(np.arange(n_heads), n_layers),
                    "e": e.reshape(-1),
                    "p": stats["p"].reshape(-1),
                }
            )
        )
        top = stats["top_head"]
        summary.append(
            {
                **identity,
                "split": split,
                "n_examples": d.shape[0],
                "E": stats["E"],
                "N_eff": _or_none(stats["N_eff"]),
                "top_head_share": _or_none(stats["top_head_share"]),
                "top_layer": None if top is None else top[0],
                "top_head": None if top is None else top[1],
                "N_index": _or_none(n_index),
                "N_layer_given_index": _or_none(n_layer_given_index),
            }
        )
    if c11 > C11_TOLERANCE:
        raise ArithmeticError(
            f"check C11 failed: N_eff differs from N_index·N_layer|index by {c11:.3g} "
            f"(relative) > {C11_TOLERANCE}"
        )

    metadata = {
        "analysis": "concentration",
        "analysis_version": "1",
        **identity,
        "effects_sha256": sha256_file(args.effects),
        **carried,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "check_C11_max_rel_residual": c11,
        "check_C11_tolerance": C11_TOLERANCE,
        "source": source_freeze(),
    }
    summary_frame = pd.DataFrame(summary)
    for column in ("top_layer", "top_head"):
        summary_frame[column] = summary_frame[column].astype("Int32")
    write_parquet(
        args.out_heads,
        pd.concat(heads, ignore_index=True),
        HEADS_SCHEMA,
        metadata,
        HEADS_DESCRIPTIONS,
    )
    write_parquet(args.out_summary, summary_frame, SUMMARY_SCHEMA, metadata, SUMMARY_DESCRIPTIONS)
    print(f"wrote {len(summary)} split summaries to {args.out_summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
