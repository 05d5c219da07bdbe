"""One prepared device check (docs/usage.md "GPU check"): training throughput and MFU, exact
resume and the analysis engines on one GPU, under 8 minutes, with a GPU-hours projection of the
paper DAG.

    pip install -e '.[dev]'        # '.[dev]' adds TransformerLens (engine comparison); optional
    python benchmarks/gpu_check.py OUT                         # one CUDA GPU, < 8 min
    python benchmarks/gpu_check.py OUT --device cpu --tiny     # dry mode: every path, seconds
    python benchmarks/gpu_check.py OUT --peak-tflops 989       # a GPU the peak table lacks
    python benchmarks/gpu_check.py OUT --rehearsal-results results/rehearsal  # + CPU rules

Writes ``OUT/gpu_check.json`` (every number) and ``OUT/gpu_check.md`` (the same as tables);
needs nothing but the repository (no network: tokenizer files come with the package). Each
section has a hard time budget (``SECTIONS``; the sum stays under ``--budget-s``): items that
would start after their section's budget are reported as skipped, a section that fails is
reported with its error and the next one runs.

* **training**: the paper-size model (12×12, D = 768, V = 50,257, T = 512, batch 32) in bf16
  autocast with fused AdamW, the real step (``headgeom.training.throughput``: the step of
  ``loop.optimizer_step``, its FLOP count and the peak table), without then with
  ``torch.compile``: ms/step, tokens/s, MFU (6·N·tokens + attention FLOPs over the bf16 peak)
  and peak memory; the frozen variants (write-common-axis, all-rotated-self, headblock =
  read-common, routed = write-routed-a) as tokens/s ratios to learned (goal ≥ 0.95).
* **resume**: the real training job (``headgeom.training.job.train_job``) in a subprocess,
  SIGKILLed right after its resumable state at step K is written, then restarted, against an
  uninterrupted run; with default kernels and with ``torch.use_deterministic_algorithms``:
  whether the final checkpoints' bytes match, max |Δweight|, and the deterministic run's
  training time relative to the default one.
* **patching**: ``patch_all_heads_fast`` on real task examples vs TransformerLens
  (benchmarks/patching_engine.py's peer) on the same device: s, examples/s, speed-up, max |Δe|.
* **clamps**: ``clamps.clamp_patch`` vs the naive hooked-forward loop of
  benchmarks/clamp_engine.py (§15.3 path cases of five sources).
* **leakage**: ``leakage.leakage_table`` on the same examples (rate for the projection).
* **edges**: ``headgeom.heads.analysis.edges`` (docs §15.1) vs its per-edge hook loop, in the
  analysis model's float32.
* **real_model**: the real-model engine (``headgeom.model.hf.HFCausalLM``: a ``transformers``
  causal LM with named sites) on a Llama-3.2-1B-shaped model built from its config with random
  weights (16 layers × 32 query / 8 key-value heads, D = 2048, grouped-query attention, rotary;
  nothing downloaded): all-heads patching (``patch_all_heads_fast``) of 64 examples × 3 tasks in
  float32 and bfloat16: seconds per task, the engine's FLOPs (layer resumption: head patches ×
  examples × positions × the layers from the patched one on) and their fraction of the
  device's dense peak of that precision. Random weights make the effects meaningless and the
  timing real: the cost does not depend on the values.
* **projection**: every rule of the ``--config`` study's DAG (default config/paper.yaml) with
  jobs in it: its jobs from the Study's run sets (``headgeom.heads.cost.JOBS``), work per job in
  ``headgeom.heads.cost.UNITS``, on the device its config resources give it. GPU rules at the rates
  measured above (training at the config's ``training.compile`` and precision, each model at
  the measured geometry's rate, else learned's, × the FLOPs-per-token ratio; analyses at the
  engines' fp32 rates × the FLOPs ratio), CPU rules fitted from a finished rehearsal's
  benchmark files (``--rehearsal-results``, ``headgeom.heads.cost.fit``), else "not measured";
  totals in GPU-hours and CPU core-hours, and the GPU rows scaled to an H100 SXM by the peak of each
  row's own precision (bf16 training, fp32 analyses).

The analysis sections run in exact fp32 (TF32 off, as the workflow's analyses do).

Peak GPU memory (``torch.cuda.max_memory_allocated``) is reported for every measurement.
In dry mode (``--tiny``) every shape is tiny and every count small: the numbers test the code,
they are not measurements of anything.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # the engines' peers: patching_engine, clamp_engine

from headgeom import cost as shared  # noqa: E402
from headgeom.heads import cost  # noqa: E402
from headgeom.training.loop import configure_matmuls  # noqa: E402
from headgeom.training.throughput import (  # noqa: E402
    PAPER_SHAPE,
    PEAK_TFLOPS,
    flops_per_token,
    model_for,
    peak_tflops,
    time_training,
)

TINY_SHAPE = dict(
    n_layer=2, n_head=3, d_model=48, d_head=16, d_mlp=96, n_ctx=64, vocab=50257, batch=2
)
# paper row names of the frozen variants measured beside learned (docs §6.1)
FROZEN = {
    "write-common-axis": "write-common-axis",
    "all-rotated-self": "all-rotated-self",
    "read-common": "headblock (read-common)",
    "write-routed-a": "routed (write-routed-a)",
}
# name -> seconds of its budget on a GPU (dry mode: the same, it never comes close)
SECTIONS = {
    "training": 160,
    "resume": 100,  # six training subprocesses, each starting CUDA
    "patching": 45,
    "clamps": 30,
    "leakage": 20,
    "edges": 25,
    "real_model": 80,  # a 1.2B-parameter model built on the device, 2 dtypes × 3 tasks
    "projection": 20,
}
# Llama-3.2-1B's shape (its config.json), and the dry mode's tiny stand-in of the same family
LLAMA_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)  # fmt: skip
LLAMA_TINY = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, vocab_size=50257, max_position_embeddings=128,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)  # fmt: skip
COMPILE_GUESS_S = 90  # a first compiled item starts only with this much of its budget left
JSON_NAME, MD_NAME = "gpu_check.json", "gpu_check.md"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="directory for gpu_check.json and gpu_check.md")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="dry mode: tiny shapes, 2-3 steps")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table)")
    p.add_argument("--budget-s", type=float, default=480.0, help="all sections together (s)")
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--config", default=str(ROOT / "config/paper.yaml"), help="projected study")
    p.add_argument(
        "--rehearsal-results",
        type=Path,
        help="a finished rehearsal's results folder (results/rehearsal): its benchmark files "
        "give the CPU rules' projection (headgeom.heads.cost.fit)",
    )
    p.add_argument(
        "--rehearsal-config",
        type=Path,
        default=ROOT / "config/rehearsal.yaml",
        help="the config of that rehearsal",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- budget
class Budget:
    """The whole run's deadline and each section's own (the earlier of the two)."""

    def __init__(self, total_s: float):
        self.start, self.total = time.perf_counter(), total_s

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.start)

    def deadline(self, seconds: float) -> float:
        return time.perf_counter() + min(seconds, self.left())


def over(deadline: float) -> bool:
    return time.perf_counter() >= deadline


@dataclasses.dataclass
class Context:
    device: torch.device
    tiny: bool
    peak_tflops: float | None
    work: Path
    config: Path
    rehearsal: Path | None = None  # a finished rehearsal's results/<study> (its benchmarks)
    rehearsal_config: Path = ROOT / "config/rehearsal.yaml"
    shared: dict = dataclasses.field(default_factory=dict)  # results later sections reuse

    @property
    def train_shape(self) -> dict:
        return TINY_SHAPE if self.tiny else PAPER_SHAPE

    @property
    def precision(self) -> str:
        return "bf16" if self.device.type == "cuda" else "fp32"


def reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


class Clock:
    """Wall seconds of a block, the device synchronised at both ends."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.seconds


# --------------------------------------------------------------------------- training
def training_section(ctx: Context, deadline: float) -> dict:
    shape, device, precision = ctx.train_shape, ctx.device, ctx.precision
    configure_matmuls(device, precision)
    peak, peak_source = peak_tflops(device, precision, ctx.peak_tflops)
    warmup, steps = (1, 2) if ctx.tiny else (3, 10)
    # Dry mode compiles with the "eager" backend: Dynamo's tracing without inductor's
    # code generation (a minute of C++ compilation per model on a CPU).
    backend = "eager" if ctx.tiny else "inductor"
    plan = [(g, False) for g in ("learned", *FROZEN)] + [(g, True) for g in ("learned", *FROZEN)]
    rows, skipped, last = [], [], {False: 0.0, True: 0.0 if ctx.tiny else COMPILE_GUESS_S}
    for geometry, compiled in plan:
        if deadline - time.perf_counter() < last[compiled]:  # it would not end in time
            skipped.append({"geometry": geometry, "compile": compiled})
            continue
        t0 = time.perf_counter()
        model = model_for(geometry, shape)
        fpt = flops_per_token(model, shape)
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        t = time_training(
            model,
            shape,
            device,
            precision,
            compile=compiled and backend,
            warmup=warmup,
            steps=steps,
        )
        tps = t.tokens_per_second
        rows.append(
            {
                "geometry": geometry,
                "label": FROZEN.get(geometry, geometry),
                "compile": compiled,
                "compile_backend": backend if compiled else None,
                "n_params": n_params,
                "ms_per_step": 1e3 * t.median_step,
                "tokens_per_s": tps,
                "gflop_per_token": fpt / 1e9,
                "mfu": fpt * tps / (peak * 1e12) if peak else None,
                "first_step_s": t.warmup_seconds[0],  # includes compilation when compiled
                "peak_memory_bytes": t.peak_memory_bytes,
            }
        )
        del model, t
        last[compiled] = time.perf_counter() - t0
        if compiled:
            torch._dynamo.reset()
        reset_peak(device)
    for row in rows:
        base = [r for r in rows if r["geometry"] == "learned" and r["compile"] == row["compile"]]
        row["ratio_to_learned"] = row["tokens_per_s"] / base[0]["tokens_per_s"] if base else None
    ctx.shared["training"] = rows
    return {
        "shape": shape,
        "precision": precision,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "compile_backend": backend,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "rows": rows,
        "skipped": skipped,
    }


# --------------------------------------------------------------------------- resume
def resume_run_config(tiny: bool) -> dict:
    if tiny:
        model = dict(n_ctx=32, n_layer=2, n_head=2, d_model=16, d_head=8, d_mlp=32)
        steps, batch, every, kill = 12, 4, 3, 6
    else:
        model = dict(n_ctx=256, n_layer=4, n_head=4, d_model=256, d_head=64, d_mlp=1024)
        steps, batch, every, kill = 60, 16, 10, 30
    training = dict(
        steps=steps,
        batch_size=batch,
        lr_max=3e-3,
        lr_min=3e-4,
        warmup_steps=2,
        eval_every=steps,
        eval_batch_size=8,
        checkpoint_steps=[0],
        resume_every=every,
    )
    run = {
        "model_name": "learned",
        "seed": 1,
        "data_seed": 1729,
        "model": {**model, "geometry": "learned"},
        "training": training,
    }
    return {"run": run, "kill_at": kill}


def write_synthetic_corpus(d: Path, n_train: int, n_val: int, n_ids: int = 256) -> Path:
    """Token files, vocabulary and corpus manifest laid out as heads/stages/tokenize_corpus.py
    writes them, from a learnable Markov stream over ``n_ids`` GPT-2 ids (no tokenizer needed)."""
    import pyarrow as pa

    from headgeom import results
    from headgeom.data.corpus import vocab_sha256, write_tokens
    from headgeom.hashing import sha256_file
    from headgeom.io import write_manifest

    rng = np.random.default_rng(0)

    def stream(n: int) -> np.ndarray:
        out, jumps, noise = np.empty(n, np.int64), rng.random(n) < 0.2, rng.integers(0, n_ids, n)
        out[0] = 0
        for i in range(1, n):
            out[i] = noise[i] if jumps[i] else (3 * out[i - 1] + 1) % n_ids
        return out + 100

    d.mkdir(parents=True, exist_ok=True)
    train, val = stream(n_train), stream(n_val)
    meta = {"config": {"source": "synthetic", "name": "gpu_check"}, "config_hash": "0" * 64}
    hashes = {
        "train_sha256": write_tokens(d / "train_tokens.parquet", train, {**meta, "role": "train"}),
        "val_sha256": write_tokens(d / "val_tokens.parquet", val, {**meta, "role": "val"}),
    }
    vocab = np.unique(np.concatenate([train, val])).astype(np.int32)
    table = pa.table(
        {
            "model_id": pa.array(np.arange(len(vocab), dtype=np.int32)),
            "gpt2_id": pa.array(vocab),
            "text": pa.array([f"<{i}>" for i in vocab]),
        }
    )
    results.VOCAB.write(d / "vocab.parquet", table, {**meta, "vocab_size": len(vocab)})
    files = {r: d / f"{r}_tokens.parquet" for r in ("train", "val")} | {
        "vocab": d / "vocab.parquet"
    }
    manifest = {
        "record_type": "corpus_manifest",
        "dataset": "synthetic-gpu-check",
        "corpus": "gpu_check",
        **meta,
        "tokenizer": {"name": "gpt2", "files_sha256": {}},
        "sampling": "with_replacement",
        "n_train_tokens": n_train,
        "n_val_tokens": n_val,
        **hashes,
        "vocab_sha256": vocab_sha256(vocab),
        "vocab_size": len(vocab),
        "files": {role: sha256_file(path) for role, path in files.items()},
    }
    write_manifest(d / "manifest.json", manifest)
    return d


def resume_worker(spec_path: Path) -> int:
    """Subprocess: one training job (train_job) as heads/stages/train.py runs it; SIGKILLed right
    after its resumable state of step ``kill_at`` is written, when given."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any cuBLAS call
        torch.use_deterministic_algorithms(True, warn_only=True)
    from headgeom.run_config import parse_run_config
    from headgeom.runtime import set_threads
    from headgeom.training import loop
    from headgeom.training.job import CorpusFiles, JobOutputs, train_job

    set_threads(1)
    if spec["kill_at"] is not None:
        save = loop.save_resume_state

        def save_then_die(resume, model, opt, progress, cursor=None):
            save(resume, model, opt, progress, cursor)
            if progress.step == spec["kill_at"]:
                os.kill(os.getpid(), signal.SIGKILL)

        loop.save_resume_state = save_then_die
    c, out = Path(spec["corpus"]), Path(spec["out"])
    corpus = CorpusFiles(
        c / "train_tokens.parquet",
        c / "val_tokens.parquet",
        c / "vocab.parquet",
        c / "manifest.json",
    )
    outputs = JobOutputs.beside(out / "model.safetensors", out / "train_log.parquet")
    result = train_job(
        parse_run_config(spec["run"]),
        corpus,
        outputs,
        threads=1,
        device=spec["device"],
        progress=False,
    )
    record = {
        "train_seconds": result.seconds,
        "resumed_from": result.resumed_from,
        "peak_memory_bytes": peak_bytes(torch.device(spec["device"])),
    }
    (out / "worker.json").write_text(json.dumps(record))
    return 0


def _run_worker(ctx, corpus: Path, out: Path, run: dict, deterministic: bool, kill_at, deadline):
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "corpus": str(corpus),
        "out": str(out),
        "run": run,
        "deterministic": deterministic,
        "kill_at": kill_at,
        "device": str(ctx.device),
    }
    spec_path = out / f"spec-{time.monotonic_ns()}.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    timeout = max(30.0, deadline - time.perf_counter() + 30)  # a hung job ends the section
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--resume-worker", str(spec_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"a training job ({'deterministic' if deterministic else 'default'} kernels, "
            f"kill_at={kill_at}) ran past the section budget ({timeout:.0f} s left for it)"
        ) from None
    return proc.returncode, proc.stderr


def _max_abs_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    if ta.keys() != tb.keys():
        return float("inf")
    return max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta if ta[k].numel())


def resume_section(ctx: Context, deadline: float) -> dict:
    from headgeom.hashing import sha256_file

    spec = resume_run_config(ctx.tiny)
    run, kill_at = spec["run"], spec["kill_at"]
    tr = run["training"]
    n_train = 20_000 if ctx.tiny else 200_000
    corpus = write_synthetic_corpus(
        ctx.work / "resume-corpus", n_train, 4 * run["model"]["n_ctx"] * 8
    )
    modes, skipped, last = {}, [], 0.0
    for mode, deterministic in (("default", False), ("deterministic", True)):
        if deadline - time.perf_counter() < last:  # as long as the previous mode: no time
            skipped.append(mode)
            continue
        t0 = time.perf_counter()
        ref, res = ctx.work / f"resume-{mode}-ref", ctx.work / f"resume-{mode}-killed"
        rc_ref, err_ref = _run_worker(ctx, corpus, ref, run, deterministic, None, deadline)
        rc_kill, err_kill = _run_worker(ctx, corpus, res, run, deterministic, kill_at, deadline)
        killed_state = (res / "resume" / "state.safetensors").exists()
        rc_res, err_res = _run_worker(ctx, corpus, res, run, deterministic, None, deadline)
        for rc, err, what in ((rc_ref, err_ref, "uninterrupted"), (rc_res, err_res, "restart")):
            if rc != 0:
                raise RuntimeError(f"{mode} {what} run failed (exit {rc}):\n{err[-2000:]}")
        w_ref = json.loads((ref / "worker.json").read_text())
        w_res = json.loads((res / "worker.json").read_text())
        warnings = sorted(
            {
                line.strip()
                for line in (err_ref + err_res).splitlines()
                if "deterministic" in line and "Warning" in line
            }
        )
        modes[mode] = {
            "killed": rc_kill == -signal.SIGKILL and killed_state,
            "kill_exit_code": rc_kill,
            "resumed_from": w_res["resumed_from"],
            "bytes_match": sha256_file(ref / "model.safetensors")
            == sha256_file(res / "model.safetensors"),
            "max_abs_weight_diff": _max_abs_diff(
                ref / "model.safetensors", res / "model.safetensors"
            ),
            "train_seconds": w_ref["train_seconds"],
            "steps_per_s": tr["steps"] / w_ref["train_seconds"],
            "peak_memory_bytes": w_ref["peak_memory_bytes"],
            "nondeterministic_op_warnings": warnings[:10],
        }
        last = time.perf_counter() - t0
    out = {"run": run, "kill_after_state_of_step": kill_at, "modes": modes, "skipped": skipped}
    if {"default", "deterministic"} <= set(modes):
        d, n = modes["default"], modes["deterministic"]
        out["deterministic_slowdown"] = n["train_seconds"] / d["train_seconds"]
        out["default_vs_deterministic_max_abs_weight_diff"] = _max_abs_diff(
            ctx.work / "resume-default-ref" / "model.safetensors",
            ctx.work / "resume-deterministic-ref" / "model.safetensors",
        )
    return out


# --------------------------------------------------------------------------- analysis engines
def analysis_model(ctx: Context):
    """The learned model of the training shape in eval mode, fp32, on the device (shared),
    with TF32 off as in the workflow's analyses (the training section turned it on)."""
    configure_matmuls(ctx.device, "fp32")
    if "model" not in ctx.shared:
        ctx.shared["model"] = model_for("learned", ctx.train_shape).eval().to(ctx.device)
        ctx.shared["analysis_flops"] = flops_per_token(ctx.shared["model"], ctx.train_shape)
    return ctx.shared["model"]


def examples(ctx: Context, n: int) -> dict:
    """The first ``n`` evaluation examples of every task (GPT-2 ids: V = 50,257)."""
    import patching_engine  # benchmarks/: real task examples

    from headgeom.data import tasks

    key = f"examples{n}"
    if key not in ctx.shared:
        ctx.shared[key] = {
            t: patching_engine.task_examples(t, n, "evaluation") for t in tasks.TASKS
        }
    return ctx.shared[key]


def _has_transformer_lens() -> bool:
    try:
        import transformer_lens  # noqa: F401
    except ImportError:
        return False
    return True


def patching_section(ctx: Context, deadline: float) -> dict:
    import patching_engine  # benchmarks/: our engine's runner and the TransformerLens peer

    model, device = analysis_model(ctx), ctx.device
    data = examples(ctx, 4 if ctx.tiny else 32)
    args = argparse.Namespace(batch_size=128, max_rows=4096)
    patching_engine.run_ours(model, [x[:1] for x in data["sva"]], args)  # warm-up
    rows, ours_s, tl_s, n_total, skipped = [], 0.0, 0.0, 0, []
    tl_model, tl_note = None, None
    if _has_transformer_lens():
        from headgeom.model.interop import to_transformer_lens

        tl_model = to_transformer_lens(model.cpu()).to(str(device))
        model.to(device)
    else:
        tl_note = "transformer_lens not installed (pip install -e '.[dev]')"
    drops_all, peak_ours, peak_tl = {}, 0, 0
    for task, pairs in data.items():
        if over(deadline):
            skipped.append(task)
            continue
        reset_peak(device)
        with Clock(device) as c_ours:
            _, drops = patching_engine.run_ours(model, pairs, args)
        peak_ours = max(peak_ours, peak_bytes(device) or 0)
        drops_all[task] = drops
        row = {
            "task": task,
            "n": len(pairs[0]),
            "max_len": max(len(x) for x in pairs[0]),
            "ours_s": c_ours.seconds,
            "ours_examples_per_s": len(pairs[0]) / c_ours.seconds,
        }
        ours_s, n_total = ours_s + c_ours.seconds, n_total + len(pairs[0])
        if tl_model is not None:
            reset_peak(device)
            with Clock(device) as c_tl:
                _, e_tl = patching_engine.run_tl(tl_model, pairs)
            peak_tl = max(peak_tl, peak_bytes(device) or 0)
            row.update(
                tl_s=c_tl.seconds,
                speedup=c_tl.seconds / c_ours.seconds,
                max_abs_delta_e=float(np.abs(drops.mean(axis=0) - e_tl).max()),
            )
            tl_s += c_tl.seconds
        rows.append(row)
    del tl_model
    reset_peak(device)
    ctx.shared["drops"] = drops_all
    ctx.shared["patching_examples_per_s"] = n_total / ours_s if ours_s else None
    return {
        "rows": rows,
        "examples_per_s": ctx.shared["patching_examples_per_s"],
        "speedup_vs_transformer_lens": tl_s / ours_s if tl_s and ours_s else None,
        "transformer_lens": tl_note or "compared",
        "peak_memory_bytes": {"ours": peak_ours or None, "transformer_lens": peak_tl or None},
        "skipped": skipped,
    }


def clamp_sources(model) -> list[tuple[int, int]]:
    import clamp_engine  # benchmarks/: the clamp engine's naive peer

    L, H = model.cfg.n_layer, model.cfg.n_head
    if (L, H) == (12, 12):
        return clamp_engine.SOURCES
    return sorted({(i % max(L - 1, 1), (2 * i + 1) % H) for i in range(5)})  # 5 or fewer


def clamps_section(ctx: Context, deadline: float) -> dict:
    import clamp_engine

    from headgeom.heads.analysis import clamps

    model, device = analysis_model(ctx), ctx.device
    data = examples(ctx, 4 if ctx.tiny else 16)
    cases = clamp_engine.path_cases(model, clamp_sources(model))
    rows, fast_s, slow_s, units, skipped, peak = [], 0.0, 0.0, 0, [], {"engine": 0, "naive": 0}
    for task, pairs in data.items():
        if over(deadline):
            skipped.append(task)
            continue
        reset_peak(device)
        with Clock(device) as fast:
            ld, got = clamps.clamp_patch(model, *pairs, cases, batch_size=128, max_rows=4096)
        peak["engine"] = max(peak["engine"], peak_bytes(device) or 0)
        reset_peak(device)
        with Clock(device) as slow:
            ld_n, want = clamp_engine.naive(model, *pairs, cases)
        peak["naive"] = max(peak["naive"], peak_bytes(device) or 0)
        d_got, d_want = ld[:, None] - got, ld_n[:, None] - want
        n = len(pairs[0])
        rows.append(
            {
                "task": task,
                "n": n,
                "cases": len(cases),
                "engine_s": fast.seconds,
                "naive_s": slow.seconds,
                "speedup": slow.seconds / fast.seconds,
                "max_abs_delta_drop": float(np.abs(d_got - d_want).max()),
            }
        )
        fast_s, slow_s, units = fast.seconds + fast_s, slow.seconds + slow_s, units + n * len(cases)
    ctx.shared["clamp_case_examples_per_s"] = units / fast_s if fast_s else None
    return {
        "sources": [list(s) for s in clamp_sources(model)],
        "rows": rows,
        "case_examples_per_s": ctx.shared["clamp_case_examples_per_s"],
        "speedup_vs_naive": slow_s / fast_s if fast_s else None,
        "peak_memory_bytes": {k: v or None for k, v in peak.items()},
        "skipped": skipped,
    }


def leakage_section(ctx: Context, deadline: float) -> dict:
    import patching_engine

    from headgeom.data.task_files import PatchInputs
    from headgeom.heads.analysis.leakage import leakage_table
    from headgeom.heads.analysis.stats import effects_from_drops

    model, device = analysis_model(ctx), ctx.device
    data = examples(ctx, 4 if ctx.tiny else 32)
    drops = ctx.shared.get("drops", {})
    args = argparse.Namespace(batch_size=128, max_rows=4096)
    rows, seconds, n_total, skipped = [], 0.0, 0, []
    reset_peak(device)
    for task, pairs in data.items():
        if over(deadline):
            skipped.append(task)
            continue
        d = drops[task] if task in drops else patching_engine.run_ours(model, pairs, args)[1]
        inputs = PatchInputs(pairs[0], pairs[1], np.array(pairs[2]), np.array(pairs[3]))
        with Clock(device) as clock:
            with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115  (tqdm)
                leakage_table(model, inputs, effects_from_drops(d), 64, device, "(gpu_check)")
        rows.append(
            {
                "task": task,
                "n": len(pairs[0]),
                "seconds": clock.seconds,
                "examples_per_s": len(pairs[0]) / clock.seconds,
            }
        )
        seconds, n_total = seconds + clock.seconds, n_total + len(pairs[0])
    ctx.shared["leakage_examples_per_s"] = n_total / seconds if seconds else None
    return {
        "rows": rows,
        "examples_per_s": ctx.shared["leakage_examples_per_s"],
        "peak_memory_bytes": peak_bytes(device),
        "skipped": skipped,
    }


def edges_section(ctx: Context, deadline: float) -> dict:
    try:
        from headgeom.heads.analysis import edges
    except ImportError as err:
        return {"status": "not present", "reason": f"headgeom.heads.analysis.edges: {err}"}
    model, device = analysis_model(ctx), ctx.device
    clean, ref = examples(ctx, 4)["sva"][:2]
    k = 2 if ctx.tiny else 4
    every = edges.all_edges(model.cfg.n_layer, model.cfg.n_head)
    n_fast, n_naive = (
        min(len(every), 256 if ctx.tiny else 4096),
        min(len(every), 8 if ctx.tiny else 24),
    )
    sub = every.subset(np.arange(n_fast))
    reset_peak(device)
    with Clock(device) as fast:
        kl = edges.edge_kl(model, clean[:k], ref[:k], sub, batch_size=16, max_rows=2048)
    peak_fast = peak_bytes(device)
    reset_peak(device)
    with Clock(device) as slow:
        kl_naive = edges.edge_kl_naive(model, clean[:k], ref[:k], every.subset(np.arange(n_naive)))
    edges_per_s, naive_per_s = n_fast / fast.seconds, n_naive / slow.seconds
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    ctx.shared["edges_dtype"] = dtype
    ctx.shared["edge_examples_per_s"] = k * edges_per_s / len(every)  # all edges per example
    ctx.shared["edges_total"] = len(every)
    return {
        "examples": k,
        "dtype": dtype,
        "edges_total": len(every),
        "edges_timed": n_fast,
        "edges_per_s": edges_per_s,
        "naive_edges_timed": n_naive,
        "naive_edges_per_s": naive_per_s,
        "speedup_vs_naive": edges_per_s / naive_per_s,
        "max_abs_delta_kl": float(np.abs(kl[:, :n_naive] - kl_naive).max()),
        "all_edges_projected_s": len(every) / edges_per_s,
        "peak_memory_bytes": {"engine": peak_fast, "naive": peak_bytes(device)},
    }


# --------------------------------------------------------------------------- projection
# Each rule of the projected study's DAG on the device its resources give it (config
# resources.<rule>.gpu; a `use rule` copy takes its base rule's): jobs from the Study's run
# sets (headgeom.heads.cost.JOBS), work per job in headgeom.heads.cost.UNITS, GPU rules at the rates
# measured above, CPU rules from a rehearsal's benchmark files (headgeom.heads.cost.fit).
GPU_MEASURED = "GPU measured in this run"
GPU_UNMEASURED = "GPU, not measured here"
CPU_FITTED = "CPU fitted from rehearsal benchmarks"
CPU_UNMEASURED = "CPU, not measured here"
H100_PEAKS = dict(zip(("bf16", "fp32"), PEAK_TFLOPS["H100 SXM"], strict=True))
# the rules whose GPU work one of the sections above measures, in cost.UNITS's unit
PATCHING_RULES = ("patch_heads", "patch_step", "patch_modes")  # patch_all_heads_fast
TRAINING_RULES = cost.GPU_TIMED  # the rules only GPU rates can time


def device_peaks(ctx: Context) -> dict[str, float | None]:
    """The CUDA device's dense peak TFLOP/s per precision (bf16, fp32: --peak-tflops for the
    training precision, else the table); none on a CPU, none for float64 (no table)."""
    if ctx.device.type != "cuda":
        return {"bf16": None, "fp32": None, "fp64": None}
    peaks = {p: peak_tflops(ctx.device, p, ctx.peak_tflops if p == ctx.precision else None)[0]
             for p in ("bf16", "fp32")}  # fmt: skip
    return {**peaks, "fp64": None}


def _study(path: Path):
    from headgeom import config_layers
    from headgeom.heads.study import Study

    return Study.from_config(config_layers.load(path, ROOT))  # `extends` from the repository


def _relative(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def _model_flops(study) -> dict[str, float]:
    """Training FLOPs per token of every model of the study, built on the meta device."""
    from headgeom.model import registry

    out = {}
    for model in study.models:
        cfg = study.model_config(model)
        with torch.device("meta"):
            m = registry.build_model(cfg, n_vocab=PAPER_SHAPE["vocab"])
        shape = {k: getattr(m.cfg, k) for k in ("n_layer", "n_head", "d_head", "n_ctx")}
        out[model] = flops_per_token(m, shape)
    return out


def _train_rates(ctx: Context, study) -> tuple[dict[str, tuple[float, float]], str | None]:
    """geometry -> (forward-token equivalents/s, FLOPs/token) of the training rows measured
    with the study's ``training.compile`` and precision (a training step = 3 forwards:
    cost.UNITS's unit), or ({}, why not)."""
    from headgeom.training.loop import resolve_precision

    training = study.stage("training")
    compiled = bool(training.get("compile", False))
    try:
        precision = resolve_precision(training.get("precision", "auto"), ctx.device)
    except ValueError:
        precision = "bf16"
    if precision != ctx.precision:
        return {}, f"training.precision resolves to {precision}; this run measured {ctx.precision}"
    rows = [r for r in ctx.shared.get("training") or [] if r["compile"] == compiled]
    rates = {r["geometry"]: (3 * r["tokens_per_s"], r["gflop_per_token"] * 1e9) for r in rows}
    if "learned" not in rates:
        return {}, f"no learned training rate with compile={compiled} (section skipped?)"
    return rates, None


def _gpu_analysis_rates(ctx: Context, study) -> dict[str, tuple[float | None, str, str]]:
    """rule -> (units/s of the analysis model, precision, basis) of the GPU rules other than
    training; rate None: not measured, basis says why."""
    patching, leakage = (
        ctx.shared.get("patching_examples_per_s"),
        ctx.shared.get("leakage_examples_per_s"),
    )
    out = {r: (patching, "fp32", "patch_all_heads_fast examples/s") for r in PATCHING_RULES}
    out["leakage"] = (leakage, "fp32", "leakage_table examples/s")
    out["clamps"] = (None, "fp32", "the clamps section times path cases, not a job's examples")
    dtype, measured = study.stage("edges")["dtype"], ctx.shared.get("edges_dtype")
    edges = ctx.shared.get("edge_examples_per_s") if dtype == measured else None
    why = (
        "edge_kl examples/s × edges ratio" if edges else f"edges.dtype {dtype}; measured {measured}"
    )
    out["edges"] = (edges, {"float64": "fp64", "float32": "fp32"}.get(dtype, dtype), why)
    return out


def _edge_ratio(ctx: Context, study):
    """model -> its edges over the measured model's (an edge job patches every edge)."""
    from headgeom.heads.analysis.edges import all_edges

    def ratio(model: str) -> float:
        cfg = study.model_config(model)
        return len(all_edges(cfg["n_layer"], cfg["n_head"])) / ctx.shared["edges_total"]

    return ratio


def projection_section(ctx: Context, deadline: float) -> dict:
    study = _study(ctx.config)
    rules = cost.workflow_rules(ROOT)
    jobs = cost.jobs(study)
    unknown = sorted(set(jobs) ^ set(rules))
    if unknown:
        raise RuntimeError(f"headgeom.heads.cost.JOBS and workflow/heads/*.smk differ: {unknown}")
    flops = _model_flops(study)
    ref_flops = ctx.shared.get("analysis_flops")  # the model the analysis rates are of
    train_rates, train_why = _train_rates(ctx, study)
    analysis_rates = _gpu_analysis_rates(ctx, study)
    peaks = device_peaks(ctx)
    compiled = bool(study.stage("training").get("compile", False))
    fitted, rehearsal = {}, None
    if ctx.rehearsal is not None:
        rehearsal = _study(ctx.rehearsal_config)
        measured = shared.read_benchmarks(ctx.rehearsal)
        fitted = {p.rule: p for p in cost.fit(measured, rehearsal, study)}

    rows = []
    for rule, rule_jobs in jobs.items():
        if not rule_jobs:
            continue
        spec = rules[rule]
        gpus = study.resources(spec["resources"] or rule, 0, 0)["gpu"]
        unit, units_of = cost.UNITS.get(rule, ("job", lambda s: 1.0))
        per_job = float(units_of(study))
        row = {
            "rule": rule,
            "device": "GPU" if gpus else "CPU",
            "gpus_per_job": gpus,
            "jobs": len(rule_jobs),
            "unit": unit,
            "units_per_job": per_job,
            "units": per_job * len(rule_jobs),
            "precision": None,
            "threads": None,  # a CPU job's (core-hours = wall × threads)
            "seconds": None,
        }
        if gpus and rule in TRAINING_RULES:
            row["precision"] = ctx.precision
            if train_why:
                row.update(rate_source=GPU_UNMEASURED, basis=train_why)
            else:
                seconds, basis = 0.0, set()
                for job in rule_jobs:
                    g = study.models[job["model"]]["geometry"]
                    rate, ref = train_rates.get(g, train_rates["learned"])
                    seconds += per_job / (rate * ref / flops[job["model"]])
                    basis.add("measured" if g in train_rates else "learned")
                how = " and ".join(sorted(basis))
                row.update(
                    seconds=seconds,
                    rate_source=GPU_MEASURED,
                    basis=f"{'compiled' if compiled else 'uncompiled'} training "
                    f"(training.compile: {str(compiled).lower()}), {how} geometry rates "
                    "× FLOPs ratio, 3 forwards per trained token",
                )
        elif gpus:
            rate, precision, why = analysis_rates.get(rule, (None, None, "no section measures it"))
            row["precision"] = precision
            if rate and ref_flops:
                scale = _edge_ratio(ctx, study) if rule == "edges" else (lambda m: 1.0)
                seconds = sum(per_job / rate * flops[j["model"]] / ref_flops * scale(j["model"])
                              for j in rule_jobs)  # fmt: skip
                row.update(seconds=seconds, rate_source=GPU_MEASURED, basis=f"{why} × FLOPs ratio")
            else:
                row.update(rate_source=GPU_UNMEASURED, basis=why)
        elif spec["benchmark"] in fitted:
            p = fitted[spec["benchmark"]]
            threads = rehearsal.threads(spec["resources"] or rule)
            row.update(
                seconds=len(rule_jobs) * p.seconds,
                threads=threads,
                rate_source=CPU_FITTED,
                basis=f"max of {p.jobs} rehearsal jobs {p.measured_s:,.1f} s at "
                f"{p.units:,.0f} → {p.target_units:,.0f} units, {threads} thread(s)",
            )
        else:
            why = "no --rehearsal-results" if ctx.rehearsal is None else (
                f"no benchmark files of {spec['benchmark']} in the rehearsal")  # fmt: skip
            row.update(rate_source=CPU_UNMEASURED, basis=why)
        s = row["seconds"]
        row["rate"] = row["units"] / s if s else None
        gpu = s is not None and row["device"] == "GPU"
        row["gpu_hours"] = s * gpus / 3600 if gpu else None
        threads = row["threads"] or 1
        row["cpu_core_hours"] = s * threads / 3600 if s is not None and not gpu else None
        peak = peaks.get(row["precision"]) if gpu else None
        h100 = H100_PEAKS.get(row["precision"])
        row["h100_gpu_hours"] = row["gpu_hours"] * peak / h100 if peak and h100 else None
        rows.append(row)

    def total(key):
        values = [r[key] for r in rows if r[key] is not None]
        return sum(values) if values else None

    return {
        "config": _relative(ctx.config),
        "study": study.name,
        "runs": len(study.runs),
        "jobs": sum(r["jobs"] for r in rows),
        "training_compile": compiled,
        "rehearsal": None if ctx.rehearsal is None else {
            "results": _relative(ctx.rehearsal), "config": _relative(ctx.rehearsal_config)},
        "rules": rows,
        "total_gpu_hours": total("gpu_hours"),
        "total_cpu_core_hours": total("cpu_core_hours"),
        "total_h100_gpu_hours": total("h100_gpu_hours"),
        "h100_scaling": "× device peak / H100 SXM peak at each row's precision (bf16 "
        f"{H100_PEAKS['bf16']:g}, fp32 {H100_PEAKS['fp32']:g} TFLOP/s; none for float64); "
        f"this device: {', '.join(f'{k} {v:g}' for k, v in peaks.items() if v) or 'no peak'}",
        "not_projected": [r["rule"] for r in rows if r["seconds"] is None],
        "not_in_dag": [rule for rule, js in jobs.items() if not js],
    }  # fmt: skip


# --------------------------------------------------------------------------- real model
def llama_1b(ctx: Context, dtype: torch.dtype):
    """The Llama-3.2-1B-shaped model (dry mode: a tiny Llama) with random weights, built on
    the device in ``dtype`` and wrapped with its named sites; seeded, eval mode."""
    import transformers  # the hf extra: only this section needs it

    from headgeom.model.hf import HFCausalLM

    shape = LLAMA_TINY if ctx.tiny else LLAMA_1B
    config = transformers.LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device(ctx.device):  # 1.2B parameters: initialised where they run
        hf = transformers.LlamaForCausalLM(config).to(dtype)
    return HFCausalLM.wrap(hf.eval())


def resumption_flops(model, pairs) -> float:
    """FLOPs of all-heads patching by layer resumption: each (layer l, head, example) patch
    runs layers l..L−1 on every position (2 FLOPs per multiply-add of each layer's matrices,
    plus attention's QKᵀ and AV over all T × T scores, as dense kernels compute them), then
    the final norm and two answer logits (not counted); the clean and reference forwards on
    top. What layer resumption executes (prefix reuse would execute less)."""
    from patching_engine import block_token_flops  # benchmarks/: the engines' FLOP model

    H, d, L = model.cfg.n_head, model.cfg.d_head, model.cfg.n_layer
    per_token_layer = sum(block_token_flops(model.cfg))
    total = 0.0
    for clean in pairs[0]:
        T = len(clean)
        layer_flops = T * per_token_layer + 2 * 2 * H * d * T * T  # + QKᵀ and AV
        patches = sum(H * (L - layer) for layer in range(L))  # layer-l patches run L−l layers
        total += (patches + 2 * L) * layer_flops  # + the clean and reference forwards
    return total


def real_model_section(ctx: Context, deadline: float) -> dict:
    import patching_engine  # benchmarks/: our engine's runner

    from headgeom.heads.analysis.patching import supports_fast, supports_prefix_reuse

    configure_matmuls(ctx.device, "fp32")  # exact fp32 (TF32 off), as the analyses
    data = examples(ctx, 4 if ctx.tiny else 64)
    args = argparse.Namespace(batch_size=64, max_rows=4096)
    peaks = device_peaks(ctx)
    rows, skipped, shape = [], [], None
    for dtype, precision in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        if over(deadline):
            skipped.append(precision)
            continue
        reset_peak(ctx.device)
        model = llama_1b(ctx, dtype)
        shape = {"layers": model.cfg.n_layer, "query_heads": model.cfg.n_head,
                 "kv_heads": model.cfg.n_kv_head, "d_model": model.cfg.d_model,
                 "parameters": model.n_params(), "fast_engine": supports_fast(model),
                 "prefix_reuse": supports_prefix_reuse(model)}  # fmt: skip
        patching_engine.run_ours(model, [x[:1] for x in data["sva"]], args)  # warm-up
        for task, pairs in data.items():
            if over(deadline):
                skipped.append(f"{precision} {task}")
                continue
            with Clock(ctx.device) as clock:
                patching_engine.run_ours(model, pairs, args)
            flops = resumption_flops(model, pairs)
            peak = peaks.get(precision)
            rows.append({
                "precision": precision, "task": task, "n": len(pairs[0]),
                "max_len": max(len(x) for x in pairs[0]), "seconds": clock.seconds,
                "tflops": flops / 1e12, "tflop_per_s": flops / clock.seconds / 1e12,
                "fraction_of_peak": flops / clock.seconds / 1e12 / peak if peak else None,
                "peak_memory_bytes": peak_bytes(ctx.device),
            })  # fmt: skip
        del model
    reset_peak(ctx.device)
    return {"model": shape, "peak_tflops": peaks, "rows": rows, "skipped": skipped}


SECTION_FUNCTIONS = {
    "training": training_section,
    "resume": resume_section,
    "patching": patching_section,
    "clamps": clamps_section,
    "leakage": leakage_section,
    "edges": edges_section,
    "real_model": real_model_section,
    "projection": projection_section,
}


# --------------------------------------------------------------------------- report
def environment(device: torch.device) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_name=props.name,
            device_memory_bytes=props.total_memory,
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
    return env


def _f(x, fmt: str = ".3g", unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return f"{x:{fmt}}{unit}"


def _mib(x) -> str:
    return _f(x / 2**20 if x else None, ",.0f", " MiB")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(report: dict) -> str:
    env, s = report["environment"], report["sections"]
    name = env.get("device_name", env["device"])
    lines = [f"# GPU check: {name}", ""]
    if report["dry_mode"]:
        lines += [
            "**CPU DRY MODE (`--tiny`): tiny shapes, 2–3 steps. These numbers test the "
            "script; they are not measurements of a GPU.**",
            "",
        ]
    lines += [
        f"torch {env['torch']}, python {env['python']}, {report['total_seconds']:.1f} s "
        f"in all (budget {report['budget_s']:.0f} s).",
        "",
    ]
    lines += _table(
        ["section", "status", "seconds"],
        [[k, v["status"], _f(v.get("seconds"), ".1f")] for k, v in s.items()],
    )
    for key, sec in s.items():
        lines += ["", f"## {key}", ""]
        if sec["status"] not in ("ok", "partial"):
            lines.append(f"{sec['status']}: {sec.get('reason', sec.get('error', ''))}".strip())
            continue
        lines += SECTION_MD[key](sec)
        if sec.get("skipped"):
            lines += ["", f"Skipped (over the section budget): {sec['skipped']}"]
    return "\n".join(lines) + "\n"


def _md_training(sec) -> list[str]:
    rows = [
        [
            r["label"],
            r["compile_backend"] or "no",
            f"{r['n_params']:,}",
            _f(r["ms_per_step"], ".1f"),
            _f(r["tokens_per_s"], ",.0f"),
            _f(r["ratio_to_learned"], ".3f"),
            _f(r["gflop_per_token"], ".3f"),
            _f(r["mfu"], ".1%"),
            _f(r["first_step_s"], ".1f"),
            _mib(r["peak_memory_bytes"]),
        ]
        for r in sec["rows"]
    ]
    head = [
        f"shape {sec['shape']}, {sec['precision']}, peak "
        f"{_f(sec['peak_tflops'], 'g', ' TFLOP/s')} ({sec['peak_source']}); median of "
        f"{sec['timed_steps']} steps after {sec['warmup_steps']} warm-up",
        "",
    ]
    return head + _table(
        [
            "model",
            "compile",
            "params",
            "ms/step",
            "tokens/s",
            "vs learned",
            "GFLOP/tok",
            "MFU",
            "1st step s",
            "peak mem",
        ],
        rows,
    )


def _md_resume(sec) -> list[str]:
    rows = [
        [
            m,
            _f(r["killed"]),
            str(r["resumed_from"]),
            _f(r["bytes_match"]),
            _f(r["max_abs_weight_diff"], ".2e"),
            _f(r["steps_per_s"], ".2f"),
            _mib(r["peak_memory_bytes"]),
            str(len(r["nondeterministic_op_warnings"])),
        ]
        for m, r in sec["modes"].items()
    ]
    out = [
        f"run: {sec['run']['model']}, {sec['run']['training']['steps']} steps; SIGKILL "
        f"after the state of step {sec['kill_after_state_of_step']}, then restart",
        "",
    ]
    out += _table(
        [
            "kernels",
            "killed",
            "resumed from",
            "bytes match",
            "max abs dweight",
            "steps/s",
            "peak mem",
            "nondet. warnings",
        ],
        rows,
    )
    if "deterministic_slowdown" in sec:
        out += [
            "",
            f"torch.use_deterministic_algorithms: training time × "
            f"{sec['deterministic_slowdown']:.3f}; max |Δweight| default vs deterministic "
            f"{sec['default_vs_deterministic_max_abs_weight_diff']:.2e}",
        ]
    return out


def _md_patching(sec) -> list[str]:
    rows = [
        [
            r["task"],
            str(r["n"]),
            str(r["max_len"]),
            _f(r["ours_s"], ".2f"),
            _f(r.get("tl_s"), ".2f"),
            _f(r.get("speedup"), ".1f", "×"),
            _f(r.get("max_abs_delta_e"), ".1e"),
        ]
        for r in sec["rows"]
    ]
    mem = sec["peak_memory_bytes"]
    return _table(["task", "n", "T", "ours s", "TL s", "speed-up", "max abs de"], rows) + [
        "",
        f"ours {_f(sec['examples_per_s'], '.2f')} examples/s; vs TransformerLens "
        f"{_f(sec['speedup_vs_transformer_lens'], '.1f', '×')} ({sec['transformer_lens']}); "
        f"peak memory ours {_mib(mem['ours'])}, TL {_mib(mem['transformer_lens'])}",
    ]


def _md_clamps(sec) -> list[str]:
    rows = [
        [
            r["task"],
            str(r["n"]),
            str(r["cases"]),
            _f(r["engine_s"], ".2f"),
            _f(r["naive_s"], ".2f"),
            _f(r["speedup"], ".1f", "×"),
            _f(r["max_abs_delta_drop"], ".1e"),
        ]
        for r in sec["rows"]
    ]
    mem = sec["peak_memory_bytes"]
    return _table(["task", "n", "cases", "engine s", "naive s", "speed-up", "max abs dd"], rows) + [
        "",
        f"engine {_f(sec['case_examples_per_s'], ',.1f')} case·examples/s, "
        f"{_f(sec['speedup_vs_naive'], '.1f', '×')} the naive loop; peak memory engine "
        f"{_mib(mem['engine'])}, naive {_mib(mem['naive'])}",
    ]


def _md_leakage(sec) -> list[str]:
    rows = [
        [r["task"], str(r["n"]), _f(r["seconds"], ".2f"), _f(r["examples_per_s"], ".2f")]
        for r in sec["rows"]
    ]
    return _table(["task", "n", "s", "examples/s"], rows) + [
        "",
        f"{_f(sec['examples_per_s'], '.2f')} examples/s, peak memory "
        f"{_mib(sec['peak_memory_bytes'])}",
    ]


def _md_edges(sec) -> list[str]:
    return [
        f"{sec['edges_timed']:,} of {sec['edges_total']:,} edges × {sec['examples']} "
        f"examples: {sec['edges_per_s']:,.1f} edges/s; naive per-edge loop "
        f"{sec['naive_edges_per_s']:,.2f} edges/s ({sec['speedup_vs_naive']:.1f}×); max |ΔKL| "
        f"{sec['max_abs_delta_kl']:.1e}; all edges ≈ {sec['all_edges_projected_s']:,.0f} s"
    ]


def _rate(x) -> str:
    return _f(x, ",.1f" if x and x >= 1 else ".2g")


def projection_table(sec) -> list[str]:
    rows = [
        [
            r["rule"],
            r["device"],
            str(r["jobs"]),
            r["unit"],
            _f(r["units_per_job"], ",.0f"),
            _rate(r["rate"]),
            _f(r["seconds"] and r["seconds"] / r["jobs"], ",.1f"),
            r["rate_source"],
            _f(r["gpu_hours"], ",.2f"),
            _f(r["cpu_core_hours"], ",.2f"),
            _f(r["h100_gpu_hours"], ",.2f"),
        ]
        for r in sec["rules"]
    ]
    rows.append(
        [
            "**total**",
            "",
            str(sec["jobs"]),
            "",
            "",
            "",
            "",
            "",
            _f(sec["total_gpu_hours"], ",.2f"),
            _f(sec["total_cpu_core_hours"], ",.2f"),
            _f(sec["total_h100_gpu_hours"], ",.2f"),
        ]
    )
    header = ["rule", "device", "jobs", "unit", "units / job", "rate /s", "s / job", "rate source",
              "GPU-hours", "CPU core-hours", "H100-hours"]  # fmt: skip
    return _table(header, rows)


def _md_projection(sec) -> list[str]:
    rehearsal = sec["rehearsal"]
    lines = [
        f"{sec['config']} (study {sec['study']}, {sec['runs']} runs, {sec['jobs']} jobs); "
        f"training.compile {str(sec['training_compile']).lower()}: the "
        f"{'compiled' if sec['training_compile'] else 'uncompiled'} training rates; CPU rules "
        + (
            f"fitted from {rehearsal['results']} ({rehearsal['config']})"
            if rehearsal
            else "not measured (no --rehearsal-results)"
        )
        + f"; H100 scaling {sec['h100_scaling']}",
        "",
    ]
    lines += projection_table(sec) + [""]
    lines += [f"- {r['rule']}: {r['basis']}" for r in sec["rules"]
              if r["rate_source"] != CPU_UNMEASURED]  # fmt: skip
    cpu = {}
    for r in sec["rules"]:
        if r["rate_source"] == CPU_UNMEASURED:
            cpu.setdefault(r["basis"], []).append(r["rule"])
    lines += [f"- {CPU_UNMEASURED} ({why}): {', '.join(rs)}" for why, rs in cpu.items()]
    if sec["not_projected"]:
        lines += [
            "",
            f"Not projected (no rate; not in the totals): {', '.join(sec['not_projected'])}.",
        ]
    if sec["not_in_dag"]:
        lines += ["", f"Not in this study's DAG (no jobs): {', '.join(sec['not_in_dag'])}."]
    return lines


def _md_real_model(sec) -> list[str]:
    m = sec["model"] or {}
    rows = [
        [r["precision"], r["task"], str(r["n"]), str(r["max_len"]), _f(r["seconds"], ".2f"),
         _f(r["tflops"], ".3g"), _f(r["tflop_per_s"], ".3g"), _f(r["fraction_of_peak"], ".1%")]
        for r in sec["rows"]
    ]  # fmt: skip
    head = (
        f"Llama-shaped, random weights: {m.get('layers')} layers × {m.get('query_heads')} "
        f"query / {m.get('kv_heads')} key-value heads, D = {m.get('d_model')}, "
        f"{_f(m.get('parameters'), ',.0f')} parameters; fast engine {m.get('fast_engine')}, "
        f"prefix reuse {m.get('prefix_reuse')}"
    )
    header = ["dtype", "task", "n", "T", "s", "TFLOP", "TFLOP/s", "of peak"]
    return [head, ""] + _table(header, rows)


SECTION_MD = {
    "training": _md_training,
    "resume": _md_resume,
    "patching": _md_patching,
    "clamps": _md_clamps,
    "leakage": _md_leakage,
    "edges": _md_edges,
    "real_model": _md_real_model,
    "projection": _md_projection,
}


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--resume-worker"]:
        return resume_worker(Path(argv[1]))
    args = parse_args(argv)
    if args.rehearsal_results and not (args.rehearsal_results / "benchmarks").is_dir():
        raise SystemExit(f"--rehearsal-results {args.rehearsal_results}: no benchmarks/ folder")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (dry mode: --device cpu --tiny)")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    sections: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        ctx = Context(
            device,
            args.tiny,
            args.peak_tflops,
            Path(work),
            Path(args.config),
            args.rehearsal_results,
            args.rehearsal_config,
        )
        for name, seconds in SECTIONS.items():
            if name not in args.sections:
                sections[name] = {"status": "skipped", "reason": "not in --sections"}
                continue
            if budget.left() < 5:
                sections[name] = {"status": "skipped", "reason": "the run's budget is spent"}
                continue
            deadline = budget.deadline(seconds)
            t0 = time.perf_counter()
            print(f"[gpu_check] {name} (budget {seconds} s) ...", file=sys.stderr, flush=True)
            try:
                result = SECTION_FUNCTIONS[name](ctx, deadline)
                result.setdefault("status", "partial" if result.get("skipped") else "ok")
            except Exception as err:  # a failed section is reported; the next one runs
                result = {
                    "status": "error",
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            result["seconds"] = time.perf_counter() - t0
            result["budget_s"] = seconds
            sections[name] = result
            print(
                f"[gpu_check] {name}: {result['status']} in {result['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        ctx.shared.clear()
    report = {
        "dry_mode": args.tiny,
        "environment": environment(device),
        "budget_s": args.budget_s,
        "total_seconds": time.perf_counter() - budget.start,
        "sections": sections,
    }
    (out / JSON_NAME).write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = markdown(report)
    (out / MD_NAME).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
