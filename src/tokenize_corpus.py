"""Tokenise one training corpus and the shared validation file; write its manifest (METHODS §3).

    python src/tokenize_corpus.py --config-json '{"name":"R","source":"fineweb",
        "revision":"87f0...","n_train_tokens":200000000,"n_val_tokens":2000000,
        "order":"stored","sampling":"with_replacement","compact_vocab":false}' \\
        --train train_tokens.parquet --val val_tokens.parquet --vocab vocab.parquet \\
        --manifest manifest.json --threads 16

First the validation file: the first documents of the source's last shard (stored order), each
followed by EOT, cut at exactly ``n_val_tokens``. It depends only on the source keys of the
config, never on the corpus, so every corpus of a study gets a byte-identical copy (one shared
file, METHODS §3.4). Then the corpus: the source's documents in ``order``, validation documents
skipped, each followed by EOT, cut at exactly ``n_train_tokens``. Writes both token files (one
uint16 column ``token``), the model vocabulary map (model id <-> GPT-2 id) and the corpus
manifest with every hash downstream records cite, and ``sampling`` (``with_replacement`` or
``read_once``), which tells training how to draw batches. A failure leaves none of the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from headgeom.data import corpus, corpus_sources
from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash, sha256_file
from headgeom.io import write_json, write_parquet

VOCAB_SCHEMA = pa.schema([("model_id", pa.int32()), ("gpt2_id", pa.int32()), ("text", pa.string())])
VOCAB_DESCRIPTIONS = {
    "model_id": "row of the model's embedding / unembedding (0-based, dense)",
    "gpt2_id": "GPT-2 BPE id that model_id stands for (sorted ascending)",
    "text": "decoded text of the GPT-2 token (invalid UTF-8 fragments shown as U+FFFD)",
}


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
    corpus_sources.set_threads(args.threads)
    config_hash = content_hash(cfg)

    with corpus_sources.all_or_nothing(args.train, args.val, args.vocab, args.manifest):
        source = corpus_sources.open_source(cfg)
        tok = load_gpt2_tokenizer()
        n_val, n_train = cfg["n_val_tokens"], cfg["n_train_tokens"]
        with tqdm(
            total=n_val + n_train, unit="tok", unit_scale=True, file=sys.stderr, desc=cfg["name"]
        ) as bar:
            val = corpus_sources.tokenize_stream(
                corpus_sources.text_batches(source, "val"),
                tok,
                n_val,
                progress=bar.update,
                what="validation file",
            )
            train = corpus_sources.tokenize_stream(
                corpus_sources.text_batches(source, "train", cfg["order"]),
                tok,
                n_train,
                exclude=set(val.doc_keys),
                progress=bar.update,
                what=f"corpus {cfg['name']}",
            )
        tokens = train.tokens
        vocab = (
            corpus.build_vocab([tokens, val.tokens])
            if cfg["compact_vocab"]
            else corpus.identity_vocab()
        )
        common = {"config": cfg, "config_hash": config_hash, "eot_id": EOT_ID}
        # The validation file records only what it depends on: the same bytes for every corpus.
        val_cfg = corpus_sources.validation_config(cfg)
        val_meta = {"config": val_cfg, "config_hash": content_hash(val_cfg), "eot_id": EOT_ID}
        hashes = {
            "train_sha256": corpus.write_tokens(args.train, tokens, {**common, "role": "train"}),
            "val_sha256": corpus.write_tokens(args.val, val.tokens, {**val_meta, "role": "val"}),
            "vocab_sha256": corpus.vocab_sha256(vocab),
        }
        texts = tok.decode_batch([[int(i)] for i in vocab], skip_special_tokens=False)
        write_parquet(
            args.vocab,
            pa.table(
                {
                    "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
                    "gpt2_id": pa.array(vocab.astype(np.int32)),
                    "text": pa.array(texts, type=pa.string()),
                }
            ),
            VOCAB_SCHEMA,
            metadata={
                **common,
                "compact_vocab": cfg["compact_vocab"],
                "vocab_size": len(vocab),
                "vocab_sha256": hashes["vocab_sha256"],
            },
            descriptions=VOCAB_DESCRIPTIONS,
        )
        files = {"train": args.train, "val": args.val, "vocab": args.vocab}
        manifest = {
            "record_type": "corpus_manifest",
            "corpus": cfg["name"],
            **common,
            **source.provenance,
            "tokenizer": {"name": "gpt2", "files_sha256": tokenizer_files_sha256()},
            "sampling": cfg["sampling"],
            "order": cfg["order"],
            "n_train_tokens": len(tokens),
            "n_val_tokens": len(val.tokens),
            "n_train_documents": len(train.doc_keys),
            "n_val_documents": len(val.doc_keys),
            "n_val_documents_skipped": train.n_skipped,  # met again in the training stream
            "val_config_hash": val_meta["config_hash"],
            **hashes,
            "vocab_size": len(vocab),
            "files": {role: sha256_file(path) for role, path in files.items()},
            "file_bytes": {role: path.stat().st_size for role, path in files.items()},
        }
        write_json(args.manifest, manifest)
    print(
        f"corpus {cfg['name']}: {len(tokens):,} train tokens from {len(train.doc_keys):,} "
        f"documents ({train.n_skipped} validation documents skipped), {len(val.tokens):,} val, "
        f"vocab {len(vocab):,}, train_sha256 {hashes['train_sha256'][:12]}, {cfg['sampling']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
