"""One clean capture of a state run (SAMOE §9) and what is read straight from it: the state
geometry per layer (§18), the local set-change rates (§12, E5), and the routing ledger of
every audited target with its distributed-history metrics (§10, E3, E4). For LWO the
attribution is the structural one (all of ωᵀ s_L to source L − 1, §10.2): replacement does
not telescope into causal terms, so its history metrics are 0 / 1 / 1 by construction. The checks K2
(state bounds), K6 (ledger), K7 (logits), K8 (state-only replay; Persistent only, where
writes add) and K9 (λ = 1) run first:
a failure stops the job before any output is written, and the residuals are recorded in the
metadata of the files they guard. Beside the targets, ``--history-pool`` gets SAMOE
§10.3's supplement: the history metrics over every decision at layer ≥ 1 of the final pool
(``headgeom.samoe.pool_ledger``), with K6 over every decision of the final and the
construction pool (the spec logs it on the construction pool) and the count of coordinates
the clamp acted on in each pool, in its metadata (a second capture of the construction pool;
the final pool's is the one above). ``--device`` (auto: CUDA when present) holds the model and
every tensor; the frames are built from host copies, and each file records the device.
``--batch-sequences`` (config ``capture.batch_sequences``; default: a whole pool in one
forward) captures the pools that many sequences a forward, keeping per chunk only the per-token
norms and set-change indicators of the final pool and every field at the audited tokens of
the intervention subset (K2, K7 and K9 are maxima or counts over the chunks).

    python -m headgeom.samoe.stages.capture \\
        --run-json '{"family":"toy","variant":"persistent","seed":42}' \\
        --config-json '{...analysis config...}' --checkpoint model.safetensors \\
        --manifest manifest.json --pools pools.parquet --targets targets.parquet \\
        --corpus-manifest manifest.json --state-geometry g.parquet \\
        --local-suppression l.parquet --history h.parquet --history-pool hp.parquet \\
        [--device auto|cpu|cuda] \\
        [--batch-sequences N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import results
from headgeom.samoe.capture import PoolStates, captures, token_capture
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.ledger import (
    check_ledger,
    check_replay,
    history_metrics,
    ledger,
    logit_reconstruction_residual,
    state_only_replay,
    structural_attribution,
)
from headgeom.samoe.manifest import (
    add_batch_sequences,
    batch_metadata,
    run_metadata,
    verified_inputs,
)
from headgeom.samoe.pool_ledger import PoolLedger
from headgeom.samoe.pools import intervention_targets, pool, read_pools
from headgeom.samoe.suppression import PoolSetChanges


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "manifest", "pools", "targets", "corpus-manifest",
                 "state-geometry", "local-suppression", "history", "history-pool"):  # fmt: skip
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
    set_threads(args.threads)
    verified_inputs(args.corpus_manifest, {"pools": args.pools})
    model, vocab, manifest = load_verified_moe(args.checkpoint, args.manifest)
    model = model.to(device)
    clamp = model.moe_cfg.clamp
    frame = read_pools(args.pools)
    final = pool(frame, "final", vocab)
    lambdas = cfg["local_suppression"]["lambdas"]
    states, changes = PoolStates(clamp), PoolSetChanges(model, lambdas)
    whole = {"final": PoolLedger(model), "construction": PoolLedger(model)}
    fields = ("router_in", "state", "write_proposal")  # the hooks record; the forward is one
    for _, chunk in captures(model, final.ids, args.batch_sequences, fields):
        states.add(chunk)
        changes.add(chunk)
        whole["final"].add(chunk)
        del chunk
    construction = pool(frame, "construction", vocab)
    for _, chunk in captures(model, construction.ids, args.batch_sequences,
                             ("state", "write_proposal")):  # fmt: skip
        whole["construction"].add(chunk)
        del chunk
    k6_pools = {}
    for name, led in whole.items():  # K6 over every decision of each pool (SAMOE §10.4)
        k6_pools |= led.check(f"K6.{name}_pool", what=f"ledger |Σ c − ωᵀ s_L| over every "
                                                      f"decision of the {name} pool")  # fmt: skip
    k2 = states.check_bounds(model.variant)
    k9 = changes.check_unit_lambda()
    N = len(model.blocks)
    local = [
        {"lam": lam, "layer0": layer0, "set_change_rate": rate,
         "n_decisions": (N - (not layer0)) * final.ids.numel()}
        for layer0 in (False, True)
        for lam, rate in changes.rates(skip_layer0=not layer0).items()
    ]  # fmt: skip

    # the ledger of the audited targets, on the intervention subset: K7 over every decision
    # of each chunk, everything else at the targets' tokens only
    sub, targets_frame, targets = intervention_targets(frame, args.targets, vocab)
    k7 = []
    sub_cap = token_capture(
        model, sub.ids, targets.batch, targets.position, args.batch_sequences,
        ("router_in", "state", "write_proposal"),
        each=lambda chunk: k7.append(logit_reconstruction_residual(model, chunk)))  # fmt: skip
    led = ledger(model, sub_cap, targets)
    k67 = check_ledger(model, sub_cap, led, logit_residual=max(k7))
    if model.variant == "persistent":
        k8 = check_replay(led, state_only_replay(model, sub_cap, targets, led))
        attribution = led.contributions
    else:  # replacement does not telescope: LWO's audit object is structural (SAMOE §10.2)
        k8 = {}
        attribution = structural_attribution(led, targets)
    hist = history_metrics(attribution, targets.layer)
    kept = hist.kept.cpu().numpy()

    def host(values: torch.Tensor) -> np.ndarray:
        return values.cpu().double().numpy()

    def at_kept(values: torch.Tensor) -> np.ndarray:
        out = np.full(len(targets), np.nan)
        out[kept] = host(values)
        return out

    history = targets_frame[["seq_id", "slot", "layer", "position"]].assign(
        e2=led.e2.cpu().numpy(), e3=led.e3.cpu().numpy(), margin=host(led.margin),
        hidden_term=host(led.hidden_term), state_term=host(led.state_term),
        mass=at_kept(hist.mass), non_recent=at_kept(hist.non_recent), ess=at_kept(hist.ess),
        max_share=at_kept(hist.max_share),
        contributions=[row[:L].double().tolist() for row, L in
                       zip(attribution.cpu(), targets.layer.tolist(), strict=True)],
        **run)  # fmt: skip
    geometry = pd.DataFrame(states.geometry()).assign(**run)
    clamps = {f"clamped_coordinates_{name}_pool": led.clamped for name, led in whole.items()}
    clamps |= {f"write_coordinates_{name}_pool": led.coordinates for name, led in whole.items()}
    meta = {**run_metadata(run, manifest, cfg, device), **batch_metadata(args.batch_sequences)}
    with all_or_nothing(args.state_geometry, args.local_suppression, args.history,
                        args.history_pool):  # fmt: skip
        results.STATE_GEOMETRY.write(args.state_geometry, geometry, {**meta, **k2})
        results.LOCAL_SUPPRESSION.write(args.local_suppression, pd.DataFrame(local).assign(**run),
                                        {**meta, **k9})  # fmt: skip
        results.HISTORY.write(args.history, history, {**meta, **k67, **k8})
        results.HISTORY_POOL.write(args.history_pool,
                                   pd.DataFrame(whole["final"].rows()).assign(**run),
                                   {**meta, **k6_pools, **clamps})  # fmt: skip
    nr = np.nanmean(history["non_recent"])
    print(f"capture {run}: K6 {k67['check_K6_max_abs_residual']:.2e} (construction pool "
          f"{whole['construction'].residual:.2e}), K7 "
          f"{k67['check_K7_max_abs_residual']:.2e}, set change at λ=0 "
          f"{local[len(lambdas) - 1]['set_change_rate']:.3f}, non-recent {nr:.3f}, clamped "
          f"{whole['final'].clamped} of {whole['final'].coordinates} write coordinates",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
