"""The seed registry of an SA-MoE study (SAMOE §2) and the checks across a seed's variants:
K3 (every expert tensor hashes the same in the ordinary, latest and persistent step-0
models), K5 (each built model's total and active parameters are SAMOE §8's formula) and K1
(step-0 writes exactly 0; latest and persistent router logits bitwise equal, and with
``router_x_init: state_block`` the ordinary logits too), on the final pool.

    python -m headgeom.samoe.stages.seeds --runs-json '[["toy","ordinary",42],...]' \\
        --step0 a b ... \\
        --init-manifests a b ... --manifests a b ... --dense-manifests-json '{"toy":"..."}' \\
        --pools pools.parquet --corpus-manifest manifest.json --out seeds.json

``samoe/seeds.json``: per run its init, checkpoint, dense-source and config hashes and the
manifest content hash; per (family, seed) the logged checks; the registry's own content hash.
``--pools`` and ``--corpus-manifest`` take one file per corpus, paired in order: the toy
corpus's serve every toy family, a Hub family's (its manifest names the family) that family.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from headgeom.hashing import content_hash, manifest_hash
from headgeom.io import read_json, write_json
from headgeom.samoe import checks, counts
from headgeom.samoe.capture import capture, check_step0, chunks, cpu_bitwise
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.manifest import verified_inputs
from headgeom.samoe.pools import pool, read_pools
from headgeom.samoe.upcycle import check_experts_agree

#: Final-pool sequences the step-0 comparison runs on (a forward of all 96 per variant would
#: only repeat the same algebra).
K1_SEQUENCES = 8
#: K1's sequences per forward (bounded memory: one sequence's output logits per variant).
K1_BATCH = 1


def step0_checks(paths: dict[str, tuple[Path, Path]], pools_frame, inits: dict) -> dict:
    """K3.variants and K1 for one (family, seed): ``paths`` variant -> (step0, init manifest).
    The K1 sequences run ``K1_BATCH`` at a time through every variant, keeping each chunk's
    states and router logits and no output logits (compared chunk by chunk): the counts add
    and the output residual is the maximum over chunks, so the record is the one-forward one."""
    out = check_experts_agree({v: inits[v]["init"] for v in paths})
    models, ids = {}, {}
    mismatches = 0
    for variant, (step0, init) in paths.items():
        model, vocab, _ = load_verified_moe(step0, init)
        models[variant] = model
        ids[variant] = pool(pools_frame, "final", vocab).ids[:K1_SEQUENCES]
        # K5: the built model's parameter counts are the formula's (SAMOE §8)
        expected = counts.counts(counts.model_shape(model), model.moe_cfg, variant)
        mismatches += counts.model_counts(model) != (expected.total, expected.active)
    out |= checks.enforce("K5", mismatches, 0, "count",
                          what="variants whose built (total, active) parameters differ from "
                               "the §8 formula")  # fmt: skip
    state = next((v for v in ("persistent", "latest") if v in models), None)
    ordinary = ("ordinary" in models and state is not None
                and models[state].moe_cfg.router_x_init == "state_block")  # fmt: skip
    caps: dict[str, list] = {v: [] for v in models}
    outputs = 0.0
    n = len(next(iter(ids.values())))
    for part in chunks(n, K1_BATCH):
        chunk = {v: capture(m, ids[v][part], fields=("state", "output_logits"))
                 for v, m in models.items()}  # fmt: skip
        if ordinary:
            diff = (chunk["ordinary"].output_logits - chunk[state].output_logits).abs().max()
            outputs = max(outputs, float(diff))
        for v, cap in chunk.items():
            cap.output_logits = None  # only the chunk's comparison reads them
            caps[v].append(cap)
    if {"latest", "persistent"} <= set(caps):
        out |= check_step0(caps["latest"], caps["persistent"])
    if ordinary:
        differ = sum(int((a.logits != b.logits).sum())
                     for a, b in zip(caps["ordinary"], caps[state], strict=True))  # fmt: skip
        out |= checks.enforce(
            "K1.ordinary_logits",
            differ,
            0,
            "count",
            what=f"step-0 router logits differing between ordinary and {state}",
            needs=cpu_bitwise(caps[state][0].logits),
        )
        out |= checks.enforce("K1.ordinary_outputs", outputs, 0.0,
                              what=f"step-0 output logits, ordinary vs {state}",
                              needs=cpu_bitwise(caps[state][0].logits))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-json", required=True)
    parser.add_argument("--step0", nargs="+", type=Path, required=True)
    parser.add_argument("--init-manifests", nargs="+", type=Path, required=True)
    parser.add_argument("--manifests", nargs="+", type=Path, required=True)
    parser.add_argument("--dense-manifests-json", required=True)
    # one pools file per corpus: the toy corpus (every toy family) and each Hub family's own
    parser.add_argument("--pools", required=True, nargs="+", type=Path)
    parser.add_argument("--corpus-manifest", required=True, nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    runs = [tuple(r) for r in json.loads(args.runs_json)]
    if not len(runs) == len(args.step0) == len(args.init_manifests) == len(args.manifests):
        raise ValueError("samoe_seeds: one step-0 checkpoint, init manifest and manifest per run")
    dense = json.loads(args.dense_manifests_json)
    frames = {}  # a Hub family's corpus manifest names it; the toy corpus's names none
    for pools, corpus_manifest in zip(args.pools, args.corpus_manifest, strict=True):
        frames[verified_inputs(corpus_manifest, {"pools": pools}).get("family")] = read_pools(pools)
    torch.set_num_threads(1)
    groups: dict[tuple, dict] = defaultdict(dict)
    inits, records = {}, []
    for (family, variant, seed), step0, init, final in zip(
        runs, args.step0, args.init_manifests, args.manifests, strict=True
    ):
        inits[(family, variant, seed)] = read_json(init)
        groups[(family, seed)][variant] = (step0, init)
        m = read_json(final)
        records.append({
            "family": family, "variant": variant, "seed": int(seed),
            "init_content_sha256": inits[(family, variant, seed)]["init"]["content_sha256"],
            "step0_sha256": inits[(family, variant, seed)]["checkpoint_file_sha256"],
            "checkpoint_sha256": m["checkpoint_file_sha256"],
            "config_hash": m["config_hash"],
            "dense_manifest_hash": manifest_hash(dense[family]),
            "manifest_content_hash": content_hash(m),
        })  # fmt: skip
    seed_checks = []
    for (family, seed), paths in groups.items():
        mine = {v: inits[(family, v, seed)] for v in paths}
        seed_checks.append({"family": family, "seed": int(seed),
                            **step0_checks(paths, frames.get(family, frames.get(None)),
                                           mine)})  # fmt: skip
    registry = {"record_type": "samoe_seed_registry", "runs": records, "checks": seed_checks}
    registry["content_hash"] = content_hash({k: registry[k] for k in ("runs", "checks")})
    write_json(args.out, registry)
    print(f"seed registry: {len(records)} runs, {len(seed_checks)} (family, seed) checks passed, "
          f"content hash {registry['content_hash'][:12]}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
