"""Block ablation atlas: stacked edits (headgeom.heads.analysis.ablation.block_atlas) against a
naive peer (one full forward per edit and window batch, one per edit and task prompt group),
side by side, on a random demo-size model (4 layers, 4 heads, d_model 64, n_ctx 64).

    python benchmarks/ablation_atlas.py --threads 1

``--paper-shape`` measures the atlas's memory at the paper's shape instead (12 × 12 heads,
D = 768, V = 50,257, windows of n_ctx = 512): the edits of the last layer (every block,
zero and mean: the chunk sizes and hence the peak are those of the full atlas, whose other
layers only repeat them) on ``--n-windows`` windows with ``--work-mb`` of working memory,
printing the plan, the process's peak RSS (getrusage) beside the resident size before the
atlas, the plan's estimate, and the unchunked implementation's need for the same windows
(one stacked forward's float64 logits, max_rows × T × V × 8 bytes, max_rows = 1,024).

    python benchmarks/ablation_atlas.py --paper-shape --work-mb 4096 --threads 2
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from headgeom.heads.analysis import ablation
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


def rss_mb() -> float:
    """This process's peak resident set size (MB; Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def paper_shape(args) -> None:
    arch = dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512)
    torch.manual_seed(0)
    model = registry.build_model(zoo.derive_model_config("learned", arch, {}), 50257).eval()
    rng = np.random.default_rng(0)
    windows = torch.as_tensor(rng.integers(0, 50257, (args.n_windows, 512)))
    means = ablation.write_means(model, windows[:1], batch_size=1)
    task = ablation.TaskPrompts(
        "sva", list(rng.integers(0, 50257, (64, 12))), rng.integers(0, 50257, 64),
        rng.integers(0, 50257, 64),
    )  # fmt: skip
    edits = [e for e in ablation.atlas_edits(model) if e.layer == arch["n_layer"] - 1]
    work = args.work_mb * 2**20
    plan = ablation.atlas_plan(model, 511, args.batch_size, work, 12, len(edits))
    before, peak_before = current_rss_mb(), rss_mb()
    t0 = time.perf_counter()
    ablation.block_atlas(model, means, windows, [task], args.batch_size, work, edits=edits)
    wall = time.perf_counter() - t0
    peak = rss_mb()
    print(f"paper shape: 12 × 12, D = 768, V = 50,257, T = 511; {args.n_windows} windows, "
          f"{len(edits)} edits (layer 11), 64 retention prompts; {wall:.0f} s")  # fmt: skip
    print(f"plan at work_mb {args.work_mb}: {plan}")
    print(f"RSS before the atlas: {before:,.0f} MB (peak so far {peak_before:,.0f} MB)")
    print(f"peak RSS: {peak:,.0f} MB; atlas working memory {peak - before:,.0f} MB "
          f"(plan's estimate {plan.peak_bytes / 2**20:,.0f} MB, budget {args.work_mb:,} MB, "
          f"job request work_mb + 2,000 = {args.work_mb + 2000:,} MB)")  # fmt: skip
    unchunked = 1024 * 511 * 50257 * 8
    print(f"unchunked (max_rows 1,024 rows × 511 × 50,257 float64 logits): "
          f"{unchunked / 2**30:,.0f} GiB; ratio to the measured peak "
          f"{unchunked / 2**20 / peak:,.0f}×")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paper-shape", action="store_true", help="memory at paper shape")
    parser.add_argument("--work-mb", type=int, default=4096)
    parser.add_argument("--n-windows", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    set_threads(args.threads)
    if args.paper_shape:
        return paper_shape(args)
    torch.manual_seed(0)
    model = registry.build_model(zoo.derive_model_config("learned", ARCH, {}), 632).eval()
    rng = np.random.default_rng(0)
    windows = torch.as_tensor(rng.integers(0, 632, (8, 64)))
    means = ablation.write_means(
        model, torch.as_tensor(rng.integers(0, 632, (64, 64))), batch_size=16
    )
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
        ablation.block_atlas(model, means, windows, tasks, batch_size=16, work_bytes=2 * 2**30)
        t2 = time.perf_counter()
    print(f"naive (one forward per edit): {t1 - t0:.2f} s")
    print(f"block_atlas (stacked, resumed): {t2 - t1:.2f} s  (also descriptors and retention)")
    print(f"ratio naive / stacked: {(t1 - t0) / (t2 - t1):.2f}")


if __name__ == "__main__":
    main()
