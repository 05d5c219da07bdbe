"""The SA-MoE cost model (headgeom.samoe.cost): projections by hand from SAMOE §8 counts,
every rule accounted for, and the paper study's requests covering the projection of the
SA-MoE demo's benchmark files."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from headgeom import cost as shared
from headgeom.samoe import cost as sc
from headgeom.samoe import counts as C
from headgeom.samoe.study import SAMoEStudy

ROOT = Path(__file__).resolve().parents[3]


def study(name: str):
    return SAMoEStudy.from_config(yaml.safe_load((ROOT / "config" / name).read_text()))


def test_projection_by_hand():
    toy, paper = study("samoe.yaml"), study("samoe-paper.yaml")
    measured = {
        "samoe_li": shared.Measured("samoe_li", 3, 20.0, 700.0),
        "samoe_stats": shared.Measured("samoe_stats", 1, 3.0, 380.0),
    }
    by_rule = {p.rule: p for p in sc.fit(measured, toy, paper)}
    # li: 24 sequences × Σ over target slots of (3L + 3) forwards of T tokens
    toy_flops = C.counts(C.toy_shape(toy.dense_config("toy").model_config(sc.TOY_VOCAB)),
                         toy.moe_config(), "persistent").flops_per_token  # fmt: skip
    toy_units = 24 * sum(3 * L + 3 for L in [6, 7, 6, 7]) * 128 * toy_flops
    gemma = C.counts(C.GEMMA, paper.moe_config(), "persistent").flops_per_token
    smollm2 = C.counts(C.SMOLLM2, paper.moe_config(), "persistent").flops_per_token
    paper_units = max(24 * sum(3 * L + 3 for L in [10, 13, 16, 17]) * 2048 * gemma,
                      24 * sum(3 * L + 3 for L in [12, 16, 21, 25]) * 2048 * smollm2)  # fmt: skip
    li = by_rule["samoe_li"]
    assert li.units == toy_units and li.target_units == paper_units
    assert li.seconds == pytest.approx(20.0 / toy_units * paper_units)
    # memory: the measured peak + 2 float32 copies (weights, gradient) of the added parameters
    grown = (C.counts(C.SMOLLM2, paper.moe_config(), "persistent").total
             - sc.params(toy)) * 4 / 2**20  # fmt: skip
    assert li.memory_mb == pytest.approx(700.0 + 2 * grown)
    # a job that loads no model and whose work is fixed keeps its time and memory
    stats = by_rule["samoe_stats"]
    assert (stats.seconds, stats.memory_mb) == (3.0, 380.0)


def test_every_samoe_rule_is_projected_fixed_or_named_not_projected():
    rules = set()
    for path in (ROOT / "workflow" / "samoe").glob("*.smk"):
        rules |= set(re.findall(r"^rule (\w+):", path.read_text(), re.M))
    known = set(sc.UNITS) | set(sc.FIXED) | set(sc.NOT_PROJECTED)
    assert rules - {"all"} == known, (rules - known, known - rules)


def test_the_summary_is_the_demo_and_names_every_rule_it_ran():
    measured = sc.measured_of(ROOT / "benchmarks" / "samoe_demo_cpu.tsv")
    assert set(measured) == set(sc.UNITS) | set(sc.FIXED) | {"samoe_corpus", "samoe_dense"}
    assert measured["samoe_train"].jobs == 9 and measured["samoe_li"].jobs == 3


def test_the_real_model_summary_names_every_rule_of_its_dag():
    measured = sc.measured_of(ROOT / "benchmarks" / "samoe_smollm2_cpu.tsv")
    imported = {"samoe_hub_corpus", "samoe_import_dense"}  # no toy corpus or dense training
    assert set(measured) == set(sc.UNITS) | set(sc.FIXED) | imported
    assert measured["samoe_train"].jobs == 3 and measured["samoe_interventions"].jobs == 2


def test_projection_from_the_real_model_by_hand():
    real, paper = study("samoe-smollm2.yaml"), study("samoe-paper.yaml")
    measured = {"samoe_li": shared.Measured("samoe_li", 1, 300.0, 2500.0)}
    (li,) = sc.fit(measured, real, paper)
    # T = 64, E = 4: forward FLOPs per token of the persistent variant at SmolLM2's widths
    flops = C.counts(dataclasses.replace(C.SMOLLM2, seq_len=64), real.moe_config(),
                     "persistent").flops_per_token  # fmt: skip
    assert li.units == 3 * sum(3 * L + 3 for L in [12, 16, 21, 25]) * 64 * flops
    assert li.seconds == pytest.approx(300.0 / li.units * li.target_units)
    # 2 copies of the parameters the paper's 16 experts add over the rehearsal's 4
    added = (C.counts(C.SMOLLM2, paper.moe_config(), "persistent").total
             - C.counts(C.SMOLLM2, real.moe_config(), "persistent").total)  # fmt: skip
    # 12 more experts (3 matrices of 576 × 1536) and their router rows (W^x and W^s: 576 + 128)
    assert added == 30 * 12 * 3 * 576 * 1536 + 30 * 12 * (576 + 128)
    assert li.memory_mb == pytest.approx(2500.0 + 2 * added * 4 / 2**20)


def test_paper_requests_cover_the_projected_cost():
    # projected from the real-model rehearsal (SmolLM2's widths and depth, reduced counts)
    measured = sc.measured_of(ROOT / "benchmarks" / "samoe_smollm2_cpu.tsv")
    projections = sc.fit(measured, study("samoe-smollm2.yaml"), study("samoe-paper.yaml"))
    planned = shared.planned_requests(ROOT / "config" / "samoe-paper.yaml", cwd=ROOT)
    assert sc.uncovered(projections, planned, margin=shared.MARGIN) == []
    # and the check can fail: at twice the margin the suppression grids are not covered
    assert "samoe_li" in sc.uncovered(projections, planned, margin=2 * shared.MARGIN)
    # memory never below the toy demo's projection
    toy = sc.fit(sc.measured_of(ROOT / "benchmarks" / "samoe_demo_cpu.tsv"), study("samoe.yaml"),
                 study("samoe-paper.yaml"))  # fmt: skip
    for p in toy:
        if p.rule in planned and p.rule not in sc.NOT_PROJECTED:
            assert shared.request(planned, p.rule)[0] >= shared.MARGIN * p.memory_mb, p.rule
    assert planned["samoe_train"]["gpu"] == 8
    # the analyses ask one GPU each; their time is still held to the CPU projection
    # (and the harness, not projected: the toy has no harness job to measure)
    on_gpu = {r for r, res in planned.items() if res.get("gpu")}
    assert on_gpu == sc.GPU_TIMED | sc.GPU_BOUNDED | {"samoe_harness"}
    assert "samoe_harness" in sc.NOT_PROJECTED and planned["samoe_harness"]["gpu"] == 1
    by_rule = {p.rule: p for p in projections}
    for rule in sc.GPU_BOUNDED:
        assert planned[rule]["gpu"] == 1
        assert planned[rule]["runtime"] * 60 >= shared.MARGIN * by_rule[rule].seconds, rule
    lines = sc.report(projections, planned).splitlines()
    for rule in sc.GPU_BOUNDED:
        (line,) = [x for x in lines if x.startswith(f"| {rule} |")]
        assert "GPU (≤" in line and line.endswith("| yes |"), line


def test_the_paper_analyses_ask_one_gpu_with_four_cpus_and_the_toy_none():
    paper, toy = study("samoe-paper.yaml"), study("samoe.yaml")
    for rule in sc.GPU_BOUNDED:
        res = paper.resources(rule, mem_mb=1000, runtime=10)
        assert (res["gpu"], res["cpus_per_gpu"], paper.threads(rule)) == (1, 4, 4), rule
        assert "cpus_per_task" not in res
        assert toy.resources(rule, mem_mb=1000, runtime=10)["gpu"] == 0
        assert toy.threads(rule) == 1
    # where they run: CUDA when the job sees one (the schema's default, named in the paper's)
    assert paper.analysis_device == toy.analysis_device == "auto"
    assert sc.GPU_BOUNDED.isdisjoint(sc.GPU_TIMED) and sc.GPU_BOUNDED <= set(sc.UNITS)


def test_every_gpu_analysis_rule_passes_the_study_device():
    text = (ROOT / "workflow" / "samoe" / "analyses.smk").read_text()
    for rule in sc.GPU_BOUNDED:
        body = text.split(f"\nrule {rule}:\n")[1].split("\nrule ")[0]
        assert "device=STUDY.analysis_device," in body, rule
        assert "--device {params.device}" in body, rule
