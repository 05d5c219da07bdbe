"""Block ablation atlas: stacked edits (headgeom.analysis.ablation.block_atlas) against a
naive peer (one full forward per edit and window batch, one per edit and task prompt group),
side by side, on a random demo-size model (4 layers, 4 heads, d_model 64, n_ctx 64).

    python benchmarks/ablation_atlas.py --threads 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.analysis import ablation
from headgeom.model import registry, zoo
from headgeom.runtime import set_threads

ARCH = dict(n_layer=4, n_head=4, d_model=64, d_head=16, d_mlp=256, n_ctx=64)


def naive(model, means, windows, tasks):
    inputs = windows[:, :-1]
    base = torch.log_softmax(model(inputs).double(), -1)
    for edit in ablation.atlas_edits(model):
        logp = torch.log_softmax(ablation.edited_logits(model, inputs, edit, means).double(), -1)
        (base.exp() * (base - logp)).sum(-1).mean()
        with model.hooks(ablation.edit_hooks(edit, means)):
            for task in tasks:
                model(torch.as_tensor(np.stack(task.clean_ids)), last_only=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    model = registry.build_model(zoo.derive_model_config("learned", ARCH, {}), 632).eval()
    rng = np.random.default_rng(0)
    windows = torch.as_tensor(rng.integers(0, 632, (8, 64)))
    means = ablation.write_means(model, torch.as_tensor(rng.integers(0, 632, (64, 64))))
    tasks = [
        ablation.TaskPrompts(
            t, list(rng.integers(0, 632, (80, n))), rng.integers(0, 632, 80), rng.integers(1, 9, 80)
        )
        for t, n in (("a", 5), ("b", 11), ("c", 8))
    ]
    with torch.no_grad():
        t0 = time.perf_counter()
        naive(model, means, windows, tasks)
        t1 = time.perf_counter()
        ablation.block_atlas(model, means, windows, tasks, batch_size=16, max_rows=1024)
        t2 = time.perf_counter()
    print(f"naive (one forward per edit): {t1 - t0:.2f} s")
    print(f"block_atlas (stacked, resumed): {t2 - t1:.2f} s  (also descriptors and retention)")
    print(f"ratio naive / stacked: {(t1 - t0) / (t2 - t1):.2f}")


if __name__ == "__main__":
    main()
