"""Acceptance: the default demo study end to end (slow: ~12 minutes on 2 cores)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import yaml

from tests.e2e.conftest import REPO, make_workdir, planned_jobs, snakemake


@pytest.mark.slow
def test_demo_study_learns_every_task(tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    work = make_workdir(tmp_path / "demo", config)
    start = time.perf_counter()
    snakemake(work, "--cores", "all")
    minutes = (time.perf_counter() - start) / 60
    results = work / "results" / config["study"]
    evals = pd.concat(pd.read_parquet(p) for p in (results / "eval").rglob("*.parquet"))
    evals = evals[evals["split"] == "evaluation"]
    print(evals.to_string(), f"\nwall time {minutes:.1f} min")
    assert evals["accuracy"].min() >= 0.85, evals
    tables = [f"tables/table{n}.{ext}" for n in (3, 5, 6) for ext in ("md", "csv", "tex")]
    figures = [f"figures/figure{n}.{ext}" for n in (3, 4, 5) for ext in ("png", "svg")]
    missing = [p for p in tables + figures if not (results / p).exists()]
    assert not missing, missing
    assert planned_jobs(snakemake(work, "-n", "--cores", "all")) == {}
