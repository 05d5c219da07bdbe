"""Our exact head-patching engine against TransformerLens on the same model and examples
(docs §10.1), plus the approximate attribution-patching pre-filter.

    python benchmarks/patching_engine.py                    # paper shape, 24 examples per task
    python benchmarks/patching_engine.py --n-examples 16 --threads 2
    python benchmarks/patching_engine.py --skip-tl          # ours and attribution only

The model has the paper's shape (12 layers × 12 heads, D = 768, d_mlp = 3072, GPT-2
vocabulary V = 50,257, context 512) and the `learned` geometry with GPT-2 initialisation
(the engines' cost does not depend on the weights). Examples are real task examples of
``headgeom.data.tasks`` (default config) tokenized with the real GPT-2 tokenizer, so model ids are
GPT-2 ids; the first ``--n-examples`` of the evaluation split of each task.

For each task and summed it prints: our exact engine's time, TransformerLens's
(``HookedTransformer`` built by ``headgeom.model.interop.to_transformer_lens``: reference
``run_with_cache`` + clean forward + ``patching.get_act_patch_attn_head_out_all_pos`` with
a mean-logit-difference metric), the speed-up, the max |Δ| between the two engines' per-head
mean effects e_{l,h}, and the multiply-add FLOPs our engine must do (a lower bound on its
work: matmuls only, no LayerNorm/softmax/GELU) with the GFLOP/s achieved. Then the
attribution mode (APPROXIMATE: 2 forwards + 1 backward): its time, its speed-up over our
exact engine and the Pearson/Spearman correlation of its e_{l,h} (and per-example drops)
with the exact ones; on a trained demo model too when ``results/demo`` holds one.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from headgeom.data import tasks
from headgeom.heads.analysis.batching import first_difference
from headgeom.heads.analysis.patching import attribution_patch, patch_all_heads_fast
from headgeom.model import registry, zoo

PAPER_ARCH = dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512)
N_VOCAB = 50257
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=24, help="per task")
    parser.add_argument("--split", default="evaluation")
    parser.add_argument("--batch-size", type=int, default=128, help="examples per batch (ours)")
    parser.add_argument("--max-rows", type=int, default=4096, help="rows per forward (ours)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-tl", action="store_true", help="do not run TransformerLens")
    parser.add_argument(
        "--demo-model",
        default=str(ROOT / "results/demo/models/learned/s42"),
        help="trained model directory (model.safetensors + manifest.json) for the "
        "attribution correlation; skipped when absent",
    )
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- examples
def task_examples(
    task: str, n: int, split: str, vocab: np.ndarray | None = None, tokenizer=None, config=None
):
    """First ``n`` examples of ``split``: (clean, ref, correct, incorrect) in model ids,
    built with ``tokenizer`` (default GPT-2's) and the task's ``config`` block (default the
    paper's)."""
    from headgeom.data.tokenizer import load_gpt2_tokenizer

    frame, _ = tasks.generate_task(task, tokenizer or load_gpt2_tokenizer(), config)
    frame = frame[frame["split"] == split].head(n)
    return _ids(frame, vocab)


def _ids(frame, vocab):
    from headgeom.data.corpus import compact

    def conv(x):
        x = np.asarray(x, dtype=np.int64)
        return x if vocab is None else np.asarray(compact(x, vocab))

    return (
        [conv(x) for x in frame["clean_ids"]],
        [conv(x) for x in frame["ref_ids"]],
        conv(frame["correct_id"].to_numpy()),
        conv(frame["incorrect_id"].to_numpy()),
    )


def paper_model(threads: int | None = None, geometry: str = "learned"):
    """A paper-shape model (12 × 12, D = 768, V = 50,257) of ``geometry`` with seeded random
    GPT-2-initialised weights (costs do not depend on them), eval mode; ``threads`` sets
    torch's intra-op threads first."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    return registry.build_model(zoo.derive_model_config(geometry, PAPER_ARCH, {}), N_VOCAB).eval()


# --------------------------------------------------------------------------- FLOPs
#: ``transformers`` families (``headgeom.model.families``) whose MLP is gated: gate, up and
#: down projections, three D × d_mlp matrices (``intermediate_size``).
GATED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3")


def block_token_flops(cfg) -> tuple[int, int, int]:
    """Multiply-add FLOPs (×2) per token of: reader W_{Q,K,V}, writer W_O, MLP. Our GPT
    models read every head's key and value and have a two-matrix MLP; a ``transformers``
    model (``headgeom.model.hf``, a ``cfg.hf_config``) reads ``n_kv_head`` key/value heads
    and has a gated MLP."""
    hd = cfg.n_head * cfg.d_head
    if not hasattr(cfg, "hf_config"):
        return 2 * cfg.d_model * 3 * hd, 2 * hd * cfg.d_model, 4 * cfg.d_model * cfg.d_mlp
    if cfg.family not in GATED_FAMILIES:
        raise ValueError(
            f"block_token_flops: no FLOP model of the {cfg.family!r} family's blocks; "
            f"known: {', '.join(GATED_FAMILIES)}"
        )
    kv = cfg.n_kv_head * cfg.d_head
    d_mlp = cfg.hf_config["intermediate_size"]
    return 2 * cfg.d_model * (hd + 2 * kv), 2 * hd * cfg.d_model, 6 * cfg.d_model * d_mlp


def attention_flops(cfg, n_keys: int) -> int:
    """q·k and Σ a v for one query against ``n_keys`` keys, all heads."""
    return 4 * cfg.n_head * cfg.d_head * n_keys


def engine_flops(cfg, B: int, T: int, p: int) -> int:
    """Matmul FLOPs of ``patch_batch_fast`` on B examples of length T whose first
    difference is at p (prefix reuse, last layer at the final position only)."""
    read, write, mlp = block_token_flops(cfg)
    L, H, S = cfg.n_layer, cfg.n_head, T - p
    full = T * L * (read + write + mlp) + L * sum(attention_flops(cfg, t + 1) for t in range(T))
    total = 2 * B * (full + 2 * cfg.d_model * cfg.n_vocab)  # clean + reference, last logits
    suffix_attn = sum(attention_flops(cfg, p + i + 1) for i in range(S))
    per_row = 0
    for layer in range(L):
        if layer == L - 1:
            per_row += write + mlp  # patched last layer: final position only
            continue
        per_row += S * (write + mlp)  # patched layer: cached z, W_O and MLP
        per_row += (L - 2 - layer) * (S * (read + write + mlp) + suffix_attn)
        per_row += S * read + attention_flops(cfg, T) + write + mlp  # last layer
        per_row += 4 * cfg.d_model  # two answer logits
    return total + B * H * per_row


def forward_flops(cfg, T: int, logits: int) -> int:
    """Matmul FLOPs of one forward of a T-token prompt with the full-vocabulary logits of
    its last ``logits`` positions."""
    read, write, mlp = block_token_flops(cfg)
    fwd = T * cfg.n_layer * (read + write + mlp)
    fwd += cfg.n_layer * sum(attention_flops(cfg, t + 1) for t in range(T))
    return fwd + logits * 2 * cfg.d_model * cfg.n_vocab


def tl_flops(cfg, B: int, T: int) -> int:
    """Matmul FLOPs of TransformerLens's sweep: one full forward (all T logits) per head,
    plus the clean and reference forwards."""
    return B * forward_flops(cfg, T, T) * (cfg.n_layer * cfg.n_head + 2)


def plain_flops(cfg, B: int, T: int) -> int:
    """Matmul FLOPs of the plain engine (``patch_batch``): one full forward per head with
    the last position's logits only, plus the clean and reference forwards."""
    return B * forward_flops(cfg, T, 1) * (cfg.n_layer * cfg.n_head + 2)


# --------------------------------------------------------------------------- engines
class Clock:
    """Wall and process-CPU seconds of a block: on a shared machine the CPU time (all
    threads of this process) is the steadier measure of work."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def run_ours(model, pairs, args):
    with Clock() as clock:
        clean_ld, patched = patch_all_heads_fast(
            model, *pairs, batch_size=args.batch_size, max_rows=args.max_rows
        )
    return clock, clean_ld[:, None, None] - patched


def run_attribution(model, pairs, args):
    with Clock() as clock:
        clean_ld, patched = attribution_patch(model, *pairs, batch_size=args.batch_size)
    return clock, clean_ld[:, None, None] - patched


def run_tl(tl_model, pairs):
    """TransformerLens's mean effect e_{l,h} (mean over examples, per equal-length group,
    weighted by group size) and its time, on the TL model's device."""
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    clean, ref, correct, incorrect = pairs
    device = tl_model.cfg.device
    lengths = np.array([len(x) for x in clean])
    total = np.zeros((tl_model.cfg.n_layers, tl_model.cfg.n_heads))
    clock = Clock().__enter__()
    for T in np.unique(lengths):
        idx = np.flatnonzero(lengths == T)
        c = torch.as_tensor(np.stack([clean[i] for i in idx]), device=device)
        r = torch.as_tensor(np.stack([ref[i] for i in idx]), device=device)
        good = torch.as_tensor(correct[idx], device=device)
        bad = torch.as_tensor(incorrect[idx], device=device)
        rows = torch.arange(len(idx), device=device)

        def mean_ld(logits, rows=rows, good=good, bad=bad):
            last = logits[:, -1]
            return (last[rows, good] - last[rows, bad]).mean()

        with torch.no_grad():
            _, ref_cache = tl_model.run_with_cache(r)
            clean_ld = float(mean_ld(tl_model(c)))
            patched = get_act_patch_attn_head_out_all_pos(tl_model, c, ref_cache, mean_ld)
        total += len(idx) * (clean_ld - patched.double().cpu().numpy())
    clock.__exit__()
    return clock, total / len(clean)


def correlations(approx: np.ndarray, exact: np.ndarray) -> tuple[float, float, float, float]:
    """Pearson and Spearman of per-head mean effects, then of per-example drops."""
    a, e = approx.mean(axis=0).ravel(), exact.mean(axis=0).ravel()
    return (
        stats.pearsonr(a, e)[0],
        stats.spearmanr(a, e)[0],
        stats.pearsonr(approx.ravel(), exact.ravel())[0],
        stats.spearmanr(approx.ravel(), exact.ravel())[0],
    )


# --------------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = registry.build_model(zoo.derive_model_config("learned", PAPER_ARCH, {}), N_VOCAB).eval()
    cfg = model.cfg
    print(
        f"model: learned, L={cfg.n_layer} H={cfg.n_head} D={cfg.d_model} d_mlp={cfg.d_mlp} "
        f"V={cfg.n_vocab} (random GPT-2 init, seed {args.seed}); {torch.get_num_threads()} "
        f"torch threads; {args.n_examples} {args.split} examples per task; ours: batch "
        f"{args.batch_size}, max rows {args.max_rows}"
    )
    tl_model = None
    if not args.skip_tl:
        from headgeom.model.interop import to_transformer_lens

        tl_model = to_transformer_lens(model)
    data = {t: task_examples(t, args.n_examples, args.split) for t in tasks.TASKS}
    patch_all_heads_fast(
        model, *[x[:1] for x in data["sva"]], batch_size=1, max_rows=4096
    )  # warm-up

    print("\nexact engine vs TransformerLens (per-head mean effects e_{l,h}); times in s, wall/CPU")
    print(
        f"{'task':7} {'n':>3} {'T':>3} {'p':>3} {'ours':>13} {'TL':>15} {'speed-up':>13} "
        f"{'max|Δe|':>9} {'max|e|':>9} {'GFLOP':>7} {'GFLOP/s':>8} {'TL GFLOP':>9}"
    )
    sums = dict(ours=np.zeros(2), tl=np.zeros(2), attr=np.zeros(2), flops=0, tl_flops=0)
    delta_max, attr_rows = 0.0, []
    for task, pairs in data.items():
        lengths = [len(x) for x in pairs[0]]
        p = min(first_difference(c, r) for c, r in zip(pairs[0], pairs[1], strict=True))
        ours, drops = run_ours(model, pairs, args)
        # p: the batch's smallest first difference, as the engine uses it
        flops = sum(engine_flops(cfg, lengths.count(n), n, p) for n in set(lengths))
        tlf = sum(tl_flops(cfg, lengths.count(n), n) for n in set(lengths))
        e = drops.mean(axis=0)
        t_ours = np.array([ours.wall, ours.cpu])
        if tl_model is not None:
            tl, e_tl = run_tl(tl_model, pairs)
            t_tl = np.array([tl.wall, tl.cpu])
            delta = float(np.abs(e - e_tl).max())
            delta_max = max(delta_max, delta)
            tl_cols = f"{_pair(t_tl, 7.1)} {_pair(t_tl / t_ours, 5.1, 'x')} {delta:9.2e}"
        else:
            t_tl, tl_cols = np.zeros(2), f"{'-':>15} {'-':>13} {'-':>9}"
        print(
            f"{task:7} {len(lengths):3d} {max(lengths):3d} {p:3d} {_pair(t_ours, 6.2)} {tl_cols} "
            f"{np.abs(e).max():9.2e} {flops / 1e9:7.1f} {flops / 1e9 / ours.wall:8.1f} "
            f"{tlf / 1e9:9.1f}"
        )
        sums["ours"] += t_ours
        sums["tl"] += t_tl
        sums["flops"] += flops
        sums["tl_flops"] += tlf
        attr, approx = run_attribution(model, pairs, args)
        t_attr = np.array([attr.wall, attr.cpu])
        sums["attr"] += t_attr
        attr_rows.append((task, t_attr, t_ours / t_attr, *correlations(approx, drops)))
    tl_total = (
        f"{_pair(sums['tl'], 7.1)} {_pair(sums['tl'] / sums['ours'], 5.1, 'x')} {delta_max:9.2e}"
        if tl_model is not None
        else f"{'-':>15} {'-':>13} {'-':>9}"
    )
    print(
        f"{'total':7} {'':3} {'':3} {'':3} {_pair(sums['ours'], 6.2)} {tl_total} {'':9} "
        f"{sums['flops'] / 1e9:7.1f} {sums['flops'] / 1e9 / sums['ours'][0]:8.1f} "
        f"{sums['tl_flops'] / 1e9:9.1f}"
    )
    print(
        "GFLOP: multiply-add FLOPs our engine must do (matmuls only: a lower bound on its "
        "work); GFLOP/s on wall time. TL GFLOP: the same count for TL's sweep."
    )
    print_attribution("paper-shape model (random init)", attr_rows, sums["ours"], sums["attr"])
    demo_attribution(Path(args.demo_model), args)
    return 0


def _pair(values, fmt: float, unit: str = "") -> str:
    """``wall/cpu`` right-aligned, e.g. _pair((1.5, 0.5), 6.2) == '  1.50/0.50  '."""
    width, prec = str(fmt).split(".")
    w = int(width) + len(unit)
    return f"{values[0]:.{prec}f}{unit}".rjust(w) + "/" + f"{values[1]:.{prec}f}{unit}".ljust(w)


def print_attribution(title: str, rows: list, t_exact, t_attr) -> None:
    print(f"\nattribution patching (APPROXIMATE: 2 forwards + 1 backward) on the {title}")
    print(
        f"{'task':7} {'attr s':>13} {'vs exact':>13} {'r(e)':>7} {'ρ(e)':>7} "
        f"{'r(d)':>7} {'ρ(d)':>7}   (wall/CPU; e: per-head mean effects, d: per-example drops)"
    )
    for task, t, speed, r_e, s_e, r_d, s_d in rows:
        print(
            f"{task:7} {_pair(t, 6.3)} {_pair(speed, 5.1, 'x')} {r_e:7.3f} {s_e:7.3f} "
            f"{r_d:7.3f} {s_d:7.3f}"
        )
    print(f"{'total':7} {_pair(t_attr, 6.3)} {_pair(t_exact / t_attr, 5.1, 'x')}")


def demo_attribution(model_dir: Path, args: argparse.Namespace) -> None:
    checkpoint, manifest = model_dir / "model.safetensors", model_dir / "manifest.json"
    task_dir = model_dir.parents[2] / "tasks"
    if not (checkpoint.exists() and manifest.exists() and task_dir.is_dir()):
        print(f"\n(no trained model at {model_dir}: attribution on a trained model skipped)")
        return
    import pandas as pd

    from headgeom.hashing import ManifestMismatchError
    from headgeom.model.checkpoint import load_checkpoint, load_verified

    note = ""
    try:
        model, vocab, _ = load_verified(checkpoint, manifest)
    except ManifestMismatchError as err:  # a benchmark, not a study result: say so, go on
        print(f"\nWARNING: {err}")
        model, vocab = load_checkpoint(checkpoint)
        note = ", checkpoint NOT verified against its manifest"
    rows, t_exact, t_attr = [], np.zeros(2), np.zeros(2)
    for task in tasks.TASKS:
        frame = pd.read_parquet(task_dir / f"{task}.parquet")
        pairs = _ids(frame[frame["split"] == "evaluation"], vocab)
        exact, drops = run_ours(model, pairs, args)
        attr, approx = run_attribution(model, pairs, args)
        t_e, t_a = np.array([exact.wall, exact.cpu]), np.array([attr.wall, attr.cpu])
        t_exact, t_attr = t_exact + t_e, t_attr + t_a
        rows.append((task, t_a, t_e / t_a, *correlations(approx, drops)))
    n = (frame["split"] == "evaluation").sum()
    title = f"trained demo model {model_dir} ({n} evaluation examples per task{note})"
    print_attribution(title, rows, t_exact, t_attr)


if __name__ == "__main__":
    raise SystemExit(main())
