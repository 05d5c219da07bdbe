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

import sys
import time

import pandas as pd
from tqdm import tqdm

from headgeom.atlas import checkpoints as ck
from headgeom.atlas import pair_scoring
from headgeom.atlas import pair_views as views
from headgeom.atlas import results as atlas_results
from headgeom.atlas.model_source import load_tokenizer


def main(argv: list[str] | None = None) -> int:
    args = pair_scoring.parser(__doc__, ("--out-blend", "--out-probes")).parse_args(argv)
    started = time.perf_counter()
    pair = pair_scoring.open_pair(args, "atlas_pair_blend")
    cfg, scorer, a, b, skills = pair.cfg, pair.scorer, pair.a, pair.b, pair.skills
    decode = load_tokenizer(cfg["a"]).decode
    blend, answers = [], []
    for alpha in tqdm(cfg["alphas"], desc=f"blend {cfg['name']}", unit="α", file=sys.stderr):
        scores = scorer.score(ck.blend(a, b, float(alpha)))
        keys = {"pair": cfg["name"], "alpha": float(alpha)}
        blend += views.scored_rows(scores, scorer.base_correct, keys)
        answers += views.probe_rows(scores, skills, decode, keys)
    scorer.restore()
    metadata = pair.metadata(
        "atlas_pair_blend",
        args.threads,
        dtype="blended weights in the model's dtype (float32), float64 KL",
    )
    atlas_results.PAIR_BLEND.write(args.out_blend, pd.DataFrame(blend), metadata)
    atlas_results.PAIR_PROBES.write(args.out_probes, pd.DataFrame(answers), metadata)
    print(f"{len(cfg['alphas'])} blends in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
