"""The clamp engine (docs §13.3, §15.3) against a naive hook loop on a paper-shape model.

    python benchmarks/clamp_engine.py                        # 16 examples per task
    python benchmarks/clamp_engine.py --n-examples 32 --threads 2

The model has the paper's shape (12 layers × 12 heads, D = 768, d_mlp = 3072, GPT-2
vocabulary, context 512), `learned` geometry, GPT-2 initialisation (cost does not depend
on the weights). Examples: the first ``--n-examples`` evaluation examples of each task
(``headgeom.data.tasks``, real GPT-2 tokenizer). The cases are the §15.3 runs of five
source heads spread over the layers (standing in for a task's top 5): Δ(∅), Δ(later heads),
Δ(MLPs), Δ(both) and C13's "everything but the source", 25 cases per task.

The naive peer is one full forward per case on each equal-length batch, with hooks that
swap the source's z for the reference one and write cached clean z / MLP outputs into the
clamped sites (the tests' independent implementation, batched over examples). Prints per
task and summed: wall and CPU seconds of both, the speed-up and max |Δ| of the per-case
mean drops and of the per-example drops.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.data import tasks
from headgeom.heads.analysis import clamps
from headgeom.heads.analysis.batching import length_batches
from headgeom.heads.analysis.clamps import Case
from headgeom.heads.analysis.patching import logit_difference
from headgeom.model import registry, zoo
from headgeom.model.gpt import site

PAPER_ARCH = dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512)
N_VOCAB = 50257
SOURCES = [(1, 3), (4, 7), (6, 2), (8, 10), (10, 5)]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=16, help="per task")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def task_examples(task: str, n: int):
    from headgeom.data.tokenizer import load_gpt2_tokenizer

    frame, _ = tasks.generate_task(task, load_gpt2_tokenizer(), None)
    frame = frame[frame["split"] == "evaluation"].head(n)
    return (
        [np.asarray(x, dtype=np.int64) for x in frame["clean_ids"]],
        [np.asarray(x, dtype=np.int64) for x in frame["ref_ids"]],
        frame["correct_id"].to_numpy(np.int64),
        frame["incorrect_id"].to_numpy(np.int64),
    )


def path_cases(model, sources=SOURCES) -> list[Case]:
    cases = []
    for src in sources:
        later, mlps = clamps.later_heads(model, src[0]), clamps.mlps_from(model, src[0])
        cases += [Case(src), Case(src, later), Case(src, mlps), Case(src, later | mlps),
                  Case(src, clamps.everything(model).without(src))]  # fmt: skip
    return cases


@torch.no_grad()
def naive(model, clean_ids, ref_ids, correct, incorrect, cases):
    """Per equal-length batch: clean and reference caches, then one hooked full forward per
    case. Returns (clean_ld (N,), patched (N, C)); runs on the model's device."""
    L = model.cfg.n_layer
    device = next(model.parameters()).device
    zs = [site(j, "attn.hook_z") for j in range(L)]
    mlp = [site(j, "hook_mlp_out") for j in range(L)]
    clean_ld, out = np.empty(len(clean_ids)), np.empty((len(clean_ids), len(cases)))
    for index in length_batches([len(c) for c in clean_ids], 128):
        c = torch.as_tensor(np.stack([clean_ids[i] for i in index]), device=device)
        r = torch.as_tensor(np.stack([ref_ids[i] for i in index]), device=device)
        good = torch.as_tensor(correct[index], device=device)
        bad = torch.as_tensor(incorrect[index], device=device)
        logits, cc = model.run_with_cache(c, zs + mlp, last_only=True)
        _, rc = model.run_with_cache(r, zs, last_only=True)
        clean_ld[index] = logit_difference(logits, good, bad).cpu().numpy()
        for k, case in enumerate(cases):
            fns = {}
            for j in range(L):
                heads = [h for h in range(model.cfg.n_head) if (j, h) in case.clamp.heads]
                src = case.source[1] if case.source and case.source[0] == j else None

                def fz(z, j=j, heads=heads, src=src, cc=cc, rc=rc):
                    z = z.clone()
                    z[:, :, heads] = cc[zs[j]][:, :, heads]
                    if src is not None:
                        z[:, :, src] = rc[zs[j]][:, :, src]
                    return z

                fns[zs[j]] = fz
                if j in case.clamp.mlps:
                    fns[mlp[j]] = lambda x, j=j, cc=cc: cc[mlp[j]]
            with model.hooks(fns):
                out[index, k] = logit_difference(model(c, last_only=True), good, bad).cpu().numpy()
    return clean_ld, out


class Clock:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = registry.build_model(zoo.derive_model_config("learned", PAPER_ARCH, {}), N_VOCAB)
    model.eval()
    cases = path_cases(model)
    print(
        f"paper-shape model 12×12, D = 768, V = {N_VOCAB}; {len(cases)} cases per task "
        f"(§15.3 runs of sources {SOURCES}); torch threads {torch.get_num_threads()}"
    )
    total = {"engine": 0.0, "naive": 0.0, "engine_cpu": 0.0, "naive_cpu": 0.0}
    worst_e = worst_d = 0.0
    for task in ("sva", "quote", "plural"):
        pairs = task_examples(task, args.n_examples)
        with Clock() as fast:
            ld, got = clamps.clamp_patch(model, *pairs, cases, batch_size=128, max_rows=4096)
        with Clock() as slow:
            ld_n, want = naive(model, *pairs, cases)
        d_got, d_want = ld[:, None] - got, ld_n[:, None] - want
        de = float(np.abs(d_got.mean(0) - d_want.mean(0)).max())
        dd = float(np.abs(d_got - d_want).max())
        worst_e, worst_d = max(worst_e, de), max(worst_d, dd)
        for key, clock in (("engine", fast), ("naive", slow)):
            total[key] += clock.wall
            total[f"{key}_cpu"] += clock.cpu
        lengths = sorted({len(c) for c in pairs[0]})
        print(f"{task:7s} N={len(pairs[0])} T={lengths}: engine {fast.wall:6.2f} s "
              f"(cpu {fast.cpu:6.2f}), naive {slow.wall:6.2f} s (cpu {slow.cpu:6.2f}), "
              f"speed-up ×{slow.wall / fast.wall:.1f}; max |Δe| {de:.2e}, "
              f"max |Δd(x)| {dd:.2e}")  # fmt: skip
    print(f"all     engine {total['engine']:.2f} s (cpu {total['engine_cpu']:.2f}), naive "
          f"{total['naive']:.2f} s (cpu {total['naive_cpu']:.2f}): speed-up "
          f"×{total['naive'] / total['engine']:.1f} wall, "
          f"×{total['naive_cpu'] / total['engine_cpu']:.1f} cpu; "
          f"max |Δe| {worst_e:.2e}, max |Δd(x)| {worst_d:.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
