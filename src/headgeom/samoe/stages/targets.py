"""The audited target decisions of one SA-MoE family (SAMOE §14.1): one per intervention
sequence at each of the family's target layers, chosen from ids and tokens alone (never a
margin, ledger value or effect), so every variant and seed audits the same decisions (K12).

    python -m headgeom.samoe.stages.targets --family toy --layers-json '[6,7,6,7]' \\
        --pools pools.parquet --corpus-manifest manifest.json --out targets.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.hashing import content_hash
from headgeom.samoe import results
from headgeom.samoe.manifest import verified_inputs
from headgeom.samoe.pools import gpt2_tokens, read_pools
from headgeom.samoe.rankings import select_targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--layers-json", required=True)
    parser.add_argument("--pools", required=True, type=Path)
    parser.add_argument("--corpus-manifest", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    # the corpus's EOS: GPT-2's for the toy corpus, the family tokenizer's for a Hub family
    eos = verified_inputs(args.corpus_manifest, {"pools": args.pools})["eot_id"]
    layers = json.loads(args.layers_json)
    frame = read_pools(args.pools)
    sub = frame[(frame["role"] == "final") & frame["intervention"]]
    targets = select_targets(
        args.family,
        sub["seq_id"].tolist(),
        gpt2_tokens(frame, "final", intervention=True),
        layers,
        eos,
    )
    targets.insert(0, "family", args.family)
    registry = content_hash(targets.drop(columns="family").to_dict("list"))
    results.TARGETS.write(args.out, targets, {"family": args.family, "target_layers": layers,
                                              "registry_sha256": registry})  # fmt: skip
    print(f"targets {args.family}: {len(targets)} decisions over {targets['seq_id'].nunique()} "
          f"sequences, registry {registry[:12]}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
