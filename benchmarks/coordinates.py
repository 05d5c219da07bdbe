"""Our batched single-direction patches (docs §15.2) against the naive reference, one hooked
full forward per direction and example, on one paper-shape model and SVA examples.

    python benchmarks/coordinates.py --threads 2          # 4 SVA examples, layer 6

The model has the paper's shape (12 × 12 heads, D = 768, V = 50,257) with the `learned`
geometry and random GPT-2-initialised weights (the cost does not depend on the weights).
Ours computes every direction of the three sites (D after W_O, H·d before W_O, H·d
Haar-rotated: 2,304 directions) on every example; the naive loop runs the first
``--naive-directions`` directions of the two unrotated sites (``direction_drops_naive``,
``limit``) and its time for all directions is EXTRAPOLATED per direction (the rotated site
costs the naive loop what the unrotated one does). max |Δdrop| compares the two on the
directions both ran.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patching_engine import N_VOCAB, paper_model, task_examples  # noqa: E402

from headgeom.heads.analysis import coordinates as C  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=4)
    parser.add_argument("--layer", type=int, default=6, help="l*, the best head's layer")
    parser.add_argument("--naive-directions", type=int, default=48)
    parser.add_argument("--max-rows", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model = paper_model(args.threads)
    H, d, D = model.cfg.n_head, model.cfg.d_head, model.cfg.d_model
    clean, ref, good, bad = task_examples("sva", args.n_examples, "validation")
    N = len(clean)
    rot = C.head_rotations(H, d, 1503)
    print(f"model 12×12, D=768, V={N_VOCAB}; {N} SVA validation examples, lengths "
          f"{sorted({len(c) for c in clean})}; layer {args.layer}; torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip

    t = time.perf_counter()
    ours = C.direction_drops(model, clean, ref, good, bad, args.layer, rot, N, args.max_rows)
    ours_s = time.perf_counter() - t
    n_dirs = sum(v[0].shape[1] for v in ours.values())
    assert n_dirs == D + 2 * H * d

    t = time.perf_counter()
    naive = C.direction_drops_naive(model, clean, ref, good, bad, args.layer,
                                    limit=args.naive_directions)  # fmt: skip
    naive_spent = time.perf_counter() - t
    n_naive = sum(v.shape[1] for v in naive.values())
    naive_s = naive_spent * n_dirs / n_naive
    diff = max(float(np.abs(ours[s][0][:, : v.shape[1]] - v).max()) for s, v in naive.items())

    print(f"\n{'engine':<14}{'directions/s':>14}{'total s (' + str(n_dirs) + ' dirs)':>22}"
          f"{'ratio':>8}{'max |Δdrop|':>14}")  # fmt: skip
    print(f"{'ours':<14}{n_dirs / ours_s:>14.1f}{ours_s:>22.2f}{1:>8.1f}{'—':>14}  (measured)")
    ratio = naive_s / ours_s
    print(
        f"{'naive loop':<14}{n_dirs / naive_s:>14.2f}{naive_s:>22.1f}{ratio:>8.1f}"
        f"{diff:>14.2e}  (extrapolated from {n_naive} directions, {naive_spent:.1f} s)"
    )
    per_run = ours_s / N * (240 + 240) * 3  # validation + evaluation, three tasks (paper)
    print(f"projected, one paper model (3 tasks × 240 validation + 240 evaluation examples) on "
          f"this CPU: ours {per_run / 60:.1f} min, naive loop "
          f"{per_run * naive_s / ours_s / 3600:.1f} h")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
