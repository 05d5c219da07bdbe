"""Future-routing accessibility probes of one state run (SAMOE §13): for each frozen
source→target pair, predict the target router's clean Top-1 expert from what the source
router sees at the same position, on nested budgets of the construction pool; select C on
the calibration pool; score transition-only, sequence-clustered accuracy on the final pool.

    python src/samoe_probes.py --run-json '{"family":"toy","variant":"persistent","seed":42}' \\
        --config-json '{...analysis config...}' --checkpoint model.safetensors \\
        --manifest manifest.json --pools pools.parquet --corpus-manifest manifest.json \\
        --out probes.parquet [--device auto|cpu|cuda]

Both state variants fit the native state at every budget. The Persistent run also fits its
hidden stream: the full linear probe and the supervised r-dimensional subspace (P hidden-r)
at every budget, and the supplementary controls (PCA-r, random projections, the MLP) at the
top budget (``controls_at_top_budget_only``). Every fit must converge (K10).

``--device`` (auto: CUDA when present) runs the captures and the fits (float64 L-BFGS, the
MLP, PCA's randomized SVD); features come to the host once per pool, where the scalers,
projections and scores stay.
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
from headgeom.samoe.capture import capture
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.manifest import run_metadata, verified_inputs
from headgeom.samoe.pools import pool, read_pools


def seeded(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16], 16)


class PoolData:
    """Router inputs, states and Top-2 of one pool's clean capture (on the model's device),
    flattened over (seq, t), as host arrays."""

    def __init__(self, model, ids: torch.Tensor, seq_ids: list[str]):
        cap = capture(model, ids)
        S, T = ids.shape
        self.hidden = cap.router_in.reshape(cap.n_layer, S * T, -1).cpu().numpy()
        self.state = cap.state[:-1].reshape(cap.n_layer, S * T, -1).cpu().numpy()
        self.top2 = cap.top_ids[..., :2].reshape(cap.n_layer, S * T, 2).cpu().numpy()
        self.sequence = np.repeat(np.asarray(seq_ids), T)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "manifest", "pools", "corpus-manifest", "out"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
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
    data = {}
    for role in ("construction", "calibration", "final"):
        p = pool(frame, role, vocab)
        data[role] = PoolData(model, p.ids, p.seq_ids)
    E, r = model.moe_cfg.n_experts, pcfg["dim"]
    budgets = sorted(pcfg["budgets"])
    n_construction = len(data["construction"].sequence)
    # one nested permutation per (family, seed): a seed's variants train on the same examples
    order = np.random.default_rng(seeded(run["family"], run["seed"], "probes")).permutation(
        n_construction)  # fmt: skip
    long_pairs = {tuple(p) for p in pcfg["long_horizon"]}
    rows, fits = [], []

    def evaluate(rep, src, tgt, budget, feats, probe=None, predict=None):
        """Fit (unless given) and score one representation; ``feats`` maps role -> features."""
        train_idx = order[:budget]
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
    for src, tgt in (tuple(p) for p in pcfg["pairs"]):
        native = {role: data[role].state[src] for role in data}
        hidden = {role: data[role].hidden[src] for role in data}
        for budget in budgets:
            evaluate("native", src, tgt, budget, native)
            if not persistent:
                continue
            full = evaluate("full_linear", src, tgt, budget, hidden)
            # the supervised subspace of the full-hidden classifier (refit on the projection)
            scaler = probes.Scaler.fit(hidden["construction"][order[:budget]])
            basis = probes.supervised_subspace(full.weight, r, seeded(*run.values(), src, tgt))
            evaluate("hidden_r", src, tgt, budget,
                     {k: scaler(v) @ basis for k, v in hidden.items()})  # fmt: skip
            at_top = budget == budgets[-1]
            if not (at_top or not pcfg["controls_at_top_budget_only"]):
                continue
            pca = probes.pca_basis(scaler(hidden["construction"][order[:budget]]), r, seed=0,
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
            train_idx = order[:budget]
            y = data["construction"].top2[tgt][train_idx, 0]
            calibration = (scaler(hidden["calibration"]), data["calibration"].top2[tgt][:, 0])
            mlp_seed = seeded(*run.values(), src, tgt, "mlp") % 2**31
            train = (scaler(hidden["construction"][train_idx]), y)
            net = probes.fit_mlp(train, calibration, E, r, seed=mlp_seed, device=device)

            def predict_mlp(x, net=net, scaler=scaler):
                with torch.no_grad():
                    return net(torch.as_tensor(scaler(x), device=device)).argmax(1).cpu().numpy()

            evaluate("mlp_r", src, tgt, budget, hidden, probe=object(), predict=predict_mlp)
    k10 = probes.check_converged(fits)
    out = pd.DataFrame(rows).assign(**run)
    out["C"] = out["C"].astype(float)
    results.PROBES.write(args.out, out, {**run_metadata(run, manifest, cfg, device), **k10,
                                         "n_fits": len(fits)})  # fmt: skip
    top = out[(out.budget == budgets[-1]) & (out.representation == "native")]
    print(f"probes {run}: {len(fits)} fits, native accuracy at {budgets[-1]}: "
          f"{top.accuracy.mean():.3f} (6-pair mean), long-horizon "
          f"{top[top.long_horizon].accuracy.mean():.3f}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
