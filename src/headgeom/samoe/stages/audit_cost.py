"""The audit-cost pilot and runtime of one family's three variants (SAMOE §16; descriptive).

    python -m headgeom.samoe.stages.audit_cost --family toy --seed 42 --checkpoints a b c \\
        --manifests a b c --pools pools.parquet --targets targets.parquet \\
        --corpus-manifest manifest.json --audit-cost audit_cost.parquet --runtime runtime.parquet \\
        [--device auto|cpu|cuda]

Pilot: the first 8 intervention sequences as one batch and the targets of the first, in
separate phases: capture (one clean forward keeping each audit object's minimal form),
attribution from the captured data (ledger, LWO's structural attribution or Li's scores:
zero extra passes), gradient extraction (one autograd call per target), and the same batch's
plain forward (no hook, nothing kept; timed in the same job, so the capture's overhead over a
forward is one ratio of two medians of this machine). Runtime: medians of
full-length forwards at batch 1 and 16 and one forward + backward at batch 4. Times are this
machine's (one thread per job, or the ``--device`` GPU: each timed call waits for the device's
queued kernels before the clock is read); pass counts, object counts and bytes are exact.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import content_hash
from headgeom.runtime import analysis_device, set_threads, synchronize
from headgeom.samoe import li, results
from headgeom.samoe.capture import capture
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.ledger import Targets, boundary_pair, ledger, structural_attribution
from headgeom.samoe.manifest import verified_inputs
from headgeom.samoe.pools import intervention_targets, pool, read_pools
from headgeom.samoe.rankings import gradient_x_write

PILOT_BATCH, REPEATS = 8, 5


def timed(fn, repeats: int = REPEATS, device: torch.device | None = None):
    """(median wall seconds over ``repeats`` calls after a warm-up, the last result); on a
    GPU the clock is read once the device's queued work is done."""
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        out = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def nbytes(*tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors if t is not None))


def pilot(model, ids, targets: Targets) -> list[dict]:
    device = ids.device
    n = len(targets)
    b, t = targets.batch, targets.position
    sources = int(targets.layer.sum())
    # one clean forward keeping only the audit objects' sources (SAMOE §16): no output logits
    fields = (("router_in", "state") if model.has_state
              else ("router_in", "attn_out", "shared_out", "routed_out"))  # fmt: skip
    wall, cap = timed(lambda: capture(model, ids, fields=fields), device=device)
    e2, e3 = boundary_pair(cap, targets)
    if model.has_state:  # minimal form: realised writes and the clean Top-3 ids and logits
        kept = nbytes(cap.delta, cap.top_ids.to(torch.int16), cap.top_logits)
        objects = sources
        attribution = ((lambda: ledger(model, cap, targets)) if model.variant == "persistent"
                       else (lambda: structural_attribution(ledger(model, cap, targets),
                                                            targets)))  # fmt: skip
        gradient = lambda: gradient_x_write(model, ids, targets, e2, e3)  # noqa: E731
    else:  # the components at the target tokens, and the router inputs they rebuild
        kept = nbytes(
            cap.attn_out[:, b, t],
            cap.shared_out[:, b, t],
            cap.routed_out[:, b, t],
            cap.router_in[:, b, t],
            cap.top_ids.to(torch.int16),
            cap.top_logits,
        )
        objects = len(li.KINDS) * sources
        attribution = lambda: li.attribute(model, ids, cap, targets, e2, e3)  # noqa: E731
        gradient = lambda: li.gradient_x_component(model, ids, targets, e2, e3)  # noqa: E731
    a_wall, _ = timed(attribution, device=device)
    g_wall, _ = timed(gradient, repeats=1, device=device)
    with torch.no_grad():  # the reference: the same batch, no hook, nothing kept
        p_wall, _ = timed(lambda: model(ids), device=device)
    return [
        {"phase": "capture", "wall_s": wall, "passes": 1, "n_targets": n, "n_objects": objects,
         "retained_bytes": kept},
        {"phase": "attribution", "wall_s": a_wall, "passes": 0, "n_targets": n,
         "n_objects": objects, "retained_bytes": 0},
        {"phase": "gradient", "wall_s": g_wall, "passes": 2 * n, "n_targets": n,
         "n_objects": objects, "retained_bytes": 0},
        {"phase": "plain_forward", "wall_s": p_wall, "passes": 1, "n_targets": 0,
         "n_objects": 0, "retained_bytes": 0},
    ]  # fmt: skip


def runtime(model, ids) -> list[dict]:
    rows, device = [], ids.device
    with torch.no_grad():
        for batch in (1, 16):
            x = ids[:batch]
            median, _ = timed(lambda x=x: model(x), device=device)
            rows.append({"measurement": "forward", "batch": batch, "median_s": median,
                         "repeats": REPEATS})  # fmt: skip
    x = ids[:4]

    def step():
        model.zero_grad(set_to_none=True)
        model(x[:, :-1]).logsumexp(-1).mean().backward()

    median, _ = timed(step, device=device)
    model.zero_grad(set_to_none=True)
    rows.append({"measurement": "forward_backward", "batch": 4, "median_s": median,
                 "repeats": REPEATS})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--checkpoints", nargs="+", type=Path, required=True)
    parser.add_argument("--manifests", nargs="+", type=Path, required=True)
    for name in ("pools", "targets", "corpus-manifest", "audit-cost", "runtime"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", required=True, help="auto (CUDA when present), cpu, cuda")
    args = parser.parse_args(argv)
    try:
        device = analysis_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    set_threads(args.threads)
    verified_inputs(args.corpus_manifest, {"pools": args.pools})
    pools = read_pools(args.pools)
    cost_rows, runtime_rows, hashes = [], [], {}
    for checkpoint, manifest_path in zip(args.checkpoints, args.manifests, strict=True):
        model, vocab, manifest = load_verified_moe(checkpoint, manifest_path)
        model = model.to(device)
        for p in model.parameters():
            p.requires_grad_(True)
        sub, frame, every = intervention_targets(pools, args.targets, vocab)
        first = every.batch == 0  # the targets of the pilot's first sequence
        targets = Targets(every.batch[first], every.position[first], every.layer[first])
        targets = targets.to(device)
        big = pool(pools, "final", vocab).ids.to(device)
        run = {"family": args.family, "variant": model.variant, "seed": args.seed}
        cost_rows += [{**run, **r} for r in pilot(model, sub.ids[:PILOT_BATCH].to(device),
                                                  targets)]  # fmt: skip
        runtime_rows += [{**run, **r} for r in runtime(model, big)]
        hashes[model.variant] = manifest["checkpoint_file_sha256"]
    meta = {"family": args.family, "seed": args.seed, "checkpoint_sha256": hashes,
            "threads": args.threads, "device": str(device),
            "machine_note": "wall times are descriptive (SAMOE §16)",
            "targets_registry_sha256": content_hash(frame.drop(columns="family")
                                                    .to_dict("list"))}  # fmt: skip
    with all_or_nothing(args.audit_cost, args.runtime):
        results.AUDIT_COST.write(args.audit_cost, pd.DataFrame(cost_rows), meta)
        results.RUNTIME.write(args.runtime, pd.DataFrame(runtime_rows), meta)
    print(
        f"audit cost {args.family} s{args.seed}: {len(targets)} targets, "
        f"{int(targets.layer.sum())} source interventions",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
