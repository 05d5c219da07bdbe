"""Write the basis family record (docs §5.7) of every Kerdock ⊗ Haar family the study's
models use, with checks C2–C5 and where each model's frozen bases share directions (§5.5
item 6).

    python -m headgeom.heads.stages.basis_family \\
        --runs-json '[{"model": "all-rotated", "geometry": ...,
        "model_config": {...}}, ...]' --out results/demo/geometry/basis_family.json

One entry per family (headgeom.model.kerdock.family_entry), keyed by its
``basis_family_hash``, the hash every manifest of a model using it records. Building a family
runs C2–C5 and fails the job when one fails; a study without frozen bases writes an empty list.
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom import __version__
from headgeom.hashing import source_freeze
from headgeom.io import write_manifest
from headgeom.model import registry
from headgeom.model.kerdock import family_entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-json", required=True, help="JSON list of runs (param_counts')")
    parser.add_argument("--out", required=True, help="output JSON")
    args = parser.parse_args(argv)
    runs = json.loads(args.runs_json)
    families, users = {}, {}
    for i, run in enumerate(runs):
        missing = {"model", "geometry", "model_config"} - set(run)
        if missing:
            parser.error(f"--runs-json item {i} lacks {sorted(missing)}")
        cfg = registry.config_from_dict({**run["model_config"], "n_vocab": 1})
        family = registry.basis_family(cfg)
        if family is None:
            continue
        families[family.family_hash] = family
        entry = {"model": run["model"], "geometry": run["geometry"],
                 "bases": registry.frozen_bases(cfg)}  # fmt: skip
        users.setdefault(family.family_hash, {})[run["model"]] = entry  # seeds share it
    record = {
        "record_type": "basis_family_file",
        "families": [family_entry(f, list(users[h].values())) for h, f in families.items()],
        "source_freeze": source_freeze(),
        "headgeom_version": __version__,
    }
    write_manifest(args.out, record)
    for entry in record["families"]:
        models = ", ".join(m["model"] for m in entry["models"])
        n = entry["record"]["n_members"]
        print(f"family {entry['basis_family_hash'][:12]} ({n} members): {models}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
