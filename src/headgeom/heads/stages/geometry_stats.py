"""Weight-space geometry of one checkpoint (docs §9.1–9.4, §14.1, §14.3; check C14).

    python -m headgeom.heads.stages.geometry_stats --checkpoint CKPT --manifest MANIFEST \\
        --model-name learned --seed 42 --threads 1 --out-pk pk.parquet \\
        --out-summary summary.parquet --out-heads heads.parquet

Writes ``--out-pk`` (one row per (kind, source head, target head, read type): the projection
kernel between a source head's write space and a later head's write space or weight-space
read space) and ``--out-summary`` (one row per (model, seed): V self-alignment, scaled
idempotence, check C14 and inter-layer PK on the same versus other head index) and
``--out-heads`` (one row per head: the own-best test, ρ_self and P(T_h) it aggregates); see
headgeom.heads.analysis.geometry_summary. If C14 applies and fails, nothing is written; the
designed-PK check of §9.4 (frozen head blocks: d / 0 / the family's cross-member PK) does
the same at the paper's size and is only reported below it. The checkpoint is verified
against its manifest before anything else is read.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.heads.analysis.geometry_summary import (
    c14_metadata,
    designed_pk_metadata,
    geometry_tables,
)
from headgeom.model import registry, zoo
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import set_threads
from headgeom.subspace import RANK_RTOL


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's training seed")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out-pk", required=True, help="pairwise PK Parquet")
    parser.add_argument("--out-summary", required=True, help="one-row summary Parquet")
    parser.add_argument("--out-heads", required=True, help="per-head own-best/ρ_self/P(T_h)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, _, manifest = load_verified(args.checkpoint, args.manifest)
    cfg = model.cfg
    geo = geometry_tables(model, args.model_name, args.seed, args.checkpoint)
    # a pretrained model (no study geometry) has no paper size to hold the design check to
    paper_size = cfg.geometry is not None and zoo.is_paper_size(
        registry.geometry_of(cfg).name, cfg.to_dict()
    )
    designed = designed_pk_metadata(geo, cfg.d_model, cfg.d_head, paper_size)
    s = geo.summary
    print(
        f"{cfg.n_layer}×{cfg.n_head} heads, {len(geo.pk)} PK pairs; Proposition 1 applies: "
        f"{geo.prop1_applies}; max|ΣP_U − I| = {geo.decomposition_residual:.3e}; C14 max "
        f"residual = {geo.prop1_max_residual:.3e}; own-best fraction (layers ≥ 1) "
        f"{s['own_best_fraction']:.3f}, layer 0 {s['own_best_fraction_layer0']:.3f}; "
        f"ρ_self mean {s['rho_self_mean']:.3f}; median P(T_h) {s['idempotence_median']:.3f}",
        file=sys.stderr,
    )
    metadata = {
        **results.file_metadata("geometry_stats", manifest=manifest),
        "model": args.model_name,
        "seed": args.seed,
        "n_layers": cfg.n_layer,
        "n_heads": cfg.n_head,
        "geometry": cfg.geometry,
        "rank_rtol": RANK_RTOL,
        "space": "weight space: U = Im W_O, R_{X,0} = Im W_Xᵀ (docs §9.1), float64; K/V of "
        "a shared key/value head on every query head of its group (docs §11.8)",
        **c14_metadata(geo),
        **designed,
        "threads": args.threads,
    }
    results.GEOMETRY_PK.write(args.out_pk, geo.pk, metadata)
    results.GEOMETRY_SUMMARY.write(args.out_summary, pd.DataFrame([geo.summary]), metadata)
    results.GEOMETRY_HEADS.write(args.out_heads, geo.heads, metadata)
    print(f"wrote {len(geo.pk)} PK rows to {args.out_pk} and {args.out_summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
