"""Future-routing accessibility probes of one state run (SAMOE §13): for each frozen
source→target pair, predict the target router's clean Top-1 expert from what the source
router sees at the same position, on nested budgets of the construction pool; select C on
the calibration pool; score transition-only, sequence-clustered accuracy on the final pool.

    python -m headgeom.samoe.stages.probes \\
        --run-json '{"family":"toy","variant":"persistent","seed":42}' \\
        --config-json '{...analysis config...}' --checkpoint model.safetensors \\
        --manifest manifest.json --pools pools.parquet --corpus-manifest manifest.json \\
        --out probes.parquet [--device auto|cpu|cuda] [--batch-sequences N]

Both state variants fit the native state at every budget. The Persistent run also fits its
hidden stream: the full linear probe and the supervised r-dimensional subspace (P hidden-r)
at every budget, and the supplementary controls (PCA-r, random projections, the MLP) at the
top budget (``controls_at_top_budget_only``). Every fit must converge (K10).

``--device`` (auto: CUDA when present) runs the captures and the fits (float64 L-BFGS, the
MLP, PCA's randomized SVD); features come to the host once per pool, where the scalers,
projections and scores stay. ``--batch-sequences`` (config ``capture.batch_sequences``;
default: a whole pool in one forward) captures each pool that many sequences a forward, and
only what the probes read is kept: router inputs and states of one source layer at a time
(the pools captured again for each), Top-2 sets at its pairs' layers, and of the
construction pool only the positions of the largest budget (the first of the seeded
permutation, in its order).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import probes, results
from headgeom.samoe.capture import captures
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.manifest import (
    add_batch_sequences,
    batch_metadata,
    run_metadata,
    verified_inputs,
)
from headgeom.samoe.pools import pool, read_pools


def seeded(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16], 16)


class PoolData:
    """Router inputs and states at the ``sources`` layers and Top-2 at the ``layers`` of one
    pool's clean capture, flattened over (seq, t) as host arrays (dicts by layer), at the
    flat positions ``keep`` in that order (None: all); captured ``batch_sequences`` sequences
    a forward (None: the whole pool in one), so only one chunk's record and these arrays live."""

    def __init__(self, model, ids: torch.Tensor, seq_ids: list[str], sources, layers,
                 keep: np.ndarray | None = None, batch_sequences: int | None = None):  # fmt: skip
        S, T = ids.shape
        keep = np.arange(S * T) if keep is None else np.asarray(keep)
        self.hidden, self.state, self.top2 = {}, {}, {}
        for part, cap in captures(model, ids, batch_sequences, ("router_in", "state")):
            lo, hi = part.start * T, part.stop * T
            rows = np.flatnonzero((keep >= lo) & (keep < hi))  # where they go
            at = torch.as_tensor(keep[rows] - lo, device=cap.logits.device)  # chunk positions
            for layer in sources:
                _put(self.hidden, layer, cap.router_in[layer], at, rows, len(keep))
                _put(self.state, layer, cap.state[layer], at, rows, len(keep))
            for layer in layers:
                _put(self.top2, layer, cap.top_ids[layer, ..., :2], at, rows, len(keep))
            del cap
        self.sequence = np.repeat(np.asarray(seq_ids), T)[keep]


def _put(out: dict, layer: int, values: torch.Tensor, at: torch.Tensor, rows: np.ndarray,
         n_keep: int) -> None:  # fmt: skip
    """out[layer][rows] = the chunk's ``values`` (b, T, …) at its flat positions ``at``."""
    flat = values.reshape(-1, *values.shape[2:])[at].cpu().numpy()
    if layer not in out:
        out[layer] = np.empty((n_keep, *flat.shape[1:]), dtype=flat.dtype)
    out[layer][rows] = flat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "manifest", "pools", "corpus-manifest", "out"):
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
    pcfg = cfg["probes"]
    set_threads(args.threads)
    verified_inputs(args.corpus_manifest, {"pools": args.pools})
    model, vocab, manifest = load_verified_moe(args.checkpoint, args.manifest)
    model = model.to(device)
    frame = read_pools(args.pools)
    E, r = model.moe_cfg.n_experts, pcfg["dim"]
    budgets = sorted(pcfg["budgets"])
    pairs = [tuple(p) for p in pcfg["pairs"]]
    sources = sorted({src for src, _ in pairs})
    roles = ("construction", "calibration", "final")
    pools = {role: pool(frame, role, vocab) for role in roles}
    # one nested permutation per (family, seed): a seed's variants train on the same examples;
    # of the construction pool only the largest budget's positions are kept, in its order
    order = np.random.default_rng(seeded(run["family"], run["seed"], "probes")).permutation(
        pools["construction"].ids.numel())  # fmt: skip
    keep = {"construction": order[: budgets[-1]], "calibration": None, "final": None}
    # the features of every source layer at once, or (chunked: bounded memory) of one source
    # layer at a time, the pools captured again for the next (the same values either way)
    groups = [sources] if args.batch_sequences is None else [[src] for src in sources]
    data, loaded = {}, []

    def load(src: int) -> None:
        group = next(g for g in groups if src in g)
        if loaded == group:
            return
        data.clear()  # the previous group's features go before the next are captured
        layers = sorted({*group, *(t for s, t in pairs if s in group)})
        for role in roles:
            data[role] = PoolData(model, pools[role].ids, pools[role].seq_ids, group, layers,
                                  keep[role], args.batch_sequences)  # fmt: skip
        loaded[:] = group

    long_pairs = {tuple(p) for p in pcfg["long_horizon"]}
    rows, fits = [], []

    def evaluate(rep, src, tgt, budget, feats, probe=None, predict=None):
        """Fit (unless given) and score one representation; ``feats`` maps role -> features
        (the construction pool's in the permutation's order: a budget is its first rows)."""
        train_idx = slice(0, budget)
        y = {role: data[role].top2[tgt][:, 0] for role in data}
        if probe is None and predict is None:
            scaler = probes.Scaler.fit(feats["construction"][train_idx])
            probe = probes.fit_selected((scaler(feats["construction"][train_idx]),
                                         y["construction"][train_idx]),
                                        (scaler(feats["calibration"]), y["calibration"]), E,
                                        pcfg["C_grid"], device=device)  # fmt: skip
            fits.append(probe)
            predict = lambda x: probe.predict(scaler(x))  # noqa: E731
        final = data["final"]
        mask = probes.transition_mask(final.top2[src], final.top2[tgt])
        acc, pooled = probes.clustered_accuracy(predict(feats["final"]), y["final"],
                                                final.sequence, mask)  # fmt: skip
        rows.append({"source": src, "target": tgt, "horizon": tgt - src,
                     "long_horizon": (src, tgt) in long_pairs, "representation": rep,
                     "budget": budget, "accuracy": acc, "pooled_accuracy": pooled,
                     "n_eval": int(mask.sum()), "transition_share": float(mask.mean()),
                     "C": getattr(probe, "C", float("nan")),
                     "iterations": getattr(probe, "iterations", 0)})  # fmt: skip
        return probe

    persistent = model.variant == "persistent"
    for src, tgt in pairs:
        load(src)
        native = {role: data[role].state[src] for role in data}
        hidden = {role: data[role].hidden[src] for role in data}
        for budget in budgets:
            evaluate("native", src, tgt, budget, native)
            if not persistent:
                continue
            full = evaluate("full_linear", src, tgt, budget, hidden)
            # the supervised subspace of the full-hidden classifier (refit on the projection)
            scaler = probes.Scaler.fit(hidden["construction"][:budget])
            basis = probes.supervised_subspace(full.weight, r, seeded(*run.values(), src, tgt))
            evaluate("hidden_r", src, tgt, budget,
                     {k: scaler(v) @ basis for k, v in hidden.items()})  # fmt: skip
            at_top = budget == budgets[-1]
            if not (at_top or not pcfg["controls_at_top_budget_only"]):
                continue
            pca = probes.pca_basis(scaler(hidden["construction"][:budget]), r, seed=0,
                                   device=device)  # fmt: skip
            evaluate("pca_r", src, tgt, budget, {k: scaler(v) @ pca for k, v in hidden.items()})
            first = len(rows)
            for i in range(pcfg["n_random_projections"]):
                proj = probes.random_projection(hidden["final"].shape[1], r, seed=i)
                evaluate("random_r", src, tgt, budget,
                         {k: scaler(v) @ proj for k, v in hidden.items()})  # fmt: skip
            draws = pd.DataFrame(rows[first:])
            mean = draws[["accuracy", "pooled_accuracy"]].mean().to_dict()
            rows[first:] = [{**rows[first], **mean, "C": float("nan"), "iterations": 0}]
            train_idx = slice(0, budget)
            y = data["construction"].top2[tgt][train_idx, 0]
            calibration = (scaler(hidden["calibration"]), data["calibration"].top2[tgt][:, 0])
            mlp_seed = seeded(*run.values(), src, tgt, "mlp") % 2**31
            train = (scaler(hidden["construction"][train_idx]), y)
            net = probes.fit_mlp(train, calibration, E, r, seed=mlp_seed, device=device)

            def predict_mlp(x, net=net, scaler=scaler):
                with torch.no_grad():
                    return net(torch.as_tensor(scaler(x), device=device)).argmax(1).cpu().numpy()

            evaluate("mlp_r", src, tgt, budget, hidden, probe=object(), predict=predict_mlp)
        native = hidden = None  # nothing holds this source's features past its pairs
    k10 = probes.check_converged(fits)
    out = pd.DataFrame(rows).assign(**run)
    out["C"] = out["C"].astype(float)
    results.PROBES.write(args.out, out, {**run_metadata(run, manifest, cfg, device), **k10,
                                         "n_fits": len(fits),
                                         **batch_metadata(args.batch_sequences)})  # fmt: skip
    top = out[(out.budget == budgets[-1]) & (out.representation == "native")]
    print(f"probes {run}: {len(fits)} fits, native accuracy at {budgets[-1]}: "
          f"{top.accuracy.mean():.3f} (6-pair mean), long-horizon "
          f"{top[top.long_horizon].accuracy.mean():.3f}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
