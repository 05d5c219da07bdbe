"""The blend dial of a pair of checkpoints: W = (1 − α)·A + α·B of every tensor for each α of
config ``pairs[].alphas``, scored on the pair's windows against both ends (KL to A and to B,
top-1, retention of A's right probe items, accuracy) and every probe item's answer and lead
at each α (:mod:`headgeom.atlas.pair_views`).

    python -m headgeom.atlas.stages.pair_blend --config-json '{"name":..,"a":{..},"b":{..},
        "alphas":[..],"grafts":{..},"lowrank":{..},"sweep":{..}}' --windows windows.parquet \\
        --probes probes.parquet --threads 1 --out-blend blend.parquet --out-probes probes.parquet

The prompts and answers are decoded with A's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd
from tqdm import tqdm

from headgeom import results
from headgeom.atlas import artifacts
from headgeom.atlas import checkpoints as ck
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results
from headgeom.atlas.model_source import load_tokenizer
from headgeom.runtime import pick_device, set_threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.pair_config(pair)")
    p.add_argument("--windows", required=True, help="the pair's atlas_windows Parquet")
    p.add_argument("--probes", required=True, help="the pair's atlas_probes Parquet")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out-blend", required=True)
    p.add_argument("--out-probes", required=True)
    args = p.parse_args(argv)
    cfg = json.loads(args.config_json)
    run = cfg["sweep"]
    set_threads(args.threads)
    started = time.perf_counter()
    try:
        model, a, b, sources = views.load_pair(cfg, pick_device(run["device"]))
        _, scored, windows_meta = artifacts.read_windows(args.windows)
        skills = artifacts.read_skills(args.probes)
        scorer = views.PairScorer(model, a, b, scored, skills, run["batch_size"], run["kl_chunk"],
                                  run["probe_rows"])  # fmt: skip
    except (views.PairError, ValueError) as err:
        sys.exit(f"atlas_pair_blend: {err}")
    decode = load_tokenizer(cfg["a"]).decode
    blend, answers = [], []
    for alpha in tqdm(cfg["alphas"], desc=f"blend {cfg['name']}", unit="α", file=sys.stderr):
        scores = scorer.score(ck.blend(a, b, float(alpha)))
        keys = {"pair": cfg["name"], "alpha": float(alpha)}
        blend += views.scored_rows(scores, scorer.base_correct, keys)
        answers += views.probe_rows(scores, skills, decode, keys)
    scorer.restore()
    metadata = {
        **results.file_metadata("atlas_pair_blend"),
        "pair": cfg["name"],
        "sources": sources,
        "windows_corpora": windows_meta.get("corpora"),
        "threads": args.threads,
        "dtype": "blended weights in the model's dtype (float32), float64 KL",
    }
    atlas_results.PAIR_BLEND.write(args.out_blend, pd.DataFrame(blend), metadata)
    atlas_results.PAIR_PROBES.write(args.out_probes, pd.DataFrame(answers), metadata)
    print(f"{len(cfg['alphas'])} blends in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
