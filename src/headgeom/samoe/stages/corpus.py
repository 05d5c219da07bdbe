"""The SA-MoE toy corpus (SAMOE §3.3, docs/samoe.md): the dense-train, dense-val and
cpt-train streams of the three domains, the held-out pools and the downstream suite, with
one compact vocabulary over all of them and a manifest of every hash.

    python -m headgeom.samoe.stages.corpus \\
        --config-json '{"data":{...},"seq_len":128,"downstream":{...}}' \\
        --out-dir results/samoe-demo/samoe/corpus

Streams: documents drawn with the config's sampling probabilities, each followed by EOS, cut
at exactly the configured token count (GPT-2 ids, one uint16 column, as the workspace's
corpora). Pools: one domain's held-out documents (text met in any training stream dropped),
EOS-joined and cut to T. A failure leaves none of the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from headgeom import results
from headgeom.data import corpus
from headgeom.data.corpus_sources import all_or_nothing
from headgeom.data.tokenizer import EOT_ID, encode, load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import content_hash, sha256_file
from headgeom.io import write_manifest
from headgeom.samoe import domains, downstream
from headgeom.samoe import results as samoe_results

FILES = ("dense_train", "dense_val", "cpt_train", "vocab", "pools", "downstream")


def stream(tok, seed: int, name: str, sampling: dict, n_tokens: int) -> tuple[np.ndarray, set]:
    """``n_tokens`` GPT-2 ids of stream ``name`` and the set of its document texts."""
    ids: list[int] = []
    texts: set[str] = set()
    docs = domains.iter_documents(seed, name, sampling)
    while len(ids) < n_tokens:
        batch = [next(docs)[1] for _ in range(512)]
        texts.update(batch)
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            ids += [*enc.ids, EOT_ID]
    return np.asarray(ids[:n_tokens], dtype=np.int64), texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    data, T, ds = cfg["data"], int(cfg["seq_len"]), cfg["downstream"]
    if "sources" in data:  # SAMoEStudy.corpus_config never passes it
        sys.exit("samoe_corpus: data.sources is read by the Hub families' own corpora "
                 "(samoe/stages/hub_corpus.py, rule samoe_hub_corpus); this job builds the toy "
                 "study's embedded domains (SAMOE §3.3)")  # fmt: skip
    out = {name: args.out_dir / f"{name}.parquet" for name in FILES}
    manifest_path = args.out_dir / "manifest.json"
    tok = load_gpt2_tokenizer()
    with all_or_nothing(*out.values(), manifest_path):
        seed, sampling = data["seed"], data["sampling"]
        dense, dense_texts = stream(tok, seed, "dense-train", sampling, data["dense_train_tokens"])
        val, val_texts = stream(tok, seed, "dense-val", sampling, data["val_tokens"])
        cpt, cpt_texts = stream(tok, seed, "cpt-train", sampling, data["cpt_train_tokens"])
        pools = domains.build_pools(seed, data["pools"], T, lambda t: encode(tok, t), EOT_ID,
                                    dense_texts | val_texts | cpt_texts)  # fmt: skip
        final = pools.loc[pools["role"] == "final", "seq_id"].tolist()
        chosen = set(domains.intervention_subset(final, data["pools"]["intervention"] // 3))
        pools["intervention"] = (pools["role"] == "final") & pools["seq_id"].isin(chosen)
        suite = downstream.examples(tok, ds["tasks"], ds["n_per_task"], ds["arith"]["n"],
                                    ds["arith"]["seed"])  # fmt: skip
        vocab = corpus.build_vocab(
            [dense, val, cpt, *pools["tokens"], *suite["context"],
             *(np.asarray(c) for cs in suite["choices"] for c in cs)]
        )  # fmt: skip
        common = {"config": cfg, "config_hash": content_hash(cfg), "eot_id": EOT_ID}
        hashes = {
            f"{role}_sha256": corpus.write_tokens(out[role], ids, {**common, "role": role})
            for role, ids in (("dense_train", dense), ("dense_val", val), ("cpt_train", cpt))
        }
        texts = tok.decode_batch([[int(i)] for i in vocab], skip_special_tokens=False)
        results.VOCAB.write(out["vocab"], pa.table({
            "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
            "gpt2_id": pa.array(vocab.astype(np.int32)),
            "text": pa.array(texts, type=pa.string())}),
            {**common, "compact_vocab": True, "vocab_size": len(vocab),
             "vocab_sha256": corpus.vocab_sha256(vocab)})  # fmt: skip
        pools["tokens"] = [t.astype(np.int32) for t in pools["tokens"]]
        samoe_results.POOLS.write(out["pools"], pools, common)
        samoe_results.DOWNSTREAM.write(out["downstream"], suite, common)
        write_manifest(manifest_path, {
            "record_type": "samoe_corpus_manifest", **common, **hashes,
            "tokenizer": {"name": "gpt2", "files_sha256": tokenizer_files_sha256()},
            "n_tokens": {"dense_train": len(dense), "dense_val": len(val), "cpt_train": len(cpt)},
            "n_pool_sequences": pools["role"].value_counts().sort_index().to_dict(),
            "n_downstream": suite["task"].value_counts().sort_index().to_dict(),
            "vocab_size": len(vocab), "vocab_sha256": corpus.vocab_sha256(vocab),
            "files": {name: sha256_file(path) for name, path in out.items()},
        })  # fmt: skip
    print(f"samoe corpus: {len(dense):,} dense / {len(val):,} val / {len(cpt):,} cpt tokens, "
          f"{len(pools)} pool sequences, {len(suite)} downstream examples, vocab {len(vocab)}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
