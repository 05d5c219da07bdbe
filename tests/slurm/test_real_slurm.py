"""The micro study through a real Slurm (slurmctld + slurmd on localhost) with --profile slurm.

Run with `python -m pytest -m slurm tests/slurm -x` (root; installs Debian's slurm-wlm and
munge when missing). It runs the micro study twice, once locally with `--cores 2` and once
through sbatch from a submit host limited to `--cores 1`, and asserts that

* every job of the DAG except the workflow's localrules went through sbatch, the profile's
  groups as one submission per connected component (a Slurm job id per submission in
  snakemake's log, a Slurm log file per id, the job COMPLETED in slurmctld);
* each job got exactly what config asked for, not what `--cores 1` would allow (train:
  2 CPUs, 1500 MB, 20 min; the rest: 1 CPU, 500 MB, 10 min; all in the local partition);
* every output has the same SHA-256 as the local run's: checkpoints (final and intermediate),
  tables, figures and the corpus manifest byte for byte, Parquets over their rows and schema
  (their provenance metadata names the run's training log, whose wall-clock column differs),
  checkpoint manifests over their identity fields.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from headgeom.heads import cost
from tests.e2e.conftest import REPO, make_workdir, planned_jobs, snakemake
from tests.slurm.cluster import ClusterError, LocalSlurm, ensure_installed

pytestmark = pytest.mark.slurm

TRAIN = {"gpu": 0, "cpus_per_task": 2, "threads": 1, "mem_mb": 1500, "runtime": 20}
DEFAULT = {"mem_mb": 500, "runtime": 10}
# What is compared, and how. The training log holds wall-clock seconds, so its bytes, the
# checkpoint manifests that hash it and every Parquet's provenance metadata that names those
# manifests legitimately differ between two runs; the science must not.
NOT_COMPARED = ("logs/", "benchmarks/", "train_log.parquet", ".sources.json")
MANIFEST_KEYS = (
    "checkpoint_file_sha256",
    "config_hash",
    "data",
    "step",
    "tokens_seen",
    "val_loss_nats",
    "corpus_manifest_sha256",
)
EDITED_MANIFEST_KEYS = ("checkpoint_file_sha256", "config_hash", "config_id", "edit", "step")
CATALOG_RUN_COLUMNS = ["size_bytes", "sha256", "manifest_sha256"]


def slurm_config(micro: dict, partition: str) -> dict:
    """The micro study with cluster resources: the partition of the local cluster, no GPU
    (none here), and a train request larger than the submit host's --cores 1."""
    cfg = copy.deepcopy(micro)
    cfg["resources"] = {
        "default": {**DEFAULT, "slurm_partition": partition},
        "train": TRAIN,
    }
    return cfg


def content_hash(path: Path) -> str:
    """SHA-256 of what a file says: a Parquet's rows and schema (not its provenance
    metadata), a checkpoint manifest's identity fields, any other file's bytes."""
    if path.name == "catalog.parquet":
        # its sha256 columns hash the Parquets' provenance and the manifests above; the
        # rows (which artifact, which rule, which run) must agree, and each run's hashes
        # are checked against its own files in test_catalog_hashes_its_files
        table = pq.read_table(path).drop_columns(CATALOG_RUN_COLUMNS)
        return json_hash(table.to_pylist())
    if path.name == "explorer.html":
        # it cites each Parquet's SHA-256, which covers provenance metadata (as the catalog's
        # sha256 column does); the page's data and everything else must agree
        text = re.sub(r'"sha256":"[0-9a-f]{64}"', '"sha256":""', path.read_text())
        return hashlib.sha256(text.encode()).hexdigest()
    if path.suffix == ".parquet":
        table = pq.read_table(path).replace_schema_metadata(None).combine_chunks()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()
    if path.name.endswith("manifest.json") and "models" in path.parts:
        record = json.loads(path.read_text())
        return json_hash({k: record.get(k) for k in MANIFEST_KEYS})
    if path.name.endswith("manifest.json") and "scalar_ablation" in path.parts:
        # an edited checkpoint's manifest hashes its parent's manifest (which names the
        # training log): compare the edit, the edited bytes and the parent's bytes
        record = json.loads(path.read_text())
        return json_hash({
            **{k: record.get(k) for k in EDITED_MANIFEST_KEYS},
            "parent": record["parent"]["checkpoint_file_sha256"],
        })  # fmt: skip
    return hashlib.sha256(path.read_bytes()).hexdigest()


def json_hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def output_hashes(workdir: Path, study: str) -> dict[str, str]:
    root = workdir / "results" / study
    hashes = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not any(part in rel for part in NOT_COMPARED):
            hashes[rel] = content_hash(path)
    return hashes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip(
            "needs root: installs slurm-wlm/munge with apt-get and starts slurmctld, "
            "slurmd and munged on localhost"
        )
    try:
        ensure_installed()
        slurm = LocalSlurm(tmp_path_factory.mktemp("slurm-state")).start()
    except ClusterError as err:
        pytest.fail(f"local Slurm could not be set up: {err}")
    try:
        yield slurm
    finally:
        slurm.stop()


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    micro = yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text())
    cfg = slurm_config(micro, cluster.partition)
    local = make_workdir(tmp_path_factory.mktemp("local") / "w", cfg)
    remote = make_workdir(tmp_path_factory.mktemp("remote") / "w", cfg)
    (remote / "slurm").symlink_to(REPO / "slurm")  # --profile slurm looks in the cwd
    planned = planned_jobs(snakemake(remote, "-n", "--cores", "1"))
    timings = {}
    start = time.monotonic()
    snakemake(local, "--cores", "2")
    timings["local"] = time.monotonic() - start
    start = time.monotonic()
    proc = snakemake(
        remote,
        "--profile",
        "slurm",
        "--cores",
        "1",
        # a test cluster answers at once; the plugin's default first wait is 40 s
        "--slurm-init-seconds-before-status-checks",
        "2",
    )
    timings["slurm"] = time.monotonic() - start
    print(f"micro study: local --cores 2 {timings['local']:.0f} s, Slurm {timings['slurm']:.0f} s")
    return {"cfg": cfg, "local": local, "remote": remote, "proc": proc, "planned": planned}


def profile_groups() -> dict[str, str]:
    """rule -> group of the Slurm profile's `groups` (seconds-long jobs share a submission)."""
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    return dict(entry.split("=", 1) for entry in profile.get("groups", []))


def expected_submissions(planned: dict[str, int]) -> dict[str, int]:
    """Submissions per rule or group: every planned job of a rule outside a group; one per
    connected component of a group (each component starts with its group's first rule)."""
    groups, local = profile_groups(), cost.local_rules(REPO)
    first = {"stats": ("concentration", "concentration_step", "concentration_mode"),
             "run_summary": ("hash_checkpoint",)}  # fmt: skip
    out = {f"rule_{r}": n for r, n in planned.items() if r not in local and r not in groups}
    for group in set(groups.values()):
        out[f"group_{group}"] = sum(planned.get(r, 0) for r in first[group])
    return {k: v for k, v in out.items() if v}


def submission_kind(folder: str) -> str:
    """rule_<rule>, or group_<group> of the plugin's group_<group>_<its rules> log folder."""
    for group in set(profile_groups().values()):
        if folder.startswith(f"group_{group}_"):
            return f"group_{group}"
    return folder


def submitted(runs) -> dict[str, str]:
    """Slurm job id of every submitted job, keyed by its Slurm log (rule/wildcards)."""
    text = runs["proc"].stdout + runs["proc"].stderr
    found = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.", text)
    return {log: job_id for job_id, log in found}


def test_every_job_went_through_sbatch(runs, cluster):
    """Every job but the local rules went through sbatch, a group's jobs as one submission."""
    jobs = submitted(runs)
    want = expected_submissions(runs["planned"])
    expected = sum(want.values())
    assert expected > 20 and "group_stats" in want and "group_run_summary" in want, want
    assert len(jobs) == expected, (
        f"{len(jobs)} Slurm submissions for {expected} expected {want} "
        f"(planned jobs {runs['planned']})"
    )
    assert len(set(jobs.values())) == len(jobs), "a Slurm job id was reused"
    logdir = runs["remote"] / ".snakemake" / "slurm_logs"
    for log, job_id in jobs.items():
        path = Path(log)
        assert path.is_relative_to(logdir) and path.name == f"{job_id}.log", log
        assert path.exists(), f"Slurm log {log} of job {job_id} missing"
        assert cluster.job(job_id)["JobState"] == "COMPLETED", job_id
    seen: dict[str, int] = {}
    for log in jobs:
        key = submission_kind(Path(log).relative_to(logdir).parts[0])
        seen[key] = seen.get(key, 0) + 1
    assert seen == want


def test_jobs_got_what_config_asked_for(runs, cluster):
    """--cores 1 on the submit host must not shrink a request (snakemake #2447)."""
    logdir = runs["remote"] / ".snakemake" / "slurm_logs"
    seen = set()
    for log, job_id in submitted(runs).items():
        rule = Path(log).relative_to(logdir).parts[0].removeprefix("rule_")
        want = TRAIN if rule == "train" else {**DEFAULT, "cpus_per_task": 1}
        if rule.startswith("group_"):  # two jobs in a row: their times add, one CPU at a time
            want = {**DEFAULT, "cpus_per_task": 1, "runtime": 2 * DEFAULT["runtime"]}
        job = cluster.job(job_id)
        got = {
            "cpus": int(job["NumCPUs"]),
            "mem": job["MinMemoryNode"],
            "time": job["TimeLimit"],
            "partition": job["Partition"],
        }
        assert got == {
            "cpus": want["cpus_per_task"],
            "mem": f"{want['mem_mb']}M",
            "time": f"00:{want['runtime']:02d}:00",
            "partition": cluster.partition,
        }, (rule, job_id)
        seen.add(rule)
    assert "train" in seen


def test_outputs_equal_the_local_run(runs):
    study = runs["cfg"]["study"]
    local = output_hashes(runs["local"], study)
    remote = output_hashes(runs["remote"], study)
    for kind in ("model.safetensors", "manifest.json", "tasks/", "patching/", "tables/"):
        assert any(kind in p for p in local), f"no {kind} output to compare"
    assert set(remote) == set(local), sorted(set(remote) ^ set(local))
    differ = sorted(p for p in local if local[p] != remote[p])
    detail = ""
    if "catalog.parquet" in differ:  # name the rows, not just the file
        rows = {
            side: {
                json.dumps(r, sort_keys=True)
                for r in pq.read_table(runs[side] / "results" / study / "catalog.parquet")
                .drop_columns(CATALOG_RUN_COLUMNS)
                .to_pylist()
            }
            for side in ("local", "remote")
        }
        detail = (
            f"\ncatalog rows only local: {sorted(rows['local'] - rows['remote'])[:5]}"
            f"\ncatalog rows only remote: {sorted(rows['remote'] - rows['local'])[:5]}"
        )
    assert not differ, f"outputs differ between the local and the Slurm run: {differ}{detail}"


def test_catalog_hashes_its_files(runs):
    """Each run's catalog names every artifact with the SHA-256 of its own bytes."""
    study = runs["cfg"]["study"]
    for side in ("local", "remote"):
        workdir = runs[side]
        rows = pq.read_table(workdir / "results" / study / "catalog.parquet").to_pylist()
        assert len(rows) > 50, (side, len(rows))
        for row in rows:
            path = workdir / row["path"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"], (side, path)
            if row["manifest"] is not None:
                manifest = (workdir / row["manifest"]).read_bytes()
                assert hashlib.sha256(manifest).hexdigest() == row["manifest_sha256"], row


PREEMPT_STEPS = 6000  # ~45 s of training here: long enough to signal in the middle
STOPPED = re.compile(r"preempted: SIGTERM received: stopped after step (\d+), resumable state")
RESUMED = re.compile(r"resumed from \S+ after step (\d+)")


def test_preempted_training_resumes_to_the_same_bytes(cluster, tmp_path):
    """A training job signalled mid-run through Slurm (what `--signal=TERM@120` or a time
    limit sends its job step) stops at a step boundary with its state written, exits 75,
    is resubmitted by the profile's `retries` and ends with the uninterrupted run's bytes."""
    micro = yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text())
    cfg = slurm_config(micro, cluster.partition)
    # one resumable state at the end only: without the signal handler a kill would redo all
    cfg["training"].update(steps=PREEMPT_STEPS, eval_every=PREEMPT_STEPS // 2)
    cfg["training"]["resume_every"] = PREEMPT_STEPS
    cfg["resources"]["train"] = {**TRAIN, "slurm_extra": "--signal=TERM@120"}
    target = "results/micro/models/learned/s1/model.safetensors"
    plain = make_workdir(tmp_path / "plain", cfg)
    snakemake(plain, "--cores", "1", target)
    remote = make_workdir(tmp_path / "remote", cfg)
    (remote / "slurm").symlink_to(REPO / "slurm")
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config.yaml", "--profile",
           "slurm", "--cores", "1", "--slurm-init-seconds-before-status-checks", "2",
           target]  # fmt: skip
    out = (tmp_path / "snakemake.out").open("w")
    proc = subprocess.Popen(cmd, cwd=remote, stdout=out, stderr=subprocess.STDOUT)
    rule_log = remote / "results" / "micro" / "logs" / "train" / "learned-s1.log"
    try:
        deadline, step = time.monotonic() + 600, 0
        while step < 100 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if rule_log.exists():  # the tqdm bar: "<step>/<steps>"
                seen = re.findall(rf"(\d+)/{PREEMPT_STEPS}", rule_log.read_text(errors="replace"))
                step = int(seen[-1]) if seen else 0
        assert step >= 100, f"training never got going: {(tmp_path / 'snakemake.out').read_text()}"
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        (job_id,) = queue.stdout.split()
        subprocess.run(["scancel", "--signal=TERM", job_id], check=True, timeout=30)
        assert proc.wait(timeout=900) == 0, (tmp_path / "snakemake.out").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    logs = sorted((remote / ".snakemake" / "slurm_logs" / "rule_train").rglob("*.log"),
                  key=lambda p: int(p.stem))  # fmt: skip
    assert len(logs) == 2, logs  # the signalled job and its resubmission
    first, second = logs[0].read_text(), logs[1].read_text()
    stopped = [int(s) for s in STOPPED.findall(first)]
    resumed = [int(s) for s in RESUMED.findall(rule_log.read_text())]
    assert len(stopped) == 1 and len(resumed) == 1, (first, rule_log.read_text())
    assert 0 < stopped[0] < PREEMPT_STEPS, stopped
    redone = stopped[0] - resumed[0]
    assert cluster.job(logs[0].stem)["JobState"] == "FAILED"
    assert "exit status 75" in first  # train.py's EX_TEMPFAIL, under the jobstep's Snakemake
    assert not STOPPED.search(second)  # the resubmission ran to the end
    sha = {side: hashlib.sha256((w / target).read_bytes()).hexdigest()
           for side, w in (("uninterrupted", plain), ("preempted", remote))}  # fmt: skip
    print(
        f"preemption: signalled at step ~{step}, stopped after step {stopped[0]}, resumed after "
        f"step {resumed[0]}: {redone} step(s) redone; SHA-256 uninterrupted {sha['uninterrupted']}"
        f", preempted {sha['preempted']}"
    )
    assert 0 <= redone <= 1
    assert sha["preempted"] == sha["uninterrupted"]
    assert not (remote / "results" / "micro" / "models" / "learned" / "s1" / "resume").exists()
