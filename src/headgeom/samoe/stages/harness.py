"""The paper's downstream suite of one SA-MoE run (SAMOE §11): HellaSwag, ARC-Easy, PIQA and
WinoGrande through lm-evaluation-harness (zero-shot, log-likelihood only) in the family's
tokenizer; one row per task and metric (``headgeom.samoe.results.HARNESS``), read by
samoe_quality.

    python -m headgeom.samoe.stages.harness \\
        --run-json '{"family":"smollm2","variant":"latest","seed":42}' \\
        --checkpoint model.safetensors --manifest manifest.json \\
        --corpus-manifest corpus/smollm2/manifest.json \\
        --downstream-json '{"tasks":["hellaswag",...],"harness_commit":"b954...","max_len":2048}' \\
        --out harness.parquet

Runs in the harness's own environment (envs/lm-eval.yaml; locally
``python requirements/lm_eval_env.py``). The installed harness must be the pinned commit, the
tokenizer the corpus's, and every task's dataset readable: otherwise the job stops naming
what is missing (offline: the dataset and what to set) before it loads the checkpoint, and
writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from headgeom.io import read_json
from headgeom.runtime import analysis_device, set_threads
from headgeom.samoe import harness, results
from headgeom.samoe.checkpoint import load_verified_moe
from headgeom.samoe.manifest import run_metadata

#: Requests per forward when downstream.batch_size is not set.
BATCH_SIZE = 16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-json", required=True)
    parser.add_argument("--downstream-json", required=True, help="the config's downstream block")
    for name in ("checkpoint", "manifest", "corpus-manifest", "out"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    parser.add_argument("--device", required=True, help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--allow-other-harness",
        action="store_true",
        help="run on whatever harness is installed (recorded; development only)",
    )
    args = parser.parse_args(argv)
    run, cfg = json.loads(args.run_json), json.loads(args.downstream_json)
    set_threads(args.threads)
    try:
        device = str(analysis_device(args.device))  # the analyses' choice and refusal
    except ValueError as err:
        parser.error(str(err))
    name = f"samoe_harness {run['family']}/{run['variant']}/s{run['seed']}"
    try:  # everything that can be missing is checked before the checkpoint is read
        found = harness.check_harness(cfg.get("harness_commit"), args.allow_other_harness)
        manager = harness.task_manager(cfg.get("task_dir"))
        tasks = harness.load_tasks(cfg["tasks"], manager)
        tok = harness.family_tokenizer(read_json(args.corpus_manifest), run["family"])
    except harness.HarnessError as err:
        sys.exit(f"{name}: {err}; {args.out} is not written")
    model, _, manifest = load_verified_moe(args.checkpoint, args.manifest)
    lm = harness.lm_class()(model.to(device), tok, cfg["max_len"],
                            batch_size=cfg.get("batch_size", BATCH_SIZE), device=device,
                            name=name.split(" ", 1)[1])  # fmt: skip
    out = harness.evaluate(lm, tasks, manager)
    frame = pd.DataFrame(harness.result_frame(out, cfg["tasks"], found)).assign(**run)
    meta = run_metadata(run, manifest, cfg) | {
        **found, "device": device, "dtype": "float32", "max_len": cfg["max_len"],
        "tokenizer": getattr(tok, "name_or_path", None),
    }  # fmt: skip
    results.HARNESS.write(args.out, frame, meta)
    summary = ", ".join(f"{r.task} {r.metric} {r.value:.4f}" for r in frame.itertuples()
                        if r.primary)  # fmt: skip
    print(f"{name}: {summary} (lm-eval {found['harness_version']}, commit "
          f"{found['harness_commit']})", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
