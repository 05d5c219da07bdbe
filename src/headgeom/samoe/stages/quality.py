"""Quality of one SA-MoE run (SAMOE §11): perplexity on the final pool (all of it and per
domain) and the downstream suite (acc, acc_norm and each task's primary metric; macro = the
unweighted mean of the primaries): the toy suite scored here (``--downstream``), a Hub
run's lm-evaluation-harness results (``--harness``, written by samoe_harness), or none
(``--no-suite``: the harness left out offline; perplexity only). With ``--dense`` (an imported
family's dense source) the dense model's perplexity on the same sequences too, in the file's
metadata (``ppl_dense``: subset -> perplexity), so a run's perplexity can be read against the
model it was upcycled from.

    python -m headgeom.samoe.stages.quality \\
        --run-json '{"family":"toy","variant":"latest","seed":42}' \\
        --checkpoint model.safetensors --manifest manifest.json --pools pools.parquet \\
        --downstream downstream.parquet --corpus-manifest corpus/manifest.json \\
        --out quality.parquet [--device auto|cpu|cuda] [--batch-sequences N]

Perplexity runs ``--batch-sequences`` sequences a forward (config
``capture.batch_sequences``; default 8) and keeps only each forward's summed NLL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from headgeom.data.corpus import compact
from headgeom.hashing import manifest_hash
from headgeom.io import read_table
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import downstream, harness, results
from headgeom.samoe.checkpoint import load_verified_dense, load_verified_moe
from headgeom.samoe.hub import DenseLM
from headgeom.samoe.manifest import (
    add_batch_sequences,
    batch_metadata,
    run_metadata,
    verified_inputs,
)
from headgeom.samoe.pools import pool, read_pools
from headgeom.samoe.quality import PERPLEXITY_BATCH, perplexity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    for name in ("checkpoint", "manifest", "pools", "corpus-manifest", "out"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    suite_file = parser.add_mutually_exclusive_group(required=True)
    suite_file.add_argument("--downstream", type=Path, help="the toy suite (samoe_corpus)")
    suite_file.add_argument("--harness", type=Path, help="the run's lm-eval suite (samoe_harness)")
    suite_file.add_argument(
        "--no-suite", action="store_true", help="no downstream suite (the harness left out offline)"
    )
    parser.add_argument("--dense", type=Path, help="the family's dense checkpoint (ppl_dense)")
    parser.add_argument("--dense-manifest", type=Path, help="its manifest")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", required=True, help="auto (CUDA when present), cpu, cuda")
    add_batch_sequences(parser)
    args = parser.parse_args(argv)
    try:
        device = analysis_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    run = json.loads(args.run_json)
    set_threads(args.threads)
    if (args.dense is None) != (args.dense_manifest is None):
        parser.error("--dense and --dense-manifest go together")
    toy = {"downstream": args.downstream} if args.downstream is not None else {}
    verified_inputs(args.corpus_manifest, {"pools": args.pools, **toy})
    model, vocab, manifest = load_verified_moe(args.checkpoint, args.manifest)
    model = model.to(device)  # perplexity and the suite score on the model's device
    final = pool(read_pools(args.pools), "final", vocab)
    rows = []
    domains = np.asarray(final.domains)
    for subset in ("all", "prose", "code", "math"):
        ids = final.ids if subset == "all" else final.ids[domains == subset]
        value = perplexity(model, ids, batch_size=args.batch_sequences or PERPLEXITY_BATCH)
        rows.append({"metric": "ppl", "subset": subset, "value": value,
                     "n": ids[:, 1:].numel()})  # fmt: skip
    dense_meta = {}
    if args.dense is not None:  # the dense source on the same sequences
        state, source, dense_vocab = load_verified_dense(args.dense, args.dense_manifest)
        if not np.array_equal(dense_vocab, vocab):
            raise ValueError(f"{args.dense}: its vocabulary map is not the run's")
        dense = DenseLM(source, state).to(device)
        ppl_dense = {}
        for subset in ("all", "prose", "code", "math"):
            ids = final.ids if subset == "all" else final.ids[domains == subset]
            ppl_dense[subset] = perplexity(
                dense, ids, batch_size=args.batch_sequences or PERPLEXITY_BATCH
            )
        dense_meta = {"ppl_dense": ppl_dense,
                      "dense_manifest_hash": manifest_hash(args.dense_manifest)}  # fmt: skip
        del dense, state
    if args.no_suite:  # the harness left out (offline): perplexity only
        pass
    elif args.harness is not None:  # a Hub run: the harness's accuracies (samoe_harness)
        rows += harness.quality_rows(harness.read_run_suite(args.harness, manifest))
    else:
        suite = read_table(args.downstream, results.DOWNSTREAM.names).to_pandas()
        scored = downstream.score(
            model, suite, lambda ids: compact(np.asarray(ids), vocab).tolist()
        )
        primaries = []
        for task, group in scored.groupby("task", sort=False):
            for metric in ("acc", "acc_norm"):
                rows.append({"metric": metric, "subset": task, "value": group[metric].mean(),
                             "n": len(group)})  # fmt: skip
            value = group[downstream.PRIMARY[task]].mean()
            primaries.append(value)
            rows.append({"metric": "primary", "subset": task, "value": value, "n": len(group)})
        rows.append({"metric": "primary", "subset": "macro", "value": float(np.mean(primaries)),
                     "n": len(scored)})  # fmt: skip
    frame = pd.DataFrame(rows).assign(**run)
    results.QUALITY.write(args.out, frame, {**run_metadata(run, manifest, device=device),
                                            **batch_metadata(args.batch_sequences),
                                            **dense_meta})  # fmt: skip
    dense_note = f", dense ppl {dense_meta['ppl_dense']['all']:.4f}" if dense_meta else ""
    macro = f", macro {rows[-1]['value']:.4f}" if rows[-1]["metric"] == "primary" else ""
    print(f"quality {run}: ppl {rows[0]['value']:.4f}{macro}{dense_note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
