"""Recompute a random sample of a run's edge KLs (docs §15.1) independently, in float64, with
TransformerLens, and compare them with the run's ``edges.parquet``.

    python benchmarks/edges_vs_transformer_lens.py --study results/demo \\
        --runs learned/s42 learned/s43 --n-edges 400

The recomputation shares nothing with the edge engine but the checkpoint loader and the task
file: the model goes to a TransformerLens ``HookedTransformer`` (``model.interop``, learned
GPT-2 form only) in float64 with ``use_split_qkv_input``; for each sampled edge writer i =
(l, h) → reader j = (l', h') input X, the hook ``blocks.{l'}.hook_{x}_input`` (the residual
each head reads, before LN_1) gets, for head h' only, the clean ``resid_pre`` of layer l'
plus δ_i = (z_i^ref − z_i) W_O^i from TransformerLens's own clean and reference caches; the
whole model then runs, and KL(P_clean ‖ P_patched) at the final position is
Σ p (log p − log q) of float64 log-softmaxes, averaged over the run's examples (the
``example_ids`` its metadata records; older files: the split's first examples in file
order). Prints, per run, the sample's largest relative and absolute differences, the
Spearman correlation and the count of negative KLs in the whole file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from scipy.stats import spearmanr

from headgeom.data.task_files import model_inputs, read_task
from headgeom.model.checkpoint import load_verified
from headgeom.model.interop import to_transformer_lens


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="results/demo")
    parser.add_argument("--runs", nargs="+", default=["learned/s42", "learned/s43"])
    parser.add_argument("--n-edges", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def examples(edges_path: Path, task_path: Path, vocab):
    meta = {k.decode(): v.decode() for k, v in pq.read_schema(edges_path).metadata.items()}
    split = pq.read_table(edges_path, columns=["split"]).column(0)[0].as_py()
    task = read_task(task_path, [split])
    if "example_ids" in meta:
        ids = json.loads(meta["example_ids"])
        frame = task.frame.set_index("example_id").loc[ids].reset_index()
    else:  # files before the per-condition selection: the split's first 16, file order
        frame = task.frame.head(16)
    return model_inputs(frame, vocab), len(frame)


@torch.no_grad()
def tl_edge_kl(tl, clean: torch.Tensor, ref: torch.Tensor, edge) -> torch.Tensor:
    """KL (B,) of one edge on a batch of equal-length examples, all in TransformerLens."""
    wl, wh, rl, rh, x = edge
    clean_logits, cc = tl.run_with_cache(clean, names_filter=lambda n: n.endswith(("z", "pre")))
    _, rc = tl.run_with_cache(ref, names_filter=lambda n: n.endswith("hook_z"))
    z_c, z_r = cc[f"blocks.{wl}.attn.hook_z"], rc[f"blocks.{wl}.attn.hook_z"]
    delta = (z_r[:, :, wh] - z_c[:, :, wh]) @ tl.blocks[wl].attn.W_O[wh]  # (B, T, D)
    patched_input = cc[f"blocks.{rl}.hook_resid_pre"] + delta

    def swap(t, hook):  # t: (B, T, H, D), the residual each head reads
        t = t.clone()
        t[:, :, rh] = patched_input
        return t

    logits = tl.run_with_hooks(clean, fwd_hooks=[(f"blocks.{rl}.hook_{'qkv'[x]}_input", swap)])
    logp = torch.log_softmax(clean_logits[:, -1].double(), -1)
    logq = torch.log_softmax(logits[:, -1].double(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def recheck(study: Path, run: str, n_edges: int, seed: int) -> dict:
    model_name, seed_dir = run.split("/")
    edges_path = study / "edges" / model_name / seed_dir / "edges.parquet"
    table = pq.read_table(edges_path).to_pandas()
    model, vocab, _ = load_verified(
        study / "models" / model_name / seed_dir / "model.safetensors",
        study / "models" / model_name / seed_dir / "manifest.json",
    )
    tl = to_transformer_lens(model.eval()).to(torch.float64)
    tl.cfg.dtype = torch.float64
    tl.set_use_split_qkv_input(True)
    inputs, n_examples = examples(
        edges_path, study / "tasks" / f"{table.task.iloc[0]}.parquet", vocab
    )
    lengths = [len(c) for c in inputs.clean_ids]
    groups = {n: [i for i, m in enumerate(lengths) if m == n] for n in sorted(set(lengths))}
    rng = np.random.default_rng(seed)
    sample = table.iloc[rng.choice(len(table), size=min(n_edges, len(table)), replace=False)]
    read_index = {"Q": 0, "K": 1, "V": 2, 0: 0, 1: 1, 2: 2}
    ours, ref = sample["kl"].to_numpy(), np.empty(len(sample))
    for k, row in enumerate(sample.itertuples()):
        edge = (row.writer_layer, row.writer_head, row.reader_layer, row.reader_head,
                read_index[row.read_type])  # fmt: skip
        total = 0.0
        for index in groups.values():
            clean = torch.as_tensor(np.stack([inputs.clean_ids[i] for i in index]))
            refs = torch.as_tensor(np.stack([inputs.ref_ids[i] for i in index]))
            total += float(tl_edge_kl(tl, clean.long(), refs.long(), edge).sum())
        ref[k] = total / n_examples
    big = ref >= 1e-9
    rel = np.abs(ours[big] - ref[big]) / ref[big]
    return {
        "run": run,
        "n_examples": n_examples,
        "n_sampled": len(sample),
        "n_kl_ge_1e-9": int(big.sum()),
        "max_rel_diff_kl_ge_1e-9": float(rel.max()) if big.any() else float("nan"),
        "median_rel_diff": float(np.median(rel)) if big.any() else float("nan"),
        "max_abs_diff": float(np.abs(ours - ref).max()),
        "spearman": float(spearmanr(ours, ref).statistic),
        "negative_kl_in_file": int((table["kl"] < 0).sum()),
        "edges_in_file": len(table),
        "ref_kl_range": [float(ref.min()), float(ref.max())],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    for run in args.runs:
        out = recheck(Path(args.study), run, args.n_edges, args.seed)
        print(json.dumps(out), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
