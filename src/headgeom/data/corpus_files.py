"""One training corpus and the shared validation file, tokenised into result files (docs §3).

First the validation file: the first documents of the source's last shard (stored order), each
followed by EOT, cut at exactly ``n_val_tokens``. It depends only on the source keys of the
config, never on the corpus, so every corpus of a study gets a byte-identical copy (one shared
file, docs §3.4). Then the corpus: the source's documents in ``order``, validation documents
skipped, each followed by EOT, cut at exactly ``n_train_tokens``. :func:`build_corpus` writes
both token files (``results.TOKENS``), the model vocabulary map (``results.VOCAB``) and the
corpus manifest with every hash downstream records cite, and ``sampling``
(``with_replacement`` or ``read_once``), which tells training how to draw batches. A failure
leaves none of the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from headgeom import results
from headgeom.data import corpus, corpus_sources
from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash, sha256_file
from headgeom.io import write_manifest


def build_corpus(
    cfg: dict[str, Any], train_path: Path, val_path: Path, vocab_path: Path, manifest_path: Path
) -> dict[str, Any]:
    """Tokenise corpus ``cfg`` (resolved) into the four files; returns the manifest."""
    config_hash = content_hash(cfg)
    with corpus_sources.all_or_nothing(train_path, val_path, vocab_path, manifest_path):
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
            "train_sha256": corpus.write_tokens(train_path, tokens, {**common, "role": "train"}),
            "val_sha256": corpus.write_tokens(val_path, val.tokens, {**val_meta, "role": "val"}),
            "vocab_sha256": corpus.vocab_sha256(vocab),
        }
        texts = tok.decode_batch([[int(i)] for i in vocab], skip_special_tokens=False)
        results.VOCAB.write(
            vocab_path,
            pa.table(
                {
                    "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
                    "gpt2_id": pa.array(vocab.astype(np.int32)),
                    "text": pa.array(texts, type=pa.string()),
                }
            ),
            {
                **common,
                "compact_vocab": cfg["compact_vocab"],
                "vocab_size": len(vocab),
                "vocab_sha256": hashes["vocab_sha256"],
            },
        )
        files = {"train": train_path, "val": val_path, "vocab": vocab_path}
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
        write_manifest(manifest_path, manifest)
    return manifest
