"""benchmarks/gpu_check.py in its CPU dry mode (--device cpu --tiny): every section runs and
its JSON and Markdown carry sane values; the projection's jobs are the Study's run sets
(headgeom.heads.cost.JOBS, checked against a Snakemake DAG's job counts) and its rates follow the
config (training.compile, resources.<rule>.gpu, edges.dtype) and a rehearsal's benchmarks.
Expected counts come from config/paper.yaml by hand (docs §6.1: 21 runs; §7: 65,536 steps ×
32 × 512 tokens; §8: 812 examples per task)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from headgeom.heads.analysis.tolerance import forward_tolerance
from tests.tolerances import logit_scale, peer_tolerance

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "training", "resume", "patching", "clamps", "leakage", "edges", "real_model", "projection"
)  # fmt: skip


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
        assert section["status"] == "ok", (name, section.get("error"), section.get("traceback"))
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
    # the test environment is '.[dev]', which has TransformerLens (README's test command)
    assert patching["transformer_lens"] == "compared"
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
    assert edges["status"] == "ok" and edges["dtype"] == "float32"  # the analysis model's
    assert edges["edges_per_s"] > 0 and edges["edges_timed"] > edges["naive_edges_timed"]
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
    from headgeom.heads.analysis import edges as E

    clean, ref = pairs[0][: section["examples"]], pairs[1][: section["examples"]]
    checked = E.all_edges(model.cfg.n_layer, model.cfg.n_head).subset(
        np.arange(section["naive_edges_timed"])
    )
    kl = float(E.edge_kl(model, clean, ref, checked, batch_size=16, max_rows=2048).max())
    delta, V = E.logit_rounding(model), model.cfg.n_vocab
    floor = (8 + math.log2(V)) * E.EPS64 * (1 + 2 * (math.log(V) + 2 * E.logit_scale(model)))
    return 2 * (delta * 2 * math.sqrt(2 * kl) + 2 * delta**2 + floor)


# ----------------------------------------------------------------------------- projection
# The rehearsal DAG's job counts as Snakemake planned them (`snakemake --cores 2
# --configfile config/rehearsal.yaml`, its "Job stats" table, `all` left out): headgeom.heads.cost.
# JOBS must plan the same DAG from the Study's run sets.
REHEARSAL_JOB_STATS = {
    "basis_family": 1, "make_tasks": 3, "param_counts": 1, "tokenize_corpus": 2, "train": 19,
    "train_timeline": 2, "evaluate_step": 2, "geometry_step": 2, "hash_checkpoint": 21,
    "make_table": 12, "patch_step": 2, "acdc": 1, "concentration_step": 2, "edges": 4,
    "evaluate_clean": 21, "geometry_stats": 21, "patch_heads": 21, "scalar_ablation": 2,
    "compare_concentration": 3, "concentration": 21, "lanes_step": 2, "leakage": 1,
    "make_figure": 10, "clamps": 3, "concentration_loss": 1, "coordinates": 4,
    "exclusivity": 1, "lanes": 21, "checks": 1, "dynamics": 2, "make_document": 1, "catalog": 1,
    "explorer": 1, "atp_agreement": 21,
}  # fmt: skip
GPU_RULES = {"train", "train_timeline", "patch_heads", "patch_step", "edges", "coordinates"}


def study_of(config):
    from headgeom import config_layers
    from headgeom.heads.study import Study

    if not isinstance(config, dict):
        config = config_layers.load(config, ROOT)
    return Study.from_config(config)


PAPER_CONFIG = ROOT / "config/paper.yaml"


def test_jobs_are_the_dags():
    from headgeom.heads import cost

    counts = cost.job_counts(study_of(ROOT / "config/rehearsal.yaml"))
    assert {r: n for r, n in counts.items() if n} == REHEARSAL_JOB_STATS
    rules = cost.workflow_rules(ROOT)
    assert set(cost.JOBS) == set(rules)  # every rule of workflow/heads/*.smk, no other
    # a `use rule` copy asks for its base rule's resources; benchmarks as the copy names them
    assert rules["train_timeline"] == {"resources": "train", "benchmark": "train"}
    assert rules["patch_step"] == {"resources": "patch_heads", "benchmark": "patch_step"}
    assert rules["lanes_mode"] == {"resources": "lanes", "benchmark": "lanes"}
    assert rules["clamps"] == {"resources": "clamps", "benchmark": "clamps"}


def test_projection_counts_the_paper_dag(dry_run):
    from headgeom.heads import cost

    report, md = dry_run
    sec = report["sections"]["projection"]
    study = study_of(PAPER_CONFIG)
    rows = {r["rule"]: r for r in sec["rules"]}
    counts = cost.job_counts(study)
    assert list(rows) == [rule for rule, n in counts.items() if n]  # every paper rule, once
    assert set(rows) == set(REHEARSAL_JOB_STATS)  # the same rules as the rehearsal's DAG
    assert set(sec["not_in_dag"]) == {"import_model", "export_hf", "ablation_atlas",
                                      "patch_modes", "concentration_mode", "lanes_mode",
                                      "compare_modes", "patch_kv_heads"}  # fmt: skip
    assert {r: row["jobs"] for r, row in rows.items()} == {r: n for r, n in counts.items() if n}
    # the Study's run sets, by hand for the paper: 12 clamp runs, 21 runs trained (2 of them
    # timelines), 5 leakage runs (every task in one job), 4 timeline steps × 2 timeline runs
    runs = study.runs
    assert sec["runs"] == len(runs) == 21
    assert rows["clamps"]["jobs"] == len(study.run_set("clamps")) == 12
    assert rows["train"]["jobs"] + rows["train_timeline"]["jobs"] == len(runs)
    assert rows["train_timeline"]["jobs"] == len(study.run_set("dynamics_timeline")) == 2
    # one job per run for every task: patch_heads, concentration, lanes, leakage
    assert rows["leakage"]["jobs"] == len(study.run_set("leakage")) == 5
    assert rows["patch_heads"]["jobs"] == rows["concentration"]["jobs"] == len(runs)
    assert rows["patch_step"]["jobs"] == 2 * len(study.timeline_steps) == 8
    assert rows["edges"]["jobs"] == len(study.run_set("edges")) == 15
    assert rows["acdc"]["jobs"] == len(study.run_set("acdc")) == 1
    assert rows["coordinates"]["jobs"] == len(study.run_set("coordinates")) == 13
    assert rows["dynamics"]["jobs"] == 2
    assert rows["scalar_ablation"]["jobs"] == len(study.run_set("dynamics_ablation")) == 5
    # the paper's DAG: the rehearsal's, with 3 more timeline steps (4, not 1) in 5 step rules
    # and the analyses on all their runs (the rehearsal: one run of each family)
    analyses = {"clamps": 12, "edges": 15, "leakage": 5, "scalar_ablation": 5, "coordinates": 13}
    more = sum(n - REHEARSAL_JOB_STATS[r] for r, n in analyses.items())
    assert sec["jobs"] == sum(counts.values()) == sum(REHEARSAL_JOB_STATS.values()) + 30 + more
    # work per job: cost.UNITS (every task's examples per leakage job, §8's 240 each)
    assert rows["leakage"]["units_per_job"] == 3 * 240 and rows["clamps"]["units_per_job"] == 720
    assert rows["patch_heads"]["units_per_job"] == 3 * (300 + 240 + 240)  # holdout reserved
    assert rows["patch_step"]["units_per_job"] == 300  # the lanes split only
    assert rows["train"]["units_per_job"] == 3 * 65_536 * 32 * 512 + 17 * 2_000_000
    # devices from config resources: training, patching, edges and coordinates in paper.yaml
    assert {r for r, row in rows.items() if row["device"] == "GPU"} == GPU_RULES
    gpu_rated = GPU_RULES - {"edges", "coordinates"}  # no float64 edge rate, no coordinates
    for rule, row in rows.items():
        if rule in gpu_rated:
            assert row["rate_source"] == "GPU measured in this run", row
            assert row["gpu_hours"] > 0 and row["cpu_core_hours"] is None
        elif rule in GPU_RULES:
            assert row["rate_source"] == "GPU, not measured here", row
            assert row["gpu_hours"] is None and row["cpu_core_hours"] is None
        else:  # no --rehearsal-results
            assert row["rate_source"] == "CPU, not measured here", row
            assert row["gpu_hours"] is None and row["cpu_core_hours"] is None
        assert row["h100_gpu_hours"] is None  # no GPU peak on a CPU: no scaling
    assert sec["training_compile"] is False
    assert sec["total_gpu_hours"] == pytest.approx(sum(rows[r]["gpu_hours"] for r in gpu_rated))
    assert sec["total_cpu_core_hours"] is None
    assert set(sec["not_projected"]) == set(rows) - gpu_rated
    assert "| train | GPU | 19 |" in md and "| clamps | CPU | 12 |" in md and "**total**" in md


def projection(tmp_path, monkeypatch, config=None, rehearsal=None, peaks=None, **shared):
    """The projection section alone, from given rates: training (geometry, compile) ->
    tokens/s, the analysis rates of a model of ``analysis_flops``."""
    gpu_check = _load_gpu_check()
    path = PAPER_CONFIG
    if config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
    ctx = gpu_check.Context(torch.device("cpu"), False, None, tmp_path, path, rehearsal)
    learned = gpu_check._model_flops(study_of(PAPER_CONFIG))["learned-r"]
    ctx.shared.update(
        training=[
            {"geometry": "learned", "compile": c, "tokens_per_s": tps,
             "gflop_per_token": learned / 1e9}
            for c, tps in shared.pop("training", {False: 1000.0, True: 2000.0}).items()
        ],
        patching_examples_per_s=10.0, leakage_examples_per_s=4.0, analysis_flops=learned,
        **shared,
    )  # fmt: skip
    if peaks:
        monkeypatch.setattr(gpu_check, "device_peaks", lambda ctx: peaks)
    sec = gpu_check.projection_section(ctx, time.perf_counter() + 60)
    return sec, {r["rule"]: r for r in sec["rules"]}


def per_model_seconds(runs, learned_seconds: float) -> float:
    """Seconds of ``runs`` whose learned-r job takes ``learned_seconds``: × FLOPs ratio."""
    flops = _load_gpu_check()._model_flops(study_of(PAPER_CONFIG))
    return sum(learned_seconds * flops[m] / flops["learned-r"] for m, _ in runs)


def paper_dict():
    from headgeom import config_layers

    return config_layers.load(PAPER_CONFIG, ROOT)


def test_training_follows_the_configs_compile(tmp_path, monkeypatch):
    from headgeom.heads import cost

    study = study_of(PAPER_CONFIG)
    flops = _load_gpu_check()._model_flops(study)
    units = cost.UNITS["train"][1](study)
    # learned's rate × its FLOPs over each model's (no other geometry measured here)
    want = sum(units / (3 * 1000.0 * flops["learned-r"] / flops[m])
               for m, s in study.runs if m not in study.timeline_models)  # fmt: skip
    sec, rows = projection(tmp_path, monkeypatch)  # paper.yaml: training.compile false
    assert sec["training_compile"] is False
    assert rows["train"]["seconds"] == pytest.approx(want)
    assert "uncompiled training" in rows["train"]["basis"]
    config = paper_dict()
    config["training"]["compile"] = True
    sec, rows = projection(tmp_path, monkeypatch, config)
    assert sec["training_compile"] is True
    assert rows["train"]["seconds"] == pytest.approx(want / 2)  # the compiled 2,000 tokens/s
    assert "compiled training" in rows["train"]["basis"]
    # without a compiled measurement the compiled study's training is not projected
    sec, rows = projection(tmp_path, monkeypatch, config, training={False: 1000.0})
    assert rows["train"]["rate_source"] == "GPU, not measured here"
    assert rows["train"]["seconds"] is None and "train" in sec["not_projected"]


def test_each_rule_runs_on_its_resources_device(tmp_path, monkeypatch):
    config = paper_dict()
    for rule in ("leakage", "clamps", "edges"):
        config["resources"][rule] = {"gpu": 1}
    shared = {"edges_dtype": "float32", "edge_examples_per_s": 2.0, "edges_total": 20_000}
    sec, rows = projection(tmp_path, monkeypatch, config, **shared)
    assert {r for r, row in rows.items() if row["device"] == "GPU"} == GPU_RULES | {
        "leakage", "clamps", "edges"}  # fmt: skip
    # leakage: 5 jobs of 3 × 240 examples at 4 examples/s of learned, × each model's FLOPs ratio
    leak = rows["leakage"]
    assert leak["rate_source"] == "GPU measured in this run"
    assert leak["seconds"] == pytest.approx(
        per_model_seconds(study_of(PAPER_CONFIG).run_set("leakage"), 3 * 240 / 4.0)
    )
    assert rows["clamps"]["rate_source"] == "GPU, not measured here"  # path cases only
    # edges: the paper's float64 is not what the section measured (float32)
    assert rows["edges"]["rate_source"] == "GPU, not measured here"
    assert "float64" in rows["edges"]["basis"]
    config["edges"]["dtype"] = "float32"
    sec, rows = projection(tmp_path, monkeypatch, config, **shared)
    assert rows["edges"]["rate_source"] == "GPU measured in this run"
    assert rows["edges"]["precision"] == "fp32" and rows["edges"]["seconds"] > 0


def test_each_gpu_row_scales_to_an_h100_at_its_own_precision(tmp_path, monkeypatch):
    peaks = {"bf16": 989.0 / 2, "fp32": 67.0 / 4, "fp64": 30.0}
    sec, rows = projection(tmp_path, monkeypatch, peaks=peaks)
    train, patch = rows["train"], rows["patch_heads"]
    assert train["precision"] == "fp32"  # measured on this CPU (the paper's: bf16 on CUDA)
    assert patch["precision"] == "fp32"  # analyses: fp32, never the bf16 peak
    assert patch["h100_gpu_hours"] == pytest.approx(patch["gpu_hours"] / 4)
    assert train["h100_gpu_hours"] == pytest.approx(train["gpu_hours"] / 4)
    total = sum(r["h100_gpu_hours"] for r in rows.values() if r["h100_gpu_hours"])
    assert sec["total_h100_gpu_hours"] == pytest.approx(total)


def bench(root, rule, job, s, rss=100.0):
    """A Snakemake benchmark file (tests/unit/test_cost.py's format)."""
    path = root / "benchmarks" / rule / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
        f"{s}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t90\t{s}\n"
    )


def test_cpu_rules_come_from_a_rehearsals_benchmarks(tmp_path, monkeypatch):
    results = tmp_path / "rehearsal"
    bench(results, "hash_checkpoint", "learned-r-s42", 1.0)
    bench(results, "leakage", "learned-r-s42", 2.0)
    bench(results, "leakage", "learned-r-s43", 5.0)  # the max over jobs
    bench(results, "clamps", "learned-r-s42", 10.0)
    bench(results, "lanes", "learned-r-s42", 3.0)  # one job per run, every task
    bench(results, "patch_heads", "learned-r-s42", 50.0)  # a GPU rule: not used
    sec, rows = projection(tmp_path, monkeypatch, rehearsal=results)
    assert sec["rehearsal"]["config"] == "config/rehearsal.yaml"
    # by hand, time ∝ units: rehearsal → paper (config/rehearsal.yaml's counts)
    rehearsal = yaml.safe_load((ROOT / "config" / "rehearsal.yaml").read_text())
    n_eval = rehearsal["tasks"]["sva"]["splits"]["evaluation"]  # the paper's: 240
    n_perm = rehearsal["lanes"]["n_permutations"]  # the paper's: 5,000
    want = {
        "hash_checkpoint": 21 * 1.0,  # fixed work
        "leakage": 5 * 5.0 / (3 * n_eval) * (3 * 240),  # evaluation examples → 240 a task
        "clamps": 12 * 10.0 / (3 * n_eval) * (3 * 240),
        "lanes": 21 * 3.0 / (3 * n_perm) * (3 * 5000),  # per run: every task
    }
    for rule, seconds in want.items():
        row = rows[rule]
        assert row["rate_source"] == "CPU fitted from rehearsal benchmarks", row
        assert row["seconds"] == pytest.approx(seconds)
        assert row["cpu_core_hours"] == pytest.approx(seconds / 3600)  # one thread each
    assert sec["total_cpu_core_hours"] == pytest.approx(sum(want.values()) / 3600)
    assert rows["acdc"]["rate_source"] == "CPU, not measured here"
    assert "no benchmark files of acdc" in rows["acdc"]["basis"]
    assert rows["patch_heads"]["rate_source"] == "GPU measured in this run"
    runs = study_of(PAPER_CONFIG).runs
    assert rows["patch_heads"]["seconds"] == pytest.approx(per_model_seconds(runs, 3 * 780 / 10.0))


def test_real_model_rows(dry_run):
    sec = dry_run[0]["sections"]["real_model"]
    assert sec["model"]["query_heads"] % sec["model"]["kv_heads"] == 0  # grouped-query
    assert sec["model"]["query_heads"] > sec["model"]["kv_heads"]
    rows = {(r["precision"], r["task"]) for r in sec["rows"]}
    assert rows == {(p, t) for p in ("fp32", "bf16") for t in ("sva", "quote", "plural")}
    for r in sec["rows"]:
        assert r["seconds"] > 0 and r["tflops"] > 0
        assert r["fraction_of_peak"] is None  # no peak for a CPU


def test_real_model_flops_are_the_counted_flops_of_its_layers():
    """The resumption FLOP count rests on one layer's FLOPs on T tokens; torch's own counter
    over a full forward of the dry mode's Llama (its matmuls and attention, all T × T scores)
    gives the layers' FLOPs plus the LM head's 2·T·D·V."""
    from torch.utils.flop_counter import FlopCounterMode

    gpu_check = _load_gpu_check()
    ctx = gpu_check.Context(torch.device("cpu"), True, None, Path("."), ROOT / "config/paper.yaml")
    model = gpu_check.llama_1b(ctx, torch.float32)
    model.hf.config._attn_implementation = "eager"  # QKᵀ and AV as matmuls the counter sees
    T, L, H = 7, model.cfg.n_layer, model.cfg.n_head
    ids = torch.arange(T)[None] + 3
    with FlopCounterMode(display=False) as counter:
        model.hf(input_ids=ids, use_cache=False)
    lm_head = 2 * T * model.cfg.d_model * model.cfg.n_vocab
    layers = (counter.get_total_flops() - lm_head) / L
    # one example of length T: H patches of layer l each run the L−l layers from l; the
    # clean and reference forwards run all L layers each
    patches = sum(H * (L - layer) for layer in range(L))
    pairs = ([ids[0].numpy()], [ids[0].numpy()], None, None)
    assert gpu_check.resumption_flops(model, pairs) == pytest.approx((patches + 2 * L) * layers)


def test_markdown_has_every_section(dry_run):
    _, md = dry_run
    assert "CPU DRY MODE" in md
    for name in SECTIONS:
        assert f"## {name}" in md
    assert "| rule | device | jobs |" in md and "Not in this study's DAG" in md
