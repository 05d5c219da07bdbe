"""benchmarks/gpu_check.py in its CPU dry mode (--device cpu --tiny): every section runs and
its JSON and Markdown carry sane values; expected counts come from config/paper.yaml by hand
(docs §6.1: 21 runs; §7: 65,536 steps × 32 × 512 tokens; §8: 812 examples per task)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headgeom.analysis.tolerance import forward_tolerance
from tests.tolerances import logit_scale, peer_tolerance

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("training", "resume", "patching", "clamps", "leakage", "edges", "projection")


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    gpu_check = _load_gpu_check()
    assert gpu_check.main([str(out), "--device", "cpu", "--tiny", "--threads", "1"]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    return report, (out / "gpu_check.md").read_text()


@pytest.fixture(scope="module")
def dry_inputs(tmp_path_factory):
    """The dry run's analysis model and examples, rebuilt (seeded) by the benchmark's own
    functions: the magnitudes its engine comparisons are held to."""
    gpu_check = _load_gpu_check()
    work = tmp_path_factory.mktemp("gpu_check_inputs")
    ctx = gpu_check.Context(torch.device("cpu"), True, None, work, ROOT / "config/paper.yaml")
    return gpu_check.analysis_model(ctx), gpu_check.examples(ctx, 4)


def test_every_section_ran(dry_run):
    report, _ = dry_run
    assert report["dry_mode"] is True
    assert list(report["sections"]) == list(SECTIONS)
    for name, section in report["sections"].items():
        allowed = {"ok", "not present"} if name == "edges" else {"ok"}
        assert section["status"] in allowed, (name, section.get("error"), section.get("traceback"))
        assert 0 <= section["seconds"] <= section["budget_s"] + 30
    assert report["total_seconds"] < report["budget_s"]


def test_training_rows(dry_run):
    report, _ = dry_run
    sec = report["sections"]["training"]
    rows = sec["rows"]
    want = {(g, c) for g in ("learned", "write-common-axis", "all-rotated-self", "read-common",
                             "write-routed-a") for c in (False, True)}  # fmt: skip
    assert {(r["geometry"], r["compile"]) for r in rows} == want and not sec["skipped"]
    s = sec["shape"]
    V, D, T, L, H, dh, dm = (s[k] for k in ("vocab", "d_model", "n_ctx", "n_layer", "n_head",
                                            "d_head", "d_mlp"))  # fmt: skip
    # GPT-2 by hand: tied wte, wpe, per layer LN, QKV, O, LN, MLP (with biases), final LN
    layer = 2 * D + 3 * D * H * dh + 3 * H * dh + H * dh * D + D + 2 * D + 2 * D * dm + dm + D
    n_learned = V * D + T * D + L * layer + 2 * D
    flops = 6 * (n_learned - T * D) + 12 * L * H * dh * T  # the position embedding: no matmul
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0
        assert r["tokens_per_s"] == pytest.approx(s["batch"] * T / (r["ms_per_step"] / 1e3))
        assert r["mfu"] is None and r["peak_memory_bytes"] is None  # CPU: no peak, no CUDA
        assert r["ratio_to_learned"] > 0
        if r["geometry"] == "learned":
            assert r["n_params"] == n_learned
            assert r["gflop_per_token"] * 1e9 == pytest.approx(flops)
            assert r["ratio_to_learned"] == 1.0
        else:  # frozen bases: fewer trainable parameters or extra heads, never a free lunch
            assert r["gflop_per_token"] > 0
    assert sec["peak_tflops"] is None and "CPU" in sec["peak_source"]


def test_resume_matches_bytes_on_cpu(dry_run):
    report, _ = dry_run
    sec = report["sections"]["resume"]
    assert set(sec["modes"]) == {"default", "deterministic"}
    for mode in sec["modes"].values():
        assert mode["killed"] and mode["kill_exit_code"] == -9
        assert mode["resumed_from"] == sec["kill_after_state_of_step"]
        assert mode["bytes_match"] is True and mode["max_abs_weight_diff"] == 0.0
        assert mode["steps_per_s"] > 0
    assert sec["deterministic_slowdown"] > 0
    assert sec["default_vs_deterministic_max_abs_weight_diff"] == 0.0  # CPU fp32: same bits


def test_engines(dry_run, dry_inputs):
    report, _ = dry_run
    model, data = dry_inputs
    scale = max(logit_scale(model, clean, ref) for clean, ref, *_ in data.values())
    s = report["sections"]
    patching, clamps, leakage = s["patching"], s["clamps"], s["leakage"]
    assert [r["task"] for r in patching["rows"]] == ["sva", "quote", "plural"]
    assert patching["examples_per_s"] > 0
    if patching["transformer_lens"] == "compared":  # the dev environment has it
        assert patching["speedup_vs_transformer_lens"] > 0
        # TransformerLens, an independent implementation: 2 (L + 1) stages at |logit|
        tol = peer_tolerance(model, scale)
        assert max(r["max_abs_delta_e"] for r in patching["rows"]) <= tol
    assert len(clamps["rows"]) == 3 and clamps["case_examples_per_s"] > 0
    n_cases = 5 * len(clamps["sources"])  # five §15.3 conditions per source
    tol = forward_tolerance(model, scale)  # engine and naive part at block 0: L + 1 stages
    assert all(r["cases"] == n_cases and r["max_abs_delta_drop"] <= tol for r in clamps["rows"])
    assert len(leakage["rows"]) == 3 and leakage["examples_per_s"] > 0
    edges = s["edges"]
    if edges["status"] == "ok":
        assert edges["edges_per_s"] > 0
        assert edges["max_abs_delta_kl"] <= kl_tolerance(model, data["sva"], edges)


def kl_tolerance(model, pairs, section) -> float:
    """Tolerance of the edges section's fast against naive KLs (both in the model's dtype):
    each KL is within δ·S + 2δ² of the exact one (``edges.kl_rounding_bound``), δ the
    logits' rounding bound ``edges.logit_rounding`` (eps, L + 1 stages, a weight bound on
    every logit), S = ‖q − p‖₁ + Σ p|log p/q − KL| ≤ 2√(2·KL) to leading order near P = Q
    (Pinsker; KL ≈ ½ Var_p(log p/q)); twice that for the two routes, at the largest KL of the
    section's examples and naively checked edges, plus both float64 summation floors
    (``edges.summation_floor``, |log p| ≤ log V + 2·scale). The bound from magnitudes alone
    (S ≤ 2 + 8·scale) would be larger than every KL here."""
    from headgeom.analysis import edges as E

    clean, ref = pairs[0][: section["examples"]], pairs[1][: section["examples"]]
    checked = E.all_edges(model.cfg.n_layer, model.cfg.n_head).subset(
        np.arange(section["naive_edges_timed"])
    )
    kl = float(E.edge_kl(model, clean, ref, checked).max())
    delta, V = E.logit_rounding(model), model.cfg.n_vocab
    floor = (8 + math.log2(V)) * E.EPS64 * (1 + 2 * (math.log(V) + 2 * E.logit_scale(model)))
    return 2 * (delta * 2 * math.sqrt(2 * kl) + 2 * delta**2 + floor)


def test_projection_counts_the_paper_dag(dry_run):
    report, _ = dry_run
    sec = report["sections"]["projection"]
    rules = {r["rule"]: r for r in sec["rules"]}
    assert set(rules) == {"train", "patch_heads", "patch_step", "leakage", "clamps"}
    assert sec["runs"] == 21
    assert rules["train"]["jobs"] == 21
    assert rules["train"]["units"] == 21 * 65_536 * 32 * 512
    assert rules["patch_heads"]["jobs"] == 63
    assert rules["patch_heads"]["units"] == 63 * (300 + 240 + 240)  # holdout reserved (§16.1)
    assert rules["leakage"]["jobs"] == 5 * 3 and rules["leakage"]["units"] == 15 * 240
    # issue 12: write-common and write-rotated-r (corpus R) at steps 256, 1,024, 4,096,
    # 16,384; SVA's discovery split (300) only
    assert rules["patch_step"]["jobs"] == 8 and rules["patch_step"]["units"] == 8 * 300
    # clamps: the 12 runs of clamps.* in paper.yaml, every task, 25 + 3 + 5 · 12 cases
    assert rules["clamps"]["jobs"] == 36 and rules["clamps"]["units"] == 36 * 240 * 88
    for r in rules.values():
        assert r["gpu_hours"] > 0 and r["h100_gpu_hours"] is None  # no GPU peak: no scaling
    # train at the learned rate is a lower bound wherever the learned model is the largest
    assert rules["train"]["seconds"] >= 0.5 * rules["train"]["units"] / rules["train"]["rate"]
    total = sum(r["gpu_hours"] for r in rules.values())
    assert math.isclose(sec["total_gpu_hours"], total)


def test_markdown_has_every_section(dry_run):
    _, md = dry_run
    assert "CPU DRY MODE" in md
    for name in SECTIONS:
        assert f"## {name}" in md
    assert "| train | 21 |" in md and "**total**" in md
