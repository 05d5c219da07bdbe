"""auto-circuit edge patching on an exchange (benchmarks/peers/exchange.py), run with the
peer's own python (benchmarks/peers/envs.py):

    .peers/auto-circuit-1.0/bin/python benchmarks/peers/edges_auto_circuit.py \\
        --exchange DIR --out DIR/auto-circuit-1.0.npz --n-edges 400   # or --edges index.npz

The edge of docs §15.1 (writer head i = (l, h) → reader head j = (l', h') input X ∈ {q, k, v},
l' > l) in auto-circuit's own terms. The model is loaded as TransformerLens loads any GPT-2
(``convert_gpt2_weights`` into a ``HookedTransformer`` of the directory's shape, no folding,
no centring) with the three hooks auto-circuit's factorized graph needs
(``use_attn_result``, ``use_split_qkv_input``, ``use_hook_mlp_in``), then
``patchable_model(factorized=True, separate_qkv=True, slice_output="last_seq")``. Its
factorized graph has SrcNodes "Resid Start", "A{l}.{h}" (``attn.hook_result``: z W_O of
head h, no b_O) and "MLP {l}", DestNodes "A{l}.{h}.{Q,K,V}" (``hook_{q,k,v}_input``: the
residual head h reads, before LN_1), "MLP {l}" and "Resid End", and one Edge per (src, dest)
with src.layer < dest.layer; we use only its head → head edges "A{l}.{h}->A{l'}.{h'}.X", of
which there are 3·H²·L(L−1)/2, the same set as ours.

A dest PatchWrapper adds Σ_src mask · (patch_src_outs − curr_src_outs) to its input, per dest
head, at every position (``seq_len=None``). With ``AblationType.RESAMPLE`` ablations from the
ref ("corrupt") batch (``src_ablations``), the clean batch as input and the mask 1 on one
edge only (auto-circuit's TREE_PATCH of the circuit "every edge but this one"), reader j's
X-input is x + (z_i^ref − z_i) W_O^i = x + δ_i, every other input clean, everything
downstream recomputed: our edge patch exactly. The metric is auto-circuit's
``multibatch_kl_div(log_softmax(patched), log_softmax(clean))`` = KL(P_clean ‖ P_patched) at
the last position (its ACDC faithfulness target), in float64, averaged over examples (per
equal-length group, groups weighted by size).

``--mode patch_mode`` (default) computes the ablations once per group and, inside
``patch_mode``, sets one edge's ``patch_mask`` entry to 1 per forward (how auto-circuit's ACDC
patches edges one at a time); ``--mode run_circuits`` calls ``run_circuits`` (TREE_PATCH,
RESAMPLE) once per edge with prune scores 1 everywhere but 0 on the edge and
``test_edge_counts=[n_edges − 1]``: the documented route, which recomputes the ablations for
every edge (two forwards per edge and group instead of one), and works on float32 models
only (it sets the masks with ``.float()``, which a float64 model's einsum refuses); in float32
the two agree bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402
from patch_transformer_lens import load_hooked  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def load(model_dir: Path, dtype: torch.dtype):
    """TransformerLens's GPT-2 with the three hooks auto-circuit's factorized graph needs."""
    return load_hooked(model_dir, dtype, use_attn_result=True, use_split_qkv_input=True,
                       use_hook_mlp_in=True)  # fmt: skip


def head_edges(model, n_edges: int | None, seed: int = 0, chosen: Path | None = None):
    """auto-circuit's head → head Edges in our order (reader layer, writer layer, writer
    head, reader head, X): all, a seeded sample of ``n_edges`` kept in that order, or the
    rows ``index`` of ``chosen`` (an .npz, indices into that order); and the (writer,
    reader, input) arrays."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    by_name = {e.name: e for e in model.edges}
    rows = [(wl, wh, rl, rh, x) for rl in range(L) for wl in range(rl) for wh in range(H)
            for rh in range(H) for x in "qkv"]  # fmt: skip
    names = [f"A{wl}.{wh}->A{rl}.{rh}.{x.upper()}" for wl, wh, rl, rh, x in rows]
    heads = [e.name for e in model.edges if e.src.head_idx is not None
             and e.dest.head_idx is not None]  # fmt: skip
    if sorted(heads) != sorted(names):
        raise RuntimeError(f"auto-circuit's head → head edges ({len(heads)}) are not ours "
                           f"({len(names)})")  # fmt: skip
    keep = None
    if chosen is not None:
        with np.load(chosen) as f:
            keep = np.asarray(f["index"], dtype=np.int64)
    elif n_edges is not None and n_edges < len(rows):
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), n_edges, replace=False))
    if keep is not None:
        rows, names = [rows[k] for k in keep], [names[k] for k in keep]
    edges = [by_name[n] for n in names]
    writer = np.array([(r[0], r[1]) for r in rows], dtype=np.int64).reshape(-1, 2)
    reader = np.array([(r[2], r[3]) for r in rows], dtype=np.int64).reshape(-1, 2)
    return edges, writer, reader, np.array([r[4] for r in rows])


def batches(pairs):
    """One auto-circuit PromptPairBatch per equal-length group (a PromptDataLoader each)."""
    from auto_circuit.data import PromptDataLoader, PromptDataset

    clean, ref, correct, incorrect = pairs
    out = []
    for idx in exchange.groups(clean):
        dataset = PromptDataset(
            [torch.as_tensor(clean[i]) for i in idx], [torch.as_tensor(ref[i]) for i in idx],
            [torch.as_tensor(correct[i : i + 1]) for i in idx],
            [torch.as_tensor(incorrect[i : i + 1]) for i in idx],
        )  # fmt: skip
        loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=len(idx))
        out.append((loader, next(iter(loader))))
    return out


def kl(logits, clean_logprobs):
    """auto-circuit's KL(P_clean ‖ P_patched), mean over the batch, in float64."""
    from auto_circuit.utils.tensor_ops import multibatch_kl_div

    logprobs = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return float(multibatch_kl_div(logprobs, clean_logprobs))


def sweep_patch_mode(model, groups, edges) -> np.ndarray:
    from auto_circuit.utils.ablation_activations import src_ablations
    from auto_circuit.utils.graph_utils import patch_mode, set_all_masks

    total = np.zeros(len(edges))
    for _, batch in groups:
        patch_src_outs = src_ablations(model, batch.corrupt)  # RESAMPLE: the ref run's outs
        clean_logprobs = torch.log_softmax(model(batch.clean)[model.out_slice].double(), -1)
        set_all_masks(model, val=0.0)
        with patch_mode(model, patch_src_outs):
            for n, edge in enumerate(edges):
                mask = edge.patch_mask(model)
                mask.data[edge.patch_idx] = 1.0
                total[n] += len(batch.clean) * kl(model(batch.clean)[model.out_slice],
                                                  clean_logprobs)  # fmt: skip
                mask.data[edge.patch_idx] = 0.0
    return total / sum(len(b.clean) for _, b in groups)


def sweep_run_circuits(model, groups, edges) -> np.ndarray:
    from auto_circuit import prune
    from auto_circuit.types import AblationType, PatchType

    prune.tqdm = partial(prune.tqdm, disable=True)  # its progress bars, two per edge

    total = np.zeros(len(edges))
    for loader, batch in groups:
        clean_logprobs = torch.log_softmax(model(batch.clean)[model.out_slice].double(), -1)
        for n, edge in enumerate(edges):
            scores = model.new_prune_scores(init_val=1.0)  # the circuit: every edge ...
            scores[edge.dest.module_name][edge.patch_idx] = 0.0  # ... but this one
            outs = prune.run_circuits(model, loader, [model.n_edges - 1], scores,
                                patch_type=PatchType.TREE_PATCH,
                                ablation_type=AblationType.RESAMPLE)  # fmt: skip
            total[n] += len(batch.clean) * kl(outs[model.n_edges - 1][batch.key],
                                              clean_logprobs)  # fmt: skip
    return total / sum(len(b.clean) for _, b in groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchange", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    sample = "a seeded sample of this many head → head edges (all if more)"
    parser.add_argument("--n-edges", type=int, help=sample)
    parser.add_argument("--edges", type=Path, help="an .npz whose `index` picks the edges")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--mode", choices=("patch_mode", "run_circuits"), default="patch_mode")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.mode == "run_circuits" and args.dtype != "float32":
        parser.error("run_circuits sets its masks with .float(): float32 models only")
    torch.set_num_threads(args.threads)

    from auto_circuit.utils.graph_utils import patchable_model

    tl = load(args.exchange / "model", DTYPES[args.dtype])
    setup = time.perf_counter()
    model = patchable_model(tl, factorized=True, slice_output="last_seq", separate_qkv=True,
                            device=torch.device("cpu"))  # fmt: skip
    edges, writer, reader, x = head_edges(model, args.n_edges, args.seed, args.edges)
    groups = batches(exchange.read_examples(args.exchange / "examples.parquet"))
    setup = time.perf_counter() - setup
    sweep = sweep_patch_mode if args.mode == "patch_mode" else sweep_run_circuits
    with torch.no_grad():
        wall, cpu = time.perf_counter(), time.process_time()
        effects = sweep(model, groups, edges)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peer = (f"auto-circuit {version('auto-circuit')} ({args.mode}, {args.dtype}), "
            f"transformer_lens {version('transformer_lens')}")  # fmt: skip
    np.savez(args.out, writer=writer, reader=reader, input=x, kl=effects.astype(np.float64),
             wall=wall, cpu=cpu, setup=setup, version=peer, graph_edges=model.n_edges)  # fmt: skip
    print(f"{peer}: {len(edges)} of {model.n_edges} graph edges, sweep {wall:.2f} s wall "
          f"{cpu:.2f} s cpu (graph {setup:.2f} s)", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
