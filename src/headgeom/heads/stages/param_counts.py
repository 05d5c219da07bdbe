"""Count every model's parameters with the real constructor, on the meta device (docs §4.4).

    python -m headgeom.heads.stages.param_counts \\
        --runs-json '[{"model": "learned", "seed": 42, ...}]' \\
        [--vocab vocab.parquet] --out results/demo/models/param_counts.parquet

Each run gives its study model name, seed, repository and display names, geometry, corpus
and the model section of its run config (headgeom.heads.analysis.param_counts). The vocabulary
size is the row count of ``--vocab`` (a compacted demo vocabulary) or, without it, GPT-2's
50,257. Any count that differs from docs §6.1 fails the job (check C1, logged in the
file's metadata: headgeom.checks).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom import results
from headgeom.data.corpus import read_vocab
from headgeom.data.tokenizer import VOCAB_SIZE
from headgeom.hashing import content_hash
from headgeom.heads.analysis.param_counts import c1_metadata, check_runs, count_runs
from headgeom.runtime import set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-json", required=True, help="JSON list of runs (see the docstring)")
    p.add_argument("--vocab", default=None, help="vocab.parquet; default: GPT-2's 50,257 ids")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, type=Path, help="output Parquet")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    runs = check_runs(json.loads(args.runs_json))
    n_vocab = len(read_vocab(args.vocab)) if args.vocab else VOCAB_SIZE  # read verified
    frame = count_runs(runs, n_vocab)
    metadata = {"runs_hash": content_hash(runs), "n_vocab": n_vocab, **c1_metadata(frame)}
    metadata.update(results.provenance())
    results.PARAM_COUNTS.write(args.out, frame, metadata)
    print(frame.drop(columns=["basis_family_hash", "note"]).to_string(index=False), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
