"""Post-hoc attribution on one Ordinary MoE run (SAMOE §15, after Li et al.): each audited
target's router logits split over the earlier layers' residual components (attention,
shared expert, gated routed experts; the router-input LayerNorm frozen at its clean
statistics), scored six ways, and checked against the oracle (the component removed at the
target token, the full forward rerun). K14: the parts rebuild x_L and z_L within 1e-5.

    python -m headgeom.samoe.stages.li \\
        --run-json '{"family":"toy","variant":"ordinary","seed":42}' \\
        --config-json '{...}' --checkpoint model.safetensors --manifest manifest.json \\
        --pools pools.parquet --targets targets.parquet --corpus-manifest manifest.json \\
        --out li.parquet --rankings rankings.parquet [--device auto|cpu|cuda] \\
        [--batch-sequences N]

``--device`` (auto: CUDA when present) holds the model and runs the capture, attribution,
backwards and oracle forwards; the scores come to the host for the metrics and the bootstrap.
``--batch-sequences`` (config ``capture.batch_sequences``; default: the subset in one forward)
bounds memory: the clean capture is made that many sequences a forward and kept at the
targets' tokens only, and the oracle runs that many rows a forward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import li, results
from headgeom.samoe.capture import token_capture
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.ledger import Targets, boundary_pair
from headgeom.samoe.manifest import (
    add_batch_sequences,
    batch_metadata,
    run_metadata,
    verified_inputs,
)
from headgeom.samoe.pools import intervention_targets, read_pools
from headgeom.samoe.rankings import ranking_table

#: Targets per oracle forward (each removes one component of one target per batch row).
TARGETS_PER_FORWARD = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "manifest", "pools", "targets", "corpus-manifest", "out",
                 "rankings"):  # fmt: skip
        parser.add_argument(f"--{name}", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", required=True, help="auto (CUDA when present), cpu, cuda")
    add_batch_sequences(parser)
    args = parser.parse_args(argv)
    try:
        device = analysis_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    run, cfg = json.loads(args.run_json), json.loads(args.config_json)
    icfg = cfg["interventions"]
    set_threads(args.threads)
    verified_inputs(args.corpus_manifest, {"pools": args.pools})
    model, vocab, manifest = load_verified_moe(args.checkpoint, args.manifest)
    model = model.to(device)
    sub, frame, targets = intervention_targets(read_pools(args.pools), args.targets, vocab)
    ids, targets = sub.ids.to(device), targets.to(device)
    N, K = len(model.blocks), len(li.KINDS)
    cap = token_capture(model, ids, targets.batch, targets.position, args.batch_sequences,
                        ("router_in", "attn_out", "shared_out", "routed_out"))  # fmt: skip
    e2, e3 = boundary_pair(cap, targets)
    att = li.attribute(model, ids, cap, targets, e2, e3)
    k14 = li.check_reconstruction(att)
    grad = li.gradient_x_component(model, ids, targets, e2, e3).cpu().numpy()
    effects = np.concatenate([
        li.oracle_effects(model, ids, Targets(*(v[i : i + TARGETS_PER_FORWARD] for v in
                          (targets.batch, targets.position, targets.layer))),
                          e2[i : i + TARGETS_PER_FORWARD],
                          e3[i : i + TARGETS_PER_FORWARD],
                          rows_per_forward=args.batch_sequences).cpu().numpy()
        for i in range(0, len(targets), TARGETS_PER_FORWARD)
    ])  # fmt: skip
    layers = frame["layer"].to_numpy()
    eligible = np.arange(K * N)[None, :] < K * layers[:, None]
    scores = {
        "li_variance": np.where(eligible, att.variance.cpu().double().numpy(), np.nan),
        "li_boundary": np.where(eligible, att.boundary.cpu().double().numpy(), np.nan),
        "norm": np.where(eligible, att.norm.cpu().double().numpy(), np.nan),
        "recency": li.recency_scores(layers, N),
        "random": li.random_scores(run["family"], frame["seq_id"].tolist(),
                                   frame["position"].to_numpy(), layers, N),
        "gradient": np.where(eligible, grad, np.nan),
    }  # fmt: skip
    rows = []
    for i, target in enumerate(frame.itertuples(index=False)):
        for j in range(K * int(target.layer)):
            rows.append({"seq_id": target.seq_id, "slot": target.slot, "layer": target.layer,
                         "position": target.position, "component_layer": j // K,
                         "component": li.KINDS[j % K],
                         **{k: float(scores[k][i, j]) for k in ("li_variance", "li_boundary",
                                                                  "norm", "gradient")},
                         "effect": float(effects[i, j])})  # fmt: skip
    rankings = ranking_table(scores, effects, frame["seq_id"], icfg["bootstrap"],
                             icfg["bootstrap_seed"])  # fmt: skip
    meta = {**run_metadata(run, manifest, cfg, device), **k14,
            **batch_metadata(args.batch_sequences)}  # fmt: skip
    with all_or_nothing(args.out, args.rankings):
        results.LI.write(args.out, pd.DataFrame(rows).assign(**run), meta)
        results.RANKINGS.write(args.rankings, rankings.assign(**run), meta)
    rho = rankings[rankings.metric == "spearman"].set_index("method").value
    print(f"li {run}: {len(rows)} components of {len(targets)} targets, K14 input "
          f"{att.input_residual:.2e} logits {att.logit_residual:.2e}, Spearman Li "
          f"{rho['li_variance']:.3f} boundary {rho['li_boundary']:.3f} gradient "
          f"{rho['gradient']:.3f}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
