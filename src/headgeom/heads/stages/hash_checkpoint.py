"""Write the checkpoint manifest (docs §2.3) that every analysis verifies before it reads
weights.

    python -m headgeom.heads.stages.hash_checkpoint --config-json '{...}' \\
        --checkpoint model.safetensors \\
        --train-log train_log.parquet --corpus-manifest corpus/manifest.json \\
        --threads 1 --out manifest.json

Before writing, it checks that the training log was produced by this config, from this
corpus manifest, and that the checkpoint bytes are the ones training wrote; any mismatch
stops with an error naming the files and both hashes, and nothing is written. It also runs
check C6: every frozen buffer equals, byte for byte, the basis regenerated from the
checkpoint's record (headgeom.model.frozen); a mismatch fails the job, and the result is
logged in the manifest's ``checks`` (headgeom.checks).
"""

from __future__ import annotations

import argparse
import json
import sys

from headgeom.hashing import manifest_hash
from headgeom.io import write_manifest
from headgeom.manifest import final_manifest
from headgeom.run_config import parse_run_config
from headgeom.runtime import set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="run config as a JSON object")
    p.add_argument("--checkpoint", required=True, help="checkpoint .safetensors")
    p.add_argument("--train-log", required=True, help="training log .parquet")
    p.add_argument("--corpus-manifest", required=True, help="corpus manifest.json")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, help="output checkpoint manifest.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    run = parse_run_config(json.loads(args.config_json))
    manifest = final_manifest(run, args.checkpoint, args.train_log, args.corpus_manifest)
    print(f"check C6: {manifest['checks']['check_C6_note']}: 0", file=sys.stderr)
    write_manifest(args.out, manifest)
    print(f"{args.out}: manifest {manifest_hash(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
