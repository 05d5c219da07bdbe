"""The Slurm profile and what sbatch is asked for, without a cluster (default test run).

The paper study's jobs are planned under `--profile slurm --cores 1` (a dry run: the
resources Snakemake hands to the executor), and the Slurm plugin's own sbatch builder turns
them into flags; the flags must be config/paper.yaml's values, not `--cores 1`'s.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from headgeom import cost as shared
from tests.e2e.conftest import REPO

submit_string = pytest.importorskip(
    "snakemake_executor_plugin_slurm.submit_string",
    reason="snakemake-executor-plugin-slurm is not installed",
)
from snakemake_executor_plugin_slurm.utils import set_gres_string  # noqa: E402

PROFILE = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
# one lanes output needs a job of every rule tested below (corpus → train → patching → lanes)
LANES_TARGET = "results/paper/lanes/learned-r/s42/sva.parquet"


def test_profile_settings():
    assert PROFILE["executor"] == "slurm"
    assert PROFILE["slurm-status-command"] == "squeue"
    assert PROFILE["rerun-incomplete"] is True
    assert PROFILE["retries"] >= 1
    # editing a script mid-study must not rerun finished jobs (snakemake #3234)
    assert "code" not in PROFILE["rerun-triggers"]
    assert {"mtime", "params", "input"} <= set(PROFILE["rerun-triggers"])
    assert PROFILE["slurm-keep-successful-logs"] is True
    assert PROFILE["latency-wait"] >= 30


class Resources(dict):
    """What the plugin reads: `resources.get(key)` and `resources.key`."""

    __getattr__ = dict.__getitem__


@pytest.fixture(scope="module")
def planned_resources() -> dict[str, Resources]:
    """Resources of the first planned job of each rule, as a dry run of the paper study
    under the Slurm profile and --cores 1 reports them (headgeom.cost.planned_requests)."""
    planned = shared.planned_requests("config/paper.yaml", REPO, [LANES_TARGET])
    return {rule: Resources(res) for rule, res in planned.items()}


def sbatch_flags(resources: Resources) -> str:
    job = SimpleNamespace(resources=resources, threads=1, name="x")
    params = {
        "run_uuid": "u",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": "",
    }
    return submit_string.get_submit_command(job, params) + set_gres_string(job)


@pytest.mark.parametrize("rule", ["train", "patch_heads", "tokenize_corpus", "lanes"])
def test_sbatch_asks_for_what_paper_config_says(planned_resources, rule):
    res = PAPER["resources"]
    gpu = res.get(rule, {}).get("gpu")  # a GPU job: gpu_default between default and the rule
    cfg = {**res["default"], **(res.get("gpu_default", {}) if gpu else {}), **res.get(rule, {})}
    flags = sbatch_flags(planned_resources[rule])
    assert f" --mem {cfg['mem_mb']}" in flags
    assert f" -t {cfg['runtime']}" in flags
    if cfg.get("gpu"):
        assert f"--gpus={cfg['gpu']}" in flags
        assert f"--cpus-per-gpu={cfg['cpus_per_gpu']}" in flags
        assert "--cpus-per-task" not in flags
    else:
        assert "--gpus" not in flags
        assert f"--cpus-per-task={cfg.get('cpus_per_task', 1)}" in flags


def test_paper_training_asks_for_a_gpu():
    train = PAPER["resources"]["train"]
    assert train["gpu"] >= 1 and train["cpus_per_gpu"] > 1
