"""The step-0 MoE of one SA-MoE run (SAMOE §6): sparse upcycling of the family's dense source
for (variant, seed), the K3 checks on it, and its init manifest (SHA-256 of every tensor).

    python -m headgeom.samoe.stages.upcycle --config-json '{"family":"toy","variant":"persistent",
        "seed":42,"moe":{...},"cpt":{...},"data_seed":1729}' --dense model.safetensors \\
        --dense-manifest manifest.json --out step0.safetensors --init-manifest init.json

The dense checkpoint is verified against its manifest first. Every noise draw has its own
generator seeded by (seed, tensor), so the experts are byte-identical across a seed's three
variants (checked by rule samoe_seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import manifest_hash
from headgeom.samoe.checkpoint import load_verified_dense, save_moe
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.manifest import run_manifest, write_run_manifest
from headgeom.samoe.upcycle import check_upcycling, init_manifest, upcycle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--dense", required=True, type=Path)
    parser.add_argument("--dense-manifest", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--init-manifest", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    state, source, vocab = load_verified_dense(args.dense, args.dense_manifest)
    model = upcycle(state, source, MoEConfig.from_dict(cfg["moe"]), cfg["variant"], cfg["seed"])
    k3 = check_upcycling(state, model)  # raises CheckFailed: nothing is written
    init = init_manifest(model)
    with all_or_nothing(args.out, args.init_manifest):
        save_moe(args.out, model, vocab, {"run": cfg, "step": 0})
        write_run_manifest(args.init_manifest, run_manifest(
            "samoe_init_manifest", cfg, args.out, {"dense": args.dense},
            {"dense": args.dense_manifest}, init=init, checks=k3,
            dense_manifest_hash=manifest_hash(args.dense_manifest)))  # fmt: skip
    print(
        f"upcycled {cfg['family']}/{cfg['variant']}/s{cfg['seed']}: {model.n_params():,} "
        f"parameters, init {init['content_sha256'][:12]}, K3 {k3}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
