"""Tokenise one training corpus and the shared validation file; write its manifest (docs §3).

    python -m headgeom.heads.stages.tokenize_corpus --config-json '{"name":"R","source":"fineweb",
        "revision":"87f0...","n_train_tokens":200000000,"n_val_tokens":2000000,
        "order":"stored","sampling":"with_replacement","compact_vocab":false}' \\
        --train train_tokens.parquet --val val_tokens.parquet --vocab vocab.parquet \\
        --manifest manifest.json --threads 16

Writes both token files (one uint16 column ``token``), the model vocabulary map (model id <->
GPT-2 id) and the corpus manifest (headgeom.data.corpus_files.build_corpus). The validation
file depends only on the source keys of the config, so every corpus of a study gets a
byte-identical copy. A failure leaves none of the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.data import corpus_sources
from headgeom.data.corpus_files import build_corpus
from headgeom.runtime import set_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True, help="the corpus config as JSON")
    parser.add_argument("--train", required=True, type=Path, help="output token Parquet (train)")
    parser.add_argument("--val", required=True, type=Path, help="output token Parquet (val)")
    parser.add_argument("--vocab", required=True, type=Path, help="output vocabulary Parquet")
    parser.add_argument("--manifest", required=True, type=Path, help="output manifest JSON")
    parser.add_argument("--threads", type=int, default=1, help="tokenizer threads")
    args = parser.parse_args(argv)
    try:
        cfg = corpus_sources.resolve_corpus(json.loads(args.config_json))
    except json.JSONDecodeError as err:
        parser.error(f"--config-json is not valid JSON ({err})")
    set_threads(args.threads)
    m = build_corpus(cfg, args.train, args.val, args.vocab, args.manifest)
    print(
        f"corpus {cfg['name']}: {m['n_train_tokens']:,} train tokens from "
        f"{m['n_train_documents']:,} documents ({m['n_val_documents_skipped']} validation "
        f"documents skipped), {m['n_val_tokens']:,} val, vocab {m['vocab_size']:,}, "
        f"train_sha256 {m['train_sha256'][:12]}, {cfg['sampling']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
