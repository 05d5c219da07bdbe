"""Attribution patching beside exact patching, one run, every task (docs §10.1).

    python -m headgeom.heads.stages.atp_agreement --checkpoint CKPT --manifest MANIFEST \\
        --task tasks/sva.parquet tasks/quote.parquet --effects patching/.../sva.parquet ... \\
        --split evaluation --batch-size 128 --model-name learned --seed 42 --threads 1 \\
        --out-agreement atp/.../sva.parquet ... --out-heads atp/.../sva.heads.parquet ... \\
        --out-examples atp/.../sva.examples.parquet ... --out-figure atp/.../agreement.png \\
        [--means means.safetensors]

Per task: AtP's first-order estimate of every head's patch (two forwards and one backward per
batch, headgeom.heads.analysis.patching.attribution_patch) on the examples of ``--split``, the
exact drops of the effects file (headgeom.heads.stages.patch_heads) beside it, and their agreement
(headgeom.heads.analysis.atp_agreement): per-example rows, per-head means with ranks, and one
agreement row (Spearman ρ, top-k overlap, largest misses). One figure per run
(headgeom.heads.paper.atp). The split is the concentration split (evaluation in every study): the
per-head means the head-effect grid, N_eff and E are reported on, on examples held out from
the discovery split where heads are selected. The patch estimated is the effects file's own
(its ``patch_mode``: resample, or mean / zero ablation with ``--means``), on the model the
effects were patched from (checked against the manifest and the task file). One job per run:
the checkpoint is verified and loaded once.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from headgeom import results
from headgeom.data.task_files import read_task
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import atp_agreement as atp
from headgeom.heads.analysis.ablation import read_means
from headgeom.heads.analysis.patch_effects import mode_replacement
from headgeom.heads.paper.atp import agreement_figure
from headgeom.io import metadata_text, read_table
from headgeom.model.checkpoint import load_verified
from headgeom.plotting import save_figure
from headgeom.runtime import pick_device, set_threads

OUTPUTS = ("agreement", "heads", "examples")
#: Why the analysis split is the one it is (the files' metadata).
SPLIT_REASON = (
    "the concentration split: the per-head means the head-effect grid, N_eff and E are "
    "reported on, held out from the discovery split where heads are selected"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--task", nargs="+", required=True, help="task Parquets")
    parser.add_argument(
        "--effects", nargs="+", required=True, help="effects Parquet per --task (patch_heads)"
    )
    parser.add_argument("--split", required=True, help="analysis split (see above)")
    parser.add_argument("--batch-size", type=int, required=True, help="examples per batch")
    parser.add_argument("--top-k", type=int, default=atp.TOP_K, help="heads in the overlap")
    parser.add_argument("--n-misses", type=int, default=atp.N_MISSES, help="misses listed")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--seed", type=int, required=True, help="the model's training seed")
    parser.add_argument("--means", help="means artifact (effects patched with mode mean)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    for name in OUTPUTS:
        parser.add_argument(f"--out-{name}", nargs="+", required=True, help="one per --task")
    parser.add_argument("--out-figure", required=True, help="the run's PNG, every task")
    args = parser.parse_args(argv)
    for name in ("effects", *(f"out_{o}" for o in OUTPUTS)):
        if len(getattr(args, name)) != len(args.task):
            flag = name.replace("_", "-")
            parser.error(f"{len(args.task)} --task files but {len(getattr(args, name))} "
                         f"--{flag} (one per task)")  # fmt: skip
    for name in ("batch_size", "top_k", "n_misses"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got "
                         f"{getattr(args, name)}")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    device = pick_device(args.device)
    model = model.to(device)  # analyses run in float32 (docs §0)
    means = None
    if args.means is not None:
        means = read_means(args.means, manifest["checkpoint_file_sha256"])
    heads, rows = [], []
    for i, task_path in enumerate(args.task):
        outs = {name: getattr(args, f"out_{name}")[i] for name in OUTPUTS}
        h, row = one_task(model, vocab, manifest, device, means, task_path, args.effects[i],
                          outs, args)  # fmt: skip
        heads.append(h)
        rows.append(row)
    fig = agreement_figure(pd.concat(heads, ignore_index=True), pd.DataFrame(rows),
                           f"{args.model_name} s{args.seed}")  # fmt: skip
    Path(args.out_figure).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, args.out_figure, "png")
    print(f"wrote {args.out_figure}", file=sys.stderr)
    return 0


def one_task(model, vocab, manifest, device, means, task_path, effects_path, outs, args):
    """AtP beside the exact effects of one task: writes its three Parquets and returns the
    per-head rows and the agreement row (for the figure)."""
    task = read_task(task_path, [args.split])
    meta = results.require_same_run(effects_path, manifest, task.dataset_sha256)
    replacement = mode_of(model, meta, effects_path, means)
    exact = read_table(effects_path).to_pandas()
    exact = exact[exact["split"] == args.split]
    if exact.empty:
        raise ValueError(
            f"{effects_path}: no rows of split {args.split!r} (it has "
            f"{sorted(read_table(effects_path, ['split']).column('split').unique().to_pylist())}); "
            "patching.splits must include the concentration split"
        )
    name = metadata_text(meta, "task", effects_path)
    start = time.perf_counter()
    estimate = atp.atp_examples(model, vocab, task.frame, args.batch_size, replacement)
    seconds = time.perf_counter() - start
    examples = atp.beside_exact(estimate, exact, str(effects_path))
    heads, row = atp.split_agreement(examples, args.top_k, args.n_misses)
    identity = {"model": args.model_name, "seed": args.seed, "task": name, "split": args.split}
    clean_diff = float((examples["clean_ld"] - examples["clean_ld_exact"]).abs().max())
    metadata = {
        **results.file_metadata(
            "atp_agreement", carried=results.carried_provenance(meta, effects_path)
        ),
        **{k: identity[k] for k in ("model", "seed", "task")},
        "effects_sha256": sha256_file(effects_path),
        "task_file_sha256": task.file_sha256,
        "analysis_split": args.split,
        "analysis_split_reason": SPLIT_REASON,
        "n_layers": model.cfg.n_layer,
        "n_heads": model.cfg.n_head,
        "estimator": "attribution patching (AtP): patched_ld ≈ clean_ld + Σ_t (z^ref − z)·∂LD/∂z "
        "per head at blocks.{l}.attn.hook_z, two forwards and one backward per batch",
        "batch_size": args.batch_size,
        "batching": "length groups of at most batch_size examples in file order (the exact "
        "engine also sorts by first differing position; a value differs only by round-off)",
        "top_k": row["top_k"],
        "n_misses": args.n_misses,
        "tie_rule": atp.TIE_RULE,
        "clean_ld_max_abs_diff": clean_diff,
        "atp_seconds": round(seconds, 3),
        "device": str(device),
        "threads": args.threads,
        "dtype": "float32 forward and backward, float64 logit differences and products",
    }
    example_id = task.schema.field("example_id").type
    examples = examples.drop(columns="clean_ld_exact").assign(**identity)
    results.ATP_EXAMPLES.with_type("example_id", example_id).write(
        outs["examples"], examples, metadata
    )
    heads = heads.assign(**identity)
    results.ATP_HEADS.write(outs["heads"], heads, metadata)
    row = {**identity, **row}
    results.ATP_AGREEMENT.write(outs["agreement"], pd.DataFrame([row]), metadata)
    print(
        f"{name} {args.split}: {row['n_examples']} examples, AtP {seconds:.2f} s, ρ "
        f"{row['spearman_rho']:.3f}, top-{row['top_k']} overlap {row['top_k_overlap']:.2f}, "
        f"max miss {row['max_abs_miss']:.3g}, clean LD Δ {clean_diff:.2g}",
        file=sys.stderr,
    )
    return heads, row


def mode_of(model, meta, effects_path, means):
    """The replacement of the effects file's ablation mode (None: resample), refusing mean
    ablation without the means artifact it was patched with."""
    mode = meta.get(results.PATCH_MODE, "resample")
    if mode == "mean":
        wanted = metadata_text(meta, results.ABLATION_MEANS_SHA256, effects_path)
        if means is None or means.sha256 != wanted:
            found = "none" if means is None else means.sha256
            raise ValueError(
                f"{effects_path}: patched with mean ablation from means {wanted}; --means "
                f"gives {found} (pass the run's means.safetensors)"
            )
    return mode_replacement(model, mode, None if means is None else means.z)


if __name__ == "__main__":
    sys.exit(main())
