"""Continued pretraining of one upcycled SA-MoE run (SAMOE §7) on the cpt-train stream:
per-group learning rates, the shared-expert freeze, warmup and cosine, decay on matrices
only, the auxiliary losses; the same loop for all three variants.

    python -m headgeom.samoe.stages.train --config-json '{...run config...}' \\
        --step0 step0.safetensors \\
        --init-manifest init.json --corpus-dir results/samoe-demo/samoe/corpus \\
        --checkpoint model.safetensors --train-log train_log.parquet --manifest manifest.json

The step-0 checkpoint and the corpus files are verified against their manifests first; a
config that differs from the one the step-0 model was upcycled with is refused. A Hub
family's stream (``samoe_hub_corpus``: ``cpt_train.bin``) is memory-mapped, never read into
memory; the toy's (``cpt_train.parquet``) is read and mapped to the compact vocabulary.

On CUDA when one is present (``--device``); under ``torchrun`` one rank per GPU (NCCL; gloo
on CPUs), each on its share of every batch (``headgeom.samoe.cpt``), rank 0 writing.

Resumable (docs/samoe.md, as heads/stages/train.py): the state is written to ``--resume-dir`` every
10 minutes and when SIGTERM or SIGUSR1 arrives (Slurm's warning before a time limit);
the job then exits 75 and a rerun continues from the state to the same bytes. A state of
another run (config, step-0 model or corpus differ) is refused, naming what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from headgeom.data.corpus import compact, read_tokens
from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import content_hash, manifest_hash
from headgeom.io import read_json
from headgeom.runtime import set_threads
from headgeom.samoe import results
from headgeom.samoe.checkpoint import load_verified_moe, save_moe
from headgeom.samoe.config import CPTConfig
from headgeom.samoe.cpt import continued_pretraining
from headgeom.samoe.hub_corpus import MANIFEST_RECORD as HUB_CORPUS
from headgeom.samoe.hub_corpus import open_cpt_stream
from headgeom.samoe.manifest import run_manifest, verified_inputs, write_run_manifest
from headgeom.training.loop import resolve_device, seed_everything
from headgeom.training.preemption import EXIT_PREEMPTED, Preempted, on_signals
from headgeom.training.state import Resume

#: [CHOICE] Seconds between resumable states (besides the one a stop signal writes): a
#: toy run (seconds) writes none, a paper run (hours) one every 10 minutes.
SAVE_EVERY_S = 600.0


def start_ranks(device_name: str) -> tuple[int, int, torch.device]:
    """(rank, ranks, device): under torchrun (``WORLD_SIZE`` > 1) join the process group,
    NCCL on one GPU per rank or gloo on CPUs; else one process on ``device_name``."""
    n_ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if n_ranks == 1:
        return 0, 1, resolve_device(device_name)
    local = int(os.environ["LOCAL_RANK"])
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return torch.distributed.get_rank(), n_ranks, device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--step0", required=True, type=Path)
    parser.add_argument("--init-manifest", required=True, type=Path)
    parser.add_argument("--corpus-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    # not --log: torchrun reads any prefix of its own --log-dir as its own
    parser.add_argument("--train-log", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--resume-dir", type=Path, help="where the resumable state is kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    rank, n_ranks, device = start_ranks(args.device)
    set_threads(max(1, args.threads // n_ranks))
    model, vocab, init = load_verified_moe(args.step0, args.init_manifest)
    if init["config_hash"] != content_hash(cfg):
        raise ValueError(f"{args.init_manifest}: the step-0 model was upcycled with config "
                         f"{init['config_hash'][:12]}, this job's is {content_hash(cfg)[:12]}; "
                         "rerun samoe_upcycle")  # fmt: skip
    corpus_manifest = args.corpus_dir / "manifest.json"
    manifests = {"init": args.init_manifest}
    if read_json(corpus_manifest)["record_type"] == HUB_CORPUS:  # a Hub family: memory-mapped
        tokens = open_cpt_stream(args.corpus_dir, vocab)  # verified against the manifest
        files = {"cpt_train_meta": args.corpus_dir / "cpt_train.json"}  # the manifest binds
        manifests["corpus"] = corpus_manifest  # the stream's SHA-256: not hashed twice
    else:
        files = {"cpt_train": args.corpus_dir / "cpt_train.parquet"}
        verified_inputs(corpus_manifest, files)
        tokens = compact(read_tokens(files["cpt_train"]), vocab)
    cpt = CPTConfig.from_dict(cfg["cpt"])
    seed_everything(cfg["seed"])  # nothing in the loop draws, but the global RNG is fixed
    resume = None
    if args.resume_dir is not None:
        corpus_hash = manifest_hash(args.corpus_dir / "manifest.json")
        identity = {"config_hash": content_hash(cfg), "corpus_manifest": corpus_hash,
                    "step0_sha256": init["checkpoint_file_sha256"]}  # fmt: skip
        resume = Resume(args.resume_dir / "state.safetensors", identity,
                        {"threads": args.threads}, config=cfg)  # fmt: skip
        if resume.path.exists():
            print(f"resuming from {resume.path}", file=sys.stderr)
    model.to(device)  # float32 masters; cpt.precision bf16 autocasts the forward
    start = time.perf_counter()
    with on_signals() as stop:
        try:
            log = continued_pretraining(
                model,
                tokens,
                cpt,
                cfg["data_seed"],
                resume=resume,
                seq_len=cfg.get("seq_len"),
                stop=stop,
                save_every_s=SAVE_EVERY_S,
            )
        except Preempted as err:
            print(f"preempted: {err}", file=sys.stderr)
            return EXIT_PREEMPTED
        finally:
            if n_ranks > 1:
                torch.distributed.destroy_process_group()
    if rank != 0:  # rank 0 holds the same model and writes it
        return 0
    seconds = time.perf_counter() - start
    model.cpu()
    log.insert(0, "seed", cfg["seed"])
    log.insert(0, "variant", cfg["variant"])
    log.insert(0, "family", cfg["family"])
    with all_or_nothing(args.checkpoint, args.train_log, args.manifest):
        save_moe(args.checkpoint, model, vocab, {"run": cfg, "step": cpt.steps})
        results.CPT_LOG.write(args.train_log, log,
                              {"config": cfg, "config_hash": content_hash(cfg)})  # fmt: skip
        write_run_manifest(args.manifest, run_manifest(
            "samoe_run_manifest", cfg, args.checkpoint,
            {"step0": args.step0, **files}, manifests,
            init_content_sha256=init["init"]["content_sha256"],
            final_loss=float(log["loss"].iloc[-1]), seconds=seconds,
            threads=args.threads, device=device.type, ranks=n_ranks))  # fmt: skip
    print(f"trained {cfg['family']}/{cfg['variant']}/s{cfg['seed']}: {cpt.steps} steps in "
          f"{seconds:.1f} s on {n_ranks} × {device.type}, loss {log['loss'].iloc[0]:.3f} → "
          f"{log['loss'].iloc[-1]:.3f}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
