"""Quality of one SA-MoE run (SAMOE §11): perplexity on the final pool (all of it and per
domain) and the downstream suite (acc, acc_norm and each task's primary metric; macro = the
unweighted mean of the primaries): the toy suite scored here (``--downstream``), or a Hub
run's lm-evaluation-harness results (``--harness``, written by samoe_harness).

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
from headgeom.io import read_table
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import downstream, harness, results
from headgeom.samoe.checkpoint import load_verified_moe
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
    toy = {"downstream": args.downstream} if args.harness is None else {}
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
    if args.harness is not None:  # a Hub run: the harness's accuracies (samoe_harness)
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
                                            **batch_metadata(args.batch_sequences)})  # fmt: skip
    print(
        f"quality {run}: ppl {rows[0]['value']:.4f}, macro {rows[-1]['value']:.4f}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
