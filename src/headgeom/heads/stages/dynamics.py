"""Training timeline, task gradients τ and V-gradient traces of one run (docs §13.2, §13.4,
§14.2, §14.4; paper Figure 6a–c).

    python -m headgeom.heads.stages.dynamics --checkpoint model.safetensors \\
        --manifest manifest.json \\
        --checkpoint-steps 0 8 32 --step-checkpoints c0 c8 c32 --step-manifests m0 m8 m32 \\
        --timeline-steps 8 32 --value-gradient-steps 0 8 --sequences 32 --task sva.parquet \\
        --val-tokens val_tokens.parquet --heads final_sva.heads.parquet --lane-split discovery \\
        --evals e8 e32 efinal --lanes l8 l32 lfinal --geometry g8 g32 gfinal \\
        --out-timeline t.parquet --out-tau tau.parquet --out-value-gradients v.parquet

Every checkpoint is verified against its own manifest (and its manifest's step against the
step it stands for) before it is read. The per-step Parquets come from the reused stages
(evaluate_clean, patch_heads → concentration → lanes, geometry_stats on each checkpoint);
the timeline refuses one computed from another checkpoint. τ uses the 240 SVA evaluation
examples; the V-gradient LM loss the first --sequences validation windows.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from headgeom import results
from headgeom.data.corpus import compact, read_tokens
from headgeom.data.task_files import model_inputs, read_task
from headgeom.heads.analysis import dynamics as dyn
from headgeom.io import read_table
from headgeom.manifest import verified_val_tokens
from headgeom.model.checkpoint import load_verified
from headgeom.runtime import set_threads
from headgeom.training.data import validation_windows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="the run's final checkpoint")
    p.add_argument("--manifest", required=True, help="its manifest")
    for name, kind in (("checkpoint-steps", int), ("step-checkpoints", str),
                       ("step-manifests", str), ("timeline-steps", int),
                       ("value-gradient-steps", int), ("evals", str), ("lanes", str),
                       ("geometry", str)):  # fmt: skip
        p.add_argument(f"--{name}", nargs="+", type=kind, required=True)
    p.add_argument("--sequences", type=int, required=True, help="validation windows (§14.4)")
    p.add_argument(
        "--backward-sequences", type=int, required=True, help="sequences per backward (memory)"
    )
    p.add_argument("--task", required=True, help="tasks/sva.parquet")
    p.add_argument("--val-tokens", required=True, help="the corpus's val_tokens.parquet")
    p.add_argument("--heads", required=True, help="final SVA heads Parquet (lane index)")
    p.add_argument("--lane-split", required=True)
    p.add_argument("--threads", type=int, default=1)
    for name in ("timeline", "tau", "value-gradients"):
        p.add_argument(f"--out-{name}", required=True)
    args = p.parse_args(argv)
    if len(args.step_checkpoints) != len(args.checkpoint_steps) or len(args.step_manifests) != len(
        args.checkpoint_steps
    ):
        p.error("give one --step-checkpoints and --step-manifests entry per --checkpoint-steps")
    n = len(args.timeline_steps) + 1
    if not len(args.evals) == len(args.lanes) == len(args.geometry) == n:
        p.error(f"--evals, --lanes and --geometry need {n} files (timeline steps, then final)")
    return args


def load_step(checkpoint: str, manifest: str, step: int):
    model, vocab, record = load_verified(checkpoint, manifest)
    if int(record["step"]) != step:
        raise ValueError(f"{manifest}: manifest of step {record['step']}, not step {step}")
    return model, vocab, record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    # one model in memory at a time: the final checkpoint first (its vocabulary and context
    # set the inputs), then each earlier step, loaded, measured and dropped
    final_model, vocab, final = load_verified(args.checkpoint, args.manifest)
    final_step = int(final["step"])
    paths = dict(zip(args.checkpoint_steps, zip(args.step_checkpoints, args.step_manifests,
                                                strict=True), strict=True))  # fmt: skip
    paths.pop(final_step, None)
    missing = sorted(set(args.timeline_steps + args.value_gradient_steps) - {*paths, final_step})
    if missing:
        raise ValueError(f"no checkpoint given for steps {missing}")

    task = read_task(args.task, ["evaluation"])
    sva = model_inputs(task.frame, vocab)
    lane = dyn.final_lane_index(read_table(args.heads).to_pandas(), args.lane_split)
    timeline_steps = [*args.timeline_steps, final_step]
    verified_val_tokens(args.val_tokens, final)  # the final model's own validation split
    windows = validation_windows(
        compact(read_tokens(args.val_tokens), vocab), final_model.cfg.n_ctx
    )
    val_in, val_out = windows[0][: args.sequences], windows[1][: args.sequences]
    vgrad_steps = sorted({*args.value_gradient_steps, final_step})
    records, tau_rows, vgrad_rows = {}, {}, {}
    for s in [final_step] + sorted(set(timeline_steps + vgrad_steps) - {final_step}):
        if s == final_step:
            model, record, final_model = final_model, final, None  # dropped after its step
        else:
            model, _, record = load_step(*paths[s], s)
        records[s] = record
        if s in timeline_steps:
            tau_rows[s] = dyn.tau_table([(s, model, record)], sva, lane, final_step)
        if s in vgrad_steps:
            vgrad_rows[s] = dyn.value_gradient_table(
                [(s, model, record)], val_in, val_out, final_step, args.backward_sequences
            )
        del model
    tau = pd.concat([tau_rows[s] for s in timeline_steps], ignore_index=True)
    vgrad = pd.concat([vgrad_rows[s] for s in vgrad_steps], ignore_index=True)
    entries = [(s, records[s], e, la, g) for s, e, la, g in
               zip(timeline_steps, args.evals, args.lanes, args.geometry, strict=True)]  # fmt: skip
    timeline = dyn.timeline_table(entries, final_step, args.lane_split)
    run = {"model": final["model_name"], "seed": int(final["init_seed"])}
    tau, vgrad = tau.assign(**run), vgrad.assign(**run)
    metadata = {
        **results.file_metadata(
            "dynamics",
            manifest=final,
            task_dataset_sha256=task.dataset_sha256,
            task_file_sha256=task.file_sha256,
        ),
        "lane_index": lane,
        "value_gradient_sequences": int(len(val_in)),
        "threads": args.threads,
    }
    results.TIMELINE.write(args.out_timeline, timeline, metadata)
    results.TAU.write(args.out_tau, tau, metadata)
    results.VALUE_GRADIENTS.write(args.out_value_gradients, vgrad, metadata)
    for r in timeline.itertuples():
        print(f"step {r.step}: SVA acc {r.sva_accuracy:.3f}, Λ {r.lambda_score} (p {r.lambda_p}), "
              f"own-best {r.own_best_fraction:.3f}, P(T) {r.idempotence_median:.3f}",
              file=sys.stderr)  # fmt: skip
    for r in tau.itertuples():
        print(
            f"τ step {r.step}: adjacent {r.adjacent_cosine_mean:.3f}, same-index "
            f"{r.same_index_cosine:.3f}, lane {lane} share {r.lane_share:.3f}",
            file=sys.stderr,
        )
    share = vgrad.groupby("step")["own_largest"].mean()
    print(f"V-gradient own term largest: {share.round(3).to_dict()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
