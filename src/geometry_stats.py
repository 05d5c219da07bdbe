"""Weight-space geometry of one checkpoint (METHODS §9.1–9.4, §14.1, §14.3; check C14).

    python src/geometry_stats.py --checkpoint CKPT --manifest MANIFEST \\
        --model-name learned --seed 42 --out-pk pk.parquet --out-summary summary.parquet

Writes two Parquets:

* ``--out-pk``: one row per (kind, source head, target head, read type): the projection
  kernel PK between the write space U = Im W_O of a source head and either the write space
  of a head in a later layer (``write_write``; PK is symmetric, so each pair once) or the
  weight-space read space R_{X,0} = Im W_Xᵀ of a head in a later layer (``write_read``,
  X ∈ {Q, K, V}), with ρ = PK / min(dim).
* ``--out-summary``: one row per (model, seed): V self-alignment (own-best fraction,
  ρ_self), scaled idempotence P(T_h), the Proposition 1 check C14 and the inter-layer
  write–write / write–read PK on the same versus other head index (§9.4 table).

C14 runs only where every layer's writes form an orthogonal decomposition of R^D (detected
from the weights); if it applies and fails its 1e-8 tolerance, nothing is written. The
checkpoint is verified against its manifest before anything else is read.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
import pyarrow as pa

from headgeom.analysis.subspace import RANK_RTOL
from headgeom.analysis.weightspace import (
    PROP1_TOLERANCE,
    head_maps,
    head_spaces,
    idempotence,
    index_stats,
    proposition1,
    self_alignment,
    write_read_pk,
    write_write_pk,
)
from headgeom.hashing import content_hash, source_freeze
from headgeom.io import write_parquet
from headgeom.model.checkpoint import load_verified

PK_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("kind", pa.string()),
        ("source_layer", pa.int32()),
        ("source_head", pa.int32()),
        ("target_layer", pa.int32()),
        ("target_head", pa.int32()),
        ("read_type", pa.string()),
        ("pk", pa.float64()),
        ("rho", pa.float64()),
        ("source_dim", pa.int32()),
        ("target_dim", pa.int32()),
        ("same_index", pa.bool_()),
    ]
)
PK_DESCRIPTIONS = {
    "model": "model configuration name (display name)",
    "seed": "training (initialisation) seed of the model",
    "kind": "write_write: U^{l,h} vs U^{l',k}, l < l' (PK symmetric, each pair once); "
    "write_read: U^{l,h} vs R_{X,0}^{l',h'}, l' > l",
    "source_layer": "layer l of the writing head, 0-based",
    "source_head": "head index h of the writing head, 0-based",
    "target_layer": "layer l' (> l) of the other head",
    "target_head": "head index of the other head",
    "read_type": "X ∈ {Q, K, V} of the read space for write_read; null for write_write",
    "pk": "projection kernel ‖UᵀV‖_F² = Σ cos²θ_i (METHODS §9.3), weight space",
    "rho": "PK / min(source_dim, target_dim)",
    "source_dim": "dimension of Im W_O of the source head (rank, SVD cut 1e-6·σ_max)",
    "target_dim": "dimension of the target write space or weight-space read space Im W_Xᵀ",
    "same_index": "source_head == target_head",
}

SUMMARY_COLUMNS = [
    ("model", pa.string(), "model configuration name (display name)"),
    ("seed", pa.int64(), "training (initialisation) seed of the model"),
    ("n_layer", pa.int32(), "layers L"),
    ("n_head", pa.int32(), "heads per layer H (own-best chance is 1/H)"),
    ("d_model", pa.int32(), "residual width D"),
    ("d_head", pa.int32(), "head width d"),
    ("write_dim_min", pa.int32(), "smallest dim Im W_O over heads"),
    ("write_dim_max", pa.int32(), "largest dim Im W_O over heads"),
    (
        "own_best_fraction",
        pa.float64(),
        "fraction of heads in layers ≥ 1 whose V read space R_{V,0} has strictly the "
        "largest PK with their own write space among their layer's heads (METHODS §14.1)",
    ),
    ("own_best_fraction_layer0", pa.float64(), "the same for the heads of layer 0"),
    ("n_heads_own_best_test", pa.int32(), "heads in layers ≥ 1 (the own-best reader set)"),
    (
        "rho_self_mean",
        pa.float64(),
        "mean over heads in layers ≥ 1 of ρ(R_{V,0}^{l,h}, U^{l,h}) = PK / min(dim)",
    ),
    ("rho_self_median", pa.float64(), "median of the same"),
    (
        "idempotence_median",
        pa.float64(),
        "median over all heads of the scaled idempotence P(T_h), T_h = O_h V_hᵀ (§14.3)",
    ),
    ("idempotence_mean", pa.float64(), "mean over all heads of P(T_h)"),
    (
        "prop1_applies",
        pa.bool_(),
        "every layer's writes decompose R^D orthogonally: H·d == D and "
        "max|Σ_h P_{U^{l,h}} − I| ≤ 1e-8 (METHODS §9.4)",
    ),
    (
        "write_decomposition_residual",
        pa.float64(),
        "max over layers of max|Σ_h P_{U^{l,h}} − I| (the detection statistic)",
    ),
    (
        "prop1_max_residual",
        pa.float64(),
        "check C14: max over layers l and all read spaces R of |Σ_h PK(U^{l,h}, R) − dim R| "
        "(tolerance 1e-8); null where Proposition 1 does not apply",
    ),
]
for _kind, _title in (("write_write", "write–write"), ("write_read", "write→later-read")):
    for _index in ("same_index", "other_index"):
        for _stat in ("mean", "min", "max"):
            SUMMARY_COLUMNS.append(
                (
                    f"{_kind}_pk_{_index}_{_stat}",
                    pa.float64(),
                    f"{_stat} of inter-layer {_title} PK over {_index.replace('_', '-')} "
                    f"head pairs" + (" (Q, K, V pooled)" if _kind == "write_read" else ""),
                )
            )
SUMMARY_SCHEMA = pa.schema([(name, typ) for name, typ, _ in SUMMARY_COLUMNS])
SUMMARY_DESCRIPTIONS = {name: text for name, _, text in SUMMARY_COLUMNS}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's training seed")
    parser.add_argument("--out-pk", required=True, help="pairwise PK Parquet")
    parser.add_argument("--out-summary", required=True, help="one-row summary Parquet")
    return parser.parse_args(argv)


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else float("nan")


def _median(values: pd.Series) -> float:
    return float(values.median()) if len(values) else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, _, manifest = load_verified(args.checkpoint, args.manifest)
    cfg = model.cfg
    maps = head_maps(model)
    spaces = head_spaces(maps)
    print(f"bases of {cfg.n_layer}×{cfg.n_head} heads", file=sys.stderr)

    ww = write_write_pk(spaces).assign(kind="write_write")
    wr = write_read_pk(spaces).assign(kind="write_read")
    pk = pd.concat([ww, wr], ignore_index=True)
    pk.insert(0, "seed", args.seed)
    pk.insert(0, "model", args.model_name)
    print(f"{len(ww)} write–write and {len(wr)} write–read pairs", file=sys.stderr)

    prop1 = proposition1(spaces, cfg.d_head)
    if prop1.applies and not prop1.max_residual <= PROP1_TOLERANCE:
        raise ArithmeticError(
            f"{args.checkpoint}: check C14 failed: Σ_h PK(U^{{l,h}}, R) − dim R reaches "
            f"{prop1.max_residual:.3e} > {PROP1_TOLERANCE:g} although every layer's writes "
            "decompose R^D orthogonally"
        )
    print(
        f"Proposition 1 applies: {prop1.applies}; max|ΣP_U − I| = "
        f"{prop1.decomposition_residual:.3e}; C14 max residual = {prop1.max_residual:.3e}",
        file=sys.stderr,
    )

    selfal = self_alignment(spaces)
    later, first = selfal[selfal["layer"] >= 1], selfal[selfal["layer"] == 0]
    idem = idempotence(maps)["idempotence"]
    dims = [U.shape[1] for layer in spaces.write for U in layer]
    summary = {
        "model": args.model_name,
        "seed": args.seed,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "write_dim_min": min(dims),
        "write_dim_max": max(dims),
        "own_best_fraction": _mean(later["own_best"].astype(float)),
        "own_best_fraction_layer0": _mean(first["own_best"].astype(float)),
        "n_heads_own_best_test": len(later),
        "rho_self_mean": _mean(later["rho_self"]),
        "rho_self_median": _median(later["rho_self"]),
        "idempotence_median": _median(idem.dropna()),
        "idempotence_mean": _mean(idem.dropna()),
        "prop1_applies": prop1.applies,
        "write_decomposition_residual": prop1.decomposition_residual,
        "prop1_max_residual": prop1.max_residual,
    }
    for kind, frame in (("write_write", ww), ("write_read", wr)):
        summary.update({f"{kind}_pk_{k}": v for k, v in index_stats(frame).items()})
    print(
        f"own-best fraction (layers ≥ 1) {summary['own_best_fraction']:.3f}, layer 0 "
        f"{summary['own_best_fraction_layer0']:.3f}; ρ_self mean {summary['rho_self_mean']:.3f}; "
        f"median P(T_h) {summary['idempotence_median']:.3f}",
        file=sys.stderr,
    )

    metadata = {
        "analysis": "geometry_stats",
        "analysis_version": "1",
        "model": args.model_name,
        "seed": args.seed,
        "n_layers": cfg.n_layer,
        "n_heads": cfg.n_head,
        "geometry": cfg.geometry,
        "checkpoint_sha256": manifest["checkpoint_file_sha256"],
        "manifest_content_hash": content_hash(manifest),
        "rank_rtol": RANK_RTOL,
        "space": "weight space: U = Im W_O, R_{X,0} = Im W_Xᵀ (METHODS §9.1), float64",
        "check_C14_applies": prop1.applies,
        "check_C14_max_abs_residual": None if np.isnan(prop1.max_residual) else prop1.max_residual,
        "check_C14_tolerance": PROP1_TOLERANCE,
        "source": source_freeze(),
    }
    write_parquet(args.out_pk, pk, PK_SCHEMA, metadata, PK_DESCRIPTIONS)
    write_parquet(
        args.out_summary,
        pd.DataFrame([summary]),
        SUMMARY_SCHEMA,
        metadata,
        SUMMARY_DESCRIPTIONS,
    )
    print(f"wrote {len(pk)} PK rows to {args.out_pk} and {args.out_summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
