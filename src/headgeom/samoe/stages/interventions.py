"""Full-forward source suppression of one state run (SAMOE §14): every eligible source of
every audited target is suppressed (s_{l+1} ← s_l at the target token, the forward rerun),
and the outcomes are measured on the clean (e2, e3): |Δm|, downstream Top-2 divergence and
output KL. From that exhaustive grid come the rankings' metrics (ledger, largest write norm,
recency, gradient×write, random; §14.5, with sequence-bootstrap intervals), the
ledger-selected source and its matched controls (Eq. 47) and the persistence endpoints.

    python -m headgeom.samoe.stages.interventions --run-json '{...}' --config-json '{...}' \\
        --checkpoint model.safetensors --manifest manifest.json --pools pools.parquet \\
        --targets targets.parquet --corpus-manifest manifest.json \\
        --out interventions.parquet --rankings rankings.parquet [--device auto|cpu|cuda] \\
        [--batch-sequences N]

Checks first: K11 (the hook at α = 1 is bitwise the plain forward) and K13 (gradient×write
against the finite difference at ε = 1e-3 on 8 targets without a selection flip, in float64).
``--device`` (auto: CUDA when present) holds the model and runs every forward, backward and
the float64 K13 copy; the scores come to the host for the numpy metrics and the bootstrap.
``--batch-sequences`` (config ``capture.batch_sequences``; default: the subset in one forward,
64 suppressions a forward) bounds memory: the clean capture is made that many sequences a
forward and kept at the targets' tokens only, and K11, K13 and the suppressions run that many
rows a forward.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import content_hash
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import results
from headgeom.samoe.capture import token_capture
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.ledger import Targets, ledger, structural_attribution
from headgeom.samoe.manifest import (
    add_batch_sequences,
    batch_metadata,
    run_metadata,
    verified_inputs,
)
from headgeom.samoe.pools import intervention_targets, read_pools
from headgeom.samoe.rankings import (
    check_gradient,
    finite_difference,
    gradient_x_write,
    matched_controls,
    random_scores,
    ranking_metrics,
    ranking_table,
    recency_scores,
)
from headgeom.samoe.suppression import Rows, check_hook_no_op, suppression_outcomes

#: K13 runs on the first targets (in file order) of this many (SAMOE §14.4: 8).
K13_TARGETS = 8
METHODS = ("ledger", "norm", "recency", "gradient", "random")


def gradient_check(model, ids, targets: Targets, e2, e3, rows_per_forward=None) -> dict:
    """K13 in float64 on a copy of the model: in float32 a margin of a few units resolves
    differences of ~1e-6, so (m(1) − m(1 − ε))/ε at ε = 1e-3 carries ~1e-3 of rounding
    noise, the size of the smaller sources' gradients (float64: agreement to ~1e-5). The copy
    stays on the model's device (CUDA runs float64 too)."""
    m64 = copy.deepcopy(model).double()
    few = Targets(*(v[:K13_TARGETS] for v in (targets.batch, targets.position, targets.layer)))
    e2, e3 = e2[:K13_TARGETS], e3[:K13_TARGETS]
    grad = gradient_x_write(m64, ids, few, e2, e3)
    fd, flip = finite_difference(m64, ids, few, e2, e3, rows_per_forward=rows_per_forward)
    return check_gradient(grad, fd, flip)


def grid(values: np.ndarray, tgt: np.ndarray, src: np.ndarray, n: int, N: int) -> np.ndarray:
    out = np.full((n, N), np.nan)
    out[tgt, src] = values
    return out


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
    n, N = len(targets), len(model.blocks)
    ids, targets = sub.ids.to(device), targets.to(device)

    batch = args.batch_sequences
    k11 = check_hook_no_op(model, ids, Rows(targets.batch, targets.position, targets.layer - 1),
                           rows_per_forward=batch)  # fmt: skip
    cap = token_capture(model, ids, targets.batch, targets.position, batch,
                        ("router_in", "state", "output_logits"))  # fmt: skip
    led = ledger(model, cap, targets)
    grad = gradient_x_write(model, ids, targets, led.e2, led.e3).cpu().numpy()
    k13 = gradient_check(model, ids, targets, led.e2, led.e3, rows_per_forward=batch)

    per_forward = {} if batch is None else {"rows_per_forward": batch}
    out = suppression_outcomes(model, ids, cap, targets, **per_forward)

    def host(values):
        return values.cpu().double().numpy()

    tgt, src = out.target.cpu().numpy(), out.source.cpu().numpy()
    effects = grid(host(out.margin_change.abs()), tgt, src, n, N)
    persistent = model.variant == "persistent"
    attribution = led.contributions if persistent else structural_attribution(led, targets)
    eligible = np.arange(N)[None, :] < frame["layer"].to_numpy()[:, None]
    scores = {
        "ledger": np.where(eligible, host(attribution.abs()), np.nan),
        "norm": np.where(eligible, host(led.write_norm), np.nan),
        "recency": recency_scores(frame["layer"].to_numpy(), N),
        "gradient": np.where(eligible, grad, np.nan),
        "random": random_scores(run["family"], sub.seq_ids, frame, N),
    }
    # the selected source: the ledger's top for P, the native L − 1 for LWO (SAMOE §14.4)
    if persistent:
        selected = ranking_metrics(scores["ledger"], effects, spearman=False).selected
    else:
        selected = frame["layer"].to_numpy() - 1
    controls = matched_controls(run["family"], frame, selected, host(led.write_norm))
    role = {}
    for i in range(n):
        role[(i, int(selected[i]))] = "selected"
        for name in ("random", "norm", "distance"):
            c = int(getattr(controls, name)[i])
            if c >= 0:
                role.setdefault((i, c), name)
    rows = frame.iloc[tgt][["seq_id", "slot", "layer", "position"]].reset_index(drop=True)
    rows = rows.assign(
        source=src, margin_change=host(out.margin_change),
        abs_margin_change=host(out.margin_change.abs()),
        jaccard_downstream=host(out.jaccard_downstream),
        jaccard_after_target=host(out.jaccard_after_target),
        output_kl=host(out.output_kl),
        ledger=scores["ledger"][tgt, src], norm=scores["norm"][tgt, src],
        gradient=scores["gradient"][tgt, src],
        role=[role.get((int(i), int(s)), "") for i, s in zip(tgt, src, strict=True)],
        **run)  # fmt: skip

    # ranking metrics with paired sequence-bootstrap intervals (shared resamples)
    rankings = ranking_table({m: scores[m] for m in METHODS}, effects, frame["seq_id"],
                             icfg["bootstrap"], icfg["bootstrap_seed"])  # fmt: skip
    meta = {**run_metadata(run, manifest, cfg, device), **k11, **k13, **batch_metadata(batch),
            "targets_registry_sha256": content_hash(
                frame.drop(columns="family").to_dict("list"))}  # fmt: skip
    with all_or_nothing(args.out, args.rankings):
        results.INTERVENTIONS.write(args.out, rows, meta)
        results.RANKINGS.write(args.rankings, rankings.assign(**run), meta)
    sel = rows[rows.role == "selected"]
    print(f"interventions {run}: {len(rows)} suppressions of {n} targets, selected |Δm| "
          f"{sel.abs_margin_change.mean():.4f}, K13 {k13['check_K13_max_rel_residual']:.3g}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
