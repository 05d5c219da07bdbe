"""The cost model (headgeom.heads.cost): benchmark files read back, units from config counts, the
projection by hand, and requests read from the config the way the workflow reads them."""

from __future__ import annotations

import copy

import pytest
import yaml

from headgeom import cost as shared
from headgeom.heads import cost
from headgeom.heads.study import Study
from tests.e2e.conftest import REPO

MICRO = yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text())


def bench(root, rule, job, s, rss):
    path = root / "benchmarks" / rule / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
        f"{s}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t90\t{s}\n"
    )


def test_benchmarks_are_read_per_rule_with_their_maxima(tmp_path):
    bench(tmp_path, "patch_heads", "a-s1-sva", 2.0, 300.0)
    bench(tmp_path, "patch_heads", "a-s1-quote", 5.0, 250.0)
    (tmp_path / "benchmarks" / "param_counts.tsv").write_text(
        "s\th:m:s\tmax_rss\n1.5\t0:00:01\t120\n"
    )
    got = shared.read_benchmarks(tmp_path)
    assert got["patch_heads"] == shared.Measured("patch_heads", 2, 5.0, 300.0)
    assert got["param_counts"] == shared.Measured("param_counts", 1, 1.5, 120.0)


def test_a_calibration_measured_per_task_is_scaled_to_a_run():
    """patch_heads, concentration and lanes are one job per run for every task; a
    calibration that measured them one job per (run, task) (len(TASKS) × the jobs) has its
    largest job's seconds × len(TASKS) (a run's jobs add up to no more), one that measured
    them per run as measured."""
    study = Study.from_config(MICRO)
    runs, n_perm = len(study.runs), study.stage("lanes")["n_permutations"]
    assert [len(cost.JOBS[r](study)) for r in ("patch_heads", "concentration")] == [runs, runs]
    per_task = {"lanes": shared.Measured("lanes", 3 * runs, 2.0, 100.0)}
    per_run = {"lanes": shared.Measured("lanes", runs, 2.0, 100.0)}
    # units per job: every task's permutations; the study projected to itself
    assert cost.UNITS["lanes"][1](study) == 3 * n_perm
    (old,) = cost.fit(per_task, study, study)
    (new,) = cost.fit(per_run, study, study)
    assert old.seconds == pytest.approx(3 * 2.0) and new.seconds == pytest.approx(2.0)
    # a rule that never was per task is never scaled, whatever its job count
    clamps = shared.Measured("clamps", 3 * len(cost.JOBS["clamps"](study)), 2.0, 100.0)
    assert cost.per_task_calibration("clamps", clamps, study) == 1


def test_a_file_that_is_not_a_benchmark_is_refused_by_name(tmp_path):
    path = tmp_path / "benchmarks" / "lanes" / "x.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match=r"x.tsv: not a Snakemake benchmark file"):
        shared.read_benchmarks(tmp_path)


def test_projection_by_hand():
    small = Study.from_config(MICRO)
    big_cfg = copy.deepcopy(MICRO)
    big_cfg["lanes"] = {**MICRO.get("lanes", {}), "n_permutations": 4 * small.stage("lanes")[
        "n_permutations"]}  # fmt: skip
    big_cfg["patching"] = {**MICRO.get("patching", {}), "batch_size": 2}
    big = Study.from_config(big_cfg)
    measured = {
        "hash_checkpoint": shared.Measured("hash_checkpoint", 3, 1.0, 400.0),
        "lanes": shared.Measured("lanes", 5, 10.0, 200.0),
        "patch_heads": shared.Measured("patch_heads", 5, 8.0, 1000.0),
    }
    by_rule = {p.rule: p for p in cost.fit(measured, small, big)}
    # lanes: time ∝ permutations (×4); loads no model, rows fixed: memory as measured
    assert by_rule["lanes"].seconds == pytest.approx(40.0)
    assert by_rule["lanes"].memory_mb == pytest.approx(200.0)
    # patch_heads: same examples (time as measured); rows = min(examples, batch_size)
    rows_small = min(cost._patched_task(small), small.stage("patching")["batch_size"])
    rows_big = min(cost._patched_task(big), 2)
    want = 400.0 + (1000.0 - 400.0) * max(1.0, rows_big / rows_small)
    assert by_rule["patch_heads"].seconds == pytest.approx(8.0)
    assert by_rule["patch_heads"].memory_mb == pytest.approx(want)
    # train: rows = batch_size (×2 here): on a CPU 400 + 600 × 2; on a GPU the rows live on
    # the device, so host memory stays as measured
    wide_cfg = copy.deepcopy(MICRO)
    wide_cfg["training"] = {**MICRO["training"], "batch_size": 2 * small.stage("training")[
        "batch_size"]}  # fmt: skip
    wide = Study.from_config(wide_cfg)
    measured["train"] = shared.Measured("train", 1, 5.0, 1000.0)
    assert {p.rule: p for p in cost.fit(measured, small, wide)}["train"].memory_mb == 1600.0
    on_gpu = {p.rule: p for p in cost.fit(measured, small, wide, on_gpu={"train"})}
    assert on_gpu["train"].memory_mb == pytest.approx(1000.0)
    # acdc: the larger of the fit and the paper-shape benchmark's rate per example
    measured["acdc"] = shared.Measured("acdc", 1, 2.0, 500.0)
    acdc = {p.rule: p for p in cost.fit(measured, small, big)}["acdc"]
    n = big.stage("edges")["n_examples"]
    assert acdc.seconds == pytest.approx(max(2.0, cost.BENCHMARKED["acdc"][0] * n))
    assert acdc.seconds == pytest.approx(1.94 * 3600 / 16 * n)


@pytest.mark.e2e  # a Snakemake subprocess
def test_requests_are_what_the_dry_run_plans(tmp_path):
    # the rule's own default (lanes: 1000 MB in lanes.smk), then config resources
    from tests.e2e.conftest import make_workdir

    cfg = copy.deepcopy(MICRO)
    cfg["resources"] = {"default": {"runtime": 7}, "lanes": {"mem_mb": 1234}}
    work = make_workdir(tmp_path / "w", cfg)
    (work / "slurm").symlink_to(REPO / "slurm")
    planned = shared.planned_requests("config.yaml", work)
    assert shared.request(planned, "lanes") == (1234, 7)
    assert planned["lanes"]["jobs"] == len(Study.from_config(MICRO).runs)  # every task in one
    assert {"make_table", "catalog", "all"} <= cost.local_rules(REPO)
    assert "lanes" not in cost.local_rules(REPO)


def test_suggested_requests_round_up_with_margin():
    p = shared.Projection("x", 1, 1.0, 1.0, "job", 1, 1, seconds=610.0, memory_mb=1001.0)
    # 1001 MB × 1.5 = 1501.5 → 2000 (next 500); 610 s × 1.5 = 15.25 min → 20 (next 10)
    assert shared.suggested(p, margin=1.5) == {"mem_mb": 2000, "runtime": 20}
    p = shared.Projection("x", 1, 1.0, 1.0, "job", 1, 1, seconds=30.0, memory_mb=100.0)
    assert shared.suggested(p, margin=1.5) == {"mem_mb": 500, "runtime": 10}  # the floors


def test_every_rule_has_units_or_is_fixed_work():
    # a rule whose work grows with a count but has no unit would be projected as if it never
    # grew; every rule of the workflow is one or the other
    import re

    text = "\n".join(p.read_text() for p in (REPO / "workflow" / "heads").glob("*.smk"))
    rules = set(re.findall(r"^rule (\w+):", text, re.M))
    rules |= set(re.findall(r"^use rule \w+ as (\w+)", text, re.M))
    fixed = {"hash_checkpoint", "make_tasks", "param_counts", "basis_family", "geometry_stats",
             "geometry_step", "exclusivity", "concentration_loss", "make_table", "make_figure",
             "make_document", "catalog", "explorer", "checks", "compare_modes", "export_hf",
             "import_model"}  # fmt: skip
    assert "train_timeline" in rules and "patch_heads" in rules  # the parse found them
    assert not fixed & set(cost.UNITS)
    assert rules - fixed <= set(cost.UNITS), sorted(rules - fixed - set(cost.UNITS))


def test_summary_round_trips_and_refuses_other_files(tmp_path):
    measured = {"lanes": shared.Measured("lanes", 3, 2.5, 210.0),
                "train": shared.Measured("train", 21, 170.25, 6504.7)}  # fmt: skip
    path = tmp_path / "s.tsv"
    shared.write_summary(measured, path, "test machine")
    assert path.read_text().startswith("# test machine\n")
    assert cost.measured_of(path) == measured
    (tmp_path / "bad.tsv").write_text("rule\tseconds\nx\t1\n")
    with pytest.raises(ValueError, match=r"bad.tsv: expected a cost summary"):
        shared.read_summary(tmp_path / "bad.tsv")


def test_report_projects_cpu_rules_and_leaves_gpu_time_to_gpu_check():
    p = [shared.Projection("lanes", 2, 3.0, 150.0, "permutations", 100, 5000, 150.0, 150.0),
         shared.Projection("train", 1, 9.0, 900.0, "tokens", 10, 1e9, 9e8, 2000.0)]  # fmt: skip
    planned = {"lanes": {"mem_mb": 1000, "runtime": 2, "gpu": 0, "jobs": 63},
               "train": {"mem_mb": 64000, "runtime": 720, "gpu": 1, "jobs": 21}}  # fmt: skip
    text = cost.report(p, planned)
    lanes, train = (next(ln for ln in text.splitlines() if ln.startswith(f"| {r} "))
                    for r in ("lanes", "train"))  # fmt: skip
    assert "| 2.5 min |" in lanes and lanes.endswith("| 1,000, 2 | NO |")  # 150 s > 2 min
    assert "GPU rule: gpu_check" in train and train.endswith("| yes |")  # memory only
    assert "on this CPU: 2.6 h" in text  # 63 × 150 s; the GPU rule is not in it


# ----------------------------------------------------------------------------- the paper
# The rehearsal's per-rule maxima on one CPU core (python -m headgeom.heads.cost summary; the run
# and machine are named in the file's first line).
CALIBRATION = REPO / "benchmarks" / "rehearsal_cpu.tsv"
# Paper rules the calibration run had not reached when it was summarised (its first line
# says so): their requests are the rule defaults, unchecked here. Measure them (a finished
# rehearsal, `python -m headgeom.heads.cost summary`) and empty this set.
NOT_YET_MEASURED = {"atp_agreement"}  # added after the calibration run (AtP beside exact)


def test_paper_requests_cover_the_projected_cost():
    from headgeom import config_layers

    def study(name):
        return Study.from_config(config_layers.load(REPO / "config" / name, REPO))

    measured = shared.read_summary(CALIBRATION)
    planned = shared.planned_requests("config/paper.yaml", REPO)
    submitted = set(planned) - cost.local_rules(REPO)
    # a `use rule` copy (train_timeline) writes its benchmark files where its base rule does
    benchmark = {r: spec["benchmark"] for r, spec in cost.workflow_rules(REPO).items()}
    ran = {r for r in planned if benchmark.get(r, r) in measured}
    missing = submitted - ran - set(cost.NOT_PROJECTED)
    assert missing == NOT_YET_MEASURED, f"paper rules the rehearsal never ran: {sorted(missing)}"
    on_gpu = {r for r in planned if planned[r].get("gpu")}
    short = []
    for p in cost.fit(measured, study("rehearsal.yaml"), study("paper.yaml"), on_gpu):
        if p.rule not in submitted or p.rule in cost.NOT_PROJECTED:
            continue
        mem, runtime = shared.request(planned, p.rule)
        if p.memory_mb > mem:
            short.append(f"{p.rule}: {p.memory_mb:,.0f} MB projected > {mem:,} requested")
        # training's GPU time is gpu_check's; any other job's CPU time bounds it
        if p.rule not in cost.GPU_TIMED and p.seconds > runtime * 60:
            short.append(f"{p.rule}: {p.seconds / 60:,.0f} min projected > {runtime} requested")
    assert not short, "\n".join(short)
    assert {r for r in cost.GPU_TIMED if r in planned} <= on_gpu  # training asks for a GPU
