"""Tokenization throughput: the corpus pipeline's parallel tokenizer against a plain loop.

    python benchmarks/tokenization.py                      # embedded demo text, no network
    python benchmarks/tokenization.py --threads 16 --docs 40000
    python benchmarks/tokenization.py --files 'data/*.parquet' --format parquet

Both sides encode the same documents with the same GPT-2 tokenizer and append EOT after each:
"plain" calls ``tokenizer.encode`` once per document in a Python loop; "ours" is
``headgeom.data.corpus_sources.tokenize_stream`` (``encode_batch`` over ``--batch-docs`` documents
on ``--threads`` Rust threads, the next batch prepared while one is encoded). The two token
arrays must be identical; the script prints tokens/s of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _documents(args: argparse.Namespace) -> list[str]:
    if args.files:
        from headgeom.data import corpus_sources

        cfg = corpus_sources.resolve_source(
            {"source": args.format, "files": [args.files], "n_val_tokens": 1, "batch_docs": 1024}
            | ({"text_column": args.text_column} if args.format != "text" else {})
        )
        source = corpus_sources.open_source(cfg)
        docs: list[str] = []
        for batch in corpus_sources.text_batches(source, "train"):
            docs += batch
            if len(docs) >= args.docs:
                break
        return docs[: args.docs]
    from headgeom.data.corpus import iter_demo_texts

    # Demo documents are short (~80 tokens); --join glues k of them into one document, so the
    # lengths resemble FineWeb-Edu's (~1,000 tokens).
    texts = iter_demo_texts(1729, "benchmark")
    return ["\n\n".join(next(texts) for _ in range(args.join)) for _ in range(args.docs)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="tokenizer threads")
    p.add_argument("--docs", type=int, default=4000, help="documents to encode")
    p.add_argument("--join", type=int, default=12, help="demo texts per document")
    p.add_argument("--batch-docs", type=int, default=1024, help="documents per encode_batch")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each (best is kept)")
    p.add_argument("--files", help="glob of local files instead of the demo text")
    p.add_argument("--format", choices=("parquet", "jsonl", "text"), default="parquet")
    p.add_argument("--text-column", default="text")
    args = p.parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the first encode

    from headgeom.data.corpus_sources import tokenize_stream
    from headgeom.data.tokenizer import EOT_ID, load_gpt2_tokenizer

    tok = load_gpt2_tokenizer()
    docs = _documents(args)

    def plain() -> np.ndarray:
        ids: list[int] = []
        for text in docs:
            ids += tok.encode(text, add_special_tokens=False).ids
            ids.append(EOT_ID)
        return np.asarray(ids, dtype=np.uint16)

    reference = plain()
    n = len(reference)

    def ours() -> np.ndarray:
        batches = (docs[i : i + args.batch_docs] for i in range(0, len(docs), args.batch_docs))
        return tokenize_stream(batches, tok, n).tokens

    if not np.array_equal(ours(), reference):
        raise SystemExit("the parallel tokenizer's tokens differ from the plain loop's")

    def best(fn) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    t_plain, t_ours = best(plain), best(ours)
    print(
        f"{len(docs):,} documents, {n:,} tokens ({n / len(docs):,.0f} per document), "
        f"{args.threads} tokenizer thread(s), best of {args.repeats}; identical tokens"
    )
    print(f"plain per-document encode loop: {n / t_plain:12,.0f} tokens/s")
    print(f"ours (tokenize_stream):         {n / t_ours:12,.0f} tokens/s")
    print(f"ratio ours / plain:             {t_plain / t_ours:12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
