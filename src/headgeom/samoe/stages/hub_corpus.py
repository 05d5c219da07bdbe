"""The paper-scale corpus of one SA-MoE Hub family (SAMOE §3.1, §3.2; docs/samoe.md): the
continued-pretraining stream in the family's own tokenizer, packed into a flat uint32 token
file with a JSON sidecar, and the held-out pools.

    python -m headgeom.samoe.stages.hub_corpus \\
        --config-json '{"family":"smollm2","tokenizer":{"repo_id":
        "HuggingFaceTB/SmolLM2-135M","revision":"93ef..."},"seq_len":2048,"data":{...}}' \\
        --out-dir results/samoe-paper/samoe/corpus/smollm2 --threads 16

Writes ``cpt_train.bin``, ``cpt_train.json``, ``pools.parquet`` and ``manifest.json`` under
``--out-dir`` (``headgeom.samoe.hub_corpus.build``). Every Hub dataset and the tokenizer are
checked before anything is written: offline, the job stops naming the repository and what
to set (local files per domain), and writes nothing. A failure leaves none of the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from headgeom.data.corpus_sources import CorpusSourceError
from headgeom.runtime import set_threads
from headgeom.samoe import hub_corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True, help="SAMoEStudy.hub_corpus_config")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1, help="tokenizer threads")
    parser.add_argument("--chunk-tokens", type=int, default=hub_corpus.CHUNK_TOKENS,
                        help="tokens held before each write (memory; never the bytes)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = parser.parse_args(argv)
    try:
        cfg = json.loads(args.config_json)
    except json.JSONDecodeError as err:
        parser.error(f"--config-json is not valid JSON ({err})")
    if args.chunk_tokens < 1:
        parser.error("--chunk-tokens must be at least 1")
    set_threads(args.threads)
    out = {role: args.out_dir / name for role, name in (
        ("cpt_train", "cpt_train.bin"), ("cpt_train_meta", "cpt_train.json"),
        ("pools", "pools.parquet"))}  # fmt: skip
    total = int(cfg["data"]["cpt_train_tokens"])
    with tqdm(total=total, desc=f"corpus {cfg['family']}", unit="tok", unit_scale=True,
              file=sys.stderr, disable=args.no_progress) as bar:  # fmt: skip
        try:
            m = hub_corpus.build(cfg, out, args.out_dir / "manifest.json",
                                 chunk_tokens=args.chunk_tokens, progress=bar.update)  # fmt: skip
        except CorpusSourceError as err:
            sys.exit(f"samoe_hub_corpus {cfg['family']}: {err}")
    shares = ", ".join(f"{d} {s:.3f}" for d, s in m["cpt_train"]["token_shares"].items())
    print(f"samoe corpus {cfg['family']}: {m['n_tokens']['cpt_train']:,} packed tokens "
          f"({m['n_tokens']['cpt_train'] // m['seq_len']:,} × {m['seq_len']}; token shares "
          f"{shares}), {sum(m['n_pool_sequences'].values())} pool sequences, EOS "
          f"{m['eot_id']}, vocab {m['vocab_size']:,}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
