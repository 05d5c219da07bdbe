"""ACDC's engine (docs §15.4, :class:`headgeom.heads.analysis.acdc.Circuit`) against the
implementation before it (``tests/reference_acdc.py``: :class:`Graph`), metric calls per
second at the paper's shape, and the projected time of a whole ACDC run.

    python benchmarks/acdc_engine.py --threads 2                  # 16 SVA examples, float64
    python benchmarks/acdc_engine.py --trials 2 --n-examples 4    # quicker
    python benchmarks/acdc_engine.py --seq-len 12                 # random SVA-like prompts

The model has the paper's shape (12 × 12 heads, D = 768, d_mlp = 3072, V = 50,257) with the
all-rotated geometry (the one ACDC runs on) and seeded random weights (the cost does not
depend on them); the examples are the first ``--n-examples`` SVA validation prompts (GPT-2
ids: length 5, first clean/reference difference at position 1), or with ``--seq-len`` random
prompts of that length differing at position 1 (the subject noun's), in ``--dtype``.

A metric call's cost depends on where in the run it falls (the destination's layer; for the
old implementation also how many edges were removed before it, as it scans them all per
destination). Running a whole ACDC (32,491 calls) with the old one takes many hours, so both
run a bounded sample: for each destination of a representative mix (the logits, and the MLP
and the Q, K, V of head 0 of each of ``--layers``), the circuit is first put into a state where
every edge ACDC visits before that destination is decided (kept with probability
``--kept-fraction``, else removed; seed ``--seed``), then both implementations make the
next ``--trials`` calls of the greedy loop from that state (same decisions, checked). By
default every edge into the logits stays kept, so every node still reaches the logits and
every call of the new engine recomputes every node downstream of its destination that a
kept edge reaches: its worst case (``--sparse`` samples the logits edges too; then calls into
nodes cut off from the logits cost nothing, the usual case late in a real run, and the
measured fraction of such nodes is printed). Per-call seconds are interpolated linearly in
the layer between the measured layers (per MLP and per head destination) and summed over
the calls of a whole run: the projection for the paper's run on this machine.

The new engine's peak RSS (``resource.getrusage``) is taken after its calls and before the
old implementation runs; it is the process's, so it includes the model (~0.8 GB in float64)
and the peak of building it (float32, then float64). The peak of the engine's phase alone is
read from /proc (VmHWM, reset before it), beside the size of the engine's state.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from patching_engine import Clock, paper_model, task_examples  # noqa: E402

from headgeom.heads.analysis import acdc as A  # noqa: E402
from tests import reference_acdc as R  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=None, help="random SVA-like prompts")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--trials", type=int, default=3, help="calls per destination")
    parser.add_argument("--layers", default="11,6,1", help="layers of the measured MLP/heads")
    parser.add_argument("--kept-fraction", type=float, default=0.05)
    parser.add_argument("--sparse", action="store_true", help="sample the logits edges too")
    parser.add_argument("--threshold", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def examples(n: int, seq_len: int | None, n_vocab: int):
    """(clean, ref) (n, T) int64: SVA validation prompts, or random ones of ``seq_len``
    tokens whose reference differs at position 1."""
    if seq_len is None:
        clean, ref, _, _ = task_examples("sva", n, "validation")
        return torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, n_vocab, (n, seq_len), generator=gen)
    ref = clean.clone()
    ref[:, 1] = (clean[:, 1] + torch.randint(1, n_vocab, (n,), generator=gen)) % n_vocab
    return clean, ref


def state_before(edges, i0: int, args, rng) -> set:
    """The removed edges of a state in which every edge before ``edges[i0]`` is decided."""
    return {
        e
        for e in edges[:i0]
        if rng.random() >= args.kept_fraction and (args.sparse or e[1] != A.LOGITS)
    }


def run_new(model, clean, ref, removed, calls, threshold):
    circuit = A.Circuit(model, clean, ref, removed)
    dead = float(np.mean(~circuit.alive[: circuit.logits]))  # destinations cut off
    values, drops = [], []
    with Clock() as clock:
        for s, d in calls:
            value = circuit.trial(s, d)
            drop = value - circuit.metric < threshold
            circuit.settle(drop)
            values.append(value)
            drops.append(drop)
    return clock, values, drops, dead


def run_old(graph, removed, calls, threshold, L):
    removed = set(removed)
    start = calls[0][1][1]
    current = graph.metric(frozenset(removed), L - 1 if calls[0][1] == A.LOGITS else start)
    values, drops = [], []
    with Clock() as clock:
        for s, d in calls:
            value = graph.metric(frozenset(removed | {(s, d)}), L - 1 if d == A.LOGITS else d[1])
            drop = value - current < threshold
            if drop:
                removed.add((s, d))
                current = value
            values.append(value)
            drops.append(drop)
    return clock, values, drops


def projected(per_call: dict, edges, L: int) -> float:
    """Seconds of a whole run: per-call seconds of each (kind, layer) measured, interpolated
    linearly in the layer, times the number of calls of each destination."""
    total = 0.0
    for kind in ("mlp", "head"):
        layers = sorted(lay for k, lay in per_call if k == kind)
        times = [per_call[(kind, lay)] for lay in layers]
        for lay in range(L):
            n = sum(
                1
                for _, d in edges
                if d[1] == lay and (d[0] == "mlp") == (kind == "mlp") and d != A.LOGITS
            )
            total += n * float(np.interp(lay, layers, times))
    n_logits = sum(1 for _, d in edges if d == A.LOGITS)
    return total + n_logits * per_call[("logits", -1)]


def main(argv=None) -> int:
    args = parse_args(argv)
    model = paper_model(args.threads, "all-rotated").to(DTYPES[args.dtype])
    L, H = model.cfg.n_layer, model.cfg.n_head
    clean, ref = examples(args.n_examples, args.seq_len, model.cfg.n_vocab)
    edges = A.graph_edges(L, H)
    print(
        f"all-rotated 12×12, D=768, V={model.cfg.n_vocab}, {args.dtype}; {clean.shape[0]} "
        f"examples of length {clean.shape[1]}; torch threads {torch.get_num_threads()}; "
        f"{len(edges)} metric calls in a whole run; state: kept fraction {args.kept_fraction}"
        f"{'' if args.sparse else ', every logits edge kept (the worst case)'}"
    )
    layers = [int(x) for x in args.layers.split(",")]
    dests = [(A.LOGITS, ("logits", -1))]
    for lay in layers:
        dests.append((("mlp", lay, -1), ("mlp", lay)))
        dests += [((x, lay, 0), ("head", lay)) for x in "qkv"]
    plans = []
    rng = np.random.default_rng(args.seed)
    for dest, key in dests:
        i0 = next(i for i, e in enumerate(edges) if e[1] == dest)
        plans.append((dest, key, state_before(edges, i0, args, rng), edges[i0 : i0 + args.trials]))

    setup_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    phase = reset_peak_rss()
    before_mb = rss_now_mb("VmRSS")
    new = {}
    for dest, _, removed, calls in plans:
        new[dest] = run_new(model, clean, ref, removed, calls, args.threshold)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    phase_mb = rss_now_mb("VmHWM") if phase else float("nan")
    state_mb = state_bytes(A.Circuit(model, clean, ref)) / 2**20
    graph = R.Graph(model, clean, ref)
    old = {
        dest: run_old(graph, removed, calls, args.threshold, L) for dest, _, removed, calls in plans
    }

    print(
        f"\n{'destination':<16}{'removed':>9}{'dead':>7}{'old s/call':>12}{'new s/call':>12}"
        f"{'ratio':>8}{'new cpu s':>11}{'max |Δ|':>10}  same decisions"
    )
    per_old, per_new = {}, {}
    worst = 0.0
    for dest, key, removed, calls in plans:
        (nc, nv, nd, dead), (oc, ov, od) = new[dest], old[dest]
        n = len(calls)
        diff = max(abs(a - b) for a, b in zip(nv, ov, strict=True))
        worst = max(worst, diff)
        per_new.setdefault(key, []).append(nc.wall / n)
        per_old.setdefault(key, []).append(oc.wall / n)
        print(
            f"{str(dest):<16}{len(removed):>9}{dead:>7.2f}{oc.wall / n:>12.3f}{nc.wall / n:>12.3f}"
            f"{oc.wall / nc.wall:>8.1f}{nc.cpu / n:>11.3f}{diff:>10.1e}  {nd == od}"
        )
    per_new = {k: float(np.mean(v)) for k, v in per_new.items()}
    per_old = {k: float(np.mean(v)) for k, v in per_old.items()}
    t_old, t_new = projected(per_old, edges, L), projected(per_new, edges, L)
    print(
        f"\nprojected whole run ({len(edges)} calls, {clean.shape[0]} examples) on this machine: "
        f"old {t_old / 3600:.1f} h, new {t_new / 3600:.2f} h ({t_new / 60:.0f} min); "
        f"ratio {t_old / t_new:.1f}"
    )
    print(f"metric calls per second: old {len(edges) / t_old:.2f}, new {len(edges) / t_new:.2f}")
    print(f"max |Δ metric| between the two on the sampled calls: {worst:.2e}")
    print(
        f"new engine peak RSS (getrusage, the process so far): {rss_mb:.0f} MB; after building "
        f"the model {setup_mb:.0f} MB; during the engine's calls (VmHWM reset before them) "
        f"{phase_mb:.0f} MB, {phase_mb - before_mb:.0f} MB above the {before_mb:.0f} MB resident "
        f"before them; model {model_mb(model):.0f} MB, engine state {state_mb:.0f} MB"
    )
    return 0


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_now_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak since the last reset) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def state_bytes(circuit) -> int:
    names = ("diff", "ref_out", "xref", "read", "past_k", "past_v", "keep")
    return sum(getattr(circuit, n).numel() * getattr(circuit, n).element_size() for n in names)


def model_mb(model) -> float:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


if __name__ == "__main__":
    sys.exit(main())
