"""Cost model machinery shared by the study kinds: a rule's work per job in units that only
config counts set, fitted from a finished run's Snakemake ``benchmark:`` files and projected
to another study's counts. Each kind names its own rules, units and jobs
(:mod:`headgeom.heads.cost`, :mod:`headgeom.samoe.cost`); here are what they share: the
measured maxima of a run (:func:`read_benchmarks`, kept as a summary TSV), the
:class:`Projection`, the dry run's resource requests (:func:`planned_requests`), the report
table and the command line.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Safety factor between a projection and the resource requested for it.
MARGIN = 1.5


@dataclass(frozen=True)
class Measured:
    """A rule's jobs in one run's benchmark files: count, max wall seconds, max RSS (MB)."""

    rule: str
    jobs: int
    seconds: float
    max_rss_mb: float


def read_benchmarks(results: str | Path, folder: str = "") -> dict[str, Measured]:
    """Every rule's :class:`Measured` from ``<results>/benchmarks/[<folder>/]<rule>[/<job>].tsv``
    (``folder``: a second study's own, ``samoe``)."""
    root = Path(results) / "benchmarks" / folder
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no benchmark files (run the study first)")
    files: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.tsv")):
        rule = path.relative_to(root).parts[0].removesuffix(".tsv")
        files.setdefault(rule, []).append(path)
    out = {}
    for rule, paths in files.items():
        rows = []
        for path in paths:
            with open(path) as f:
                table = list(csv.DictReader(f, delimiter="\t"))
            if not table or "s" not in table[0] or "max_rss" not in table[0]:
                raise ValueError(f"{path}: not a Snakemake benchmark file (columns s, max_rss)")
            rows += table
        seconds = max(float(r["s"]) for r in rows)
        rss = max(float(r["max_rss"]) if r["max_rss"] not in ("", "NA") else 0.0 for r in rows)
        out[rule] = Measured(rule, len(paths), seconds, rss)
    return out


SUMMARY_COLUMNS = ("rule", "jobs", "seconds_max", "max_rss_mb")


def write_summary(measured: Mapping[str, Measured], path: str | Path, note: str) -> None:
    """The per-rule maxima of a run as a small TSV (a calibration kept in the repository:
    the projections and the resource test read it without the run's results)."""
    with open(path, "w", newline="") as f:
        f.write(f"# {note}\n")
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(SUMMARY_COLUMNS)
        for m in sorted(measured.values(), key=lambda m: m.rule):
            w.writerow([m.rule, m.jobs, f"{m.seconds:.2f}", f"{m.max_rss_mb:.1f}"])


def read_summary(path: str | Path) -> dict[str, Measured]:
    """A :func:`write_summary` file back as :class:`Measured` per rule."""
    with open(path) as f:
        rows = list(csv.DictReader((ln for ln in f if not ln.startswith("#")), delimiter="\t"))
    if not rows or tuple(rows[0]) != SUMMARY_COLUMNS:
        raise ValueError(f"{path}: expected a cost summary with columns {SUMMARY_COLUMNS}")
    return {
        r["rule"]: Measured(r["rule"], int(r["jobs"]), float(r["seconds_max"]),
                            float(r["max_rss_mb"]))
        for r in rows
    }  # fmt: skip


@dataclass(frozen=True)
class Projection:
    rule: str
    jobs: int
    measured_s: float
    measured_mb: float
    unit: str
    units: float
    target_units: float
    seconds: float
    memory_mb: float


def planned_requests(
    configfile: str | Path, cwd: str | Path = ".", targets: Sequence[str] = ()
) -> dict[str, dict]:
    """Resources of each rule's first job as a dry run of the whole DAG under the Slurm
    profile reports them (what sbatch is given: the rule's own defaults in its .smk file,
    then config ``resources``, exactly as the workflow resolves them), with ``jobs`` (the
    rule's planned job count); ``targets``: only the jobs they need (default the whole DAG)."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", "slurm", "--cores", "1",
           f"--configfile={configfile}", "--forceall", *targets]  # fmt: skip
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr}")
    found: dict[str, dict] = {}
    # a group's jobs are listed indented inside its block: each with its own resources
    for block in re.split(r"\n(?=\s*(?:local)?rule \w+:)", proc.stdout):
        head = re.match(r"\s*(?:local)?rule (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if not (head and res):
            continue
        if head.group(1) in found:
            found[head.group(1)]["jobs"] += 1
            continue
        pairs = (item.split("=", 1) for item in res.group(1).split(", "))
        found[head.group(1)] = {k: int(v) if re.fullmatch(r"-?\d+", v) else v
                                for k, v in pairs}  # fmt: skip
        found[head.group(1)]["jobs"] = 1
    return found


def request(planned: Mapping[str, dict], rule: str) -> tuple[int, int]:
    """(mem_mb, runtime minutes) of a rule's planned jobs (:func:`planned_requests`)."""
    res = planned[rule]
    return int(res["mem_mb"]), int(res["runtime"])


def suggested(p: Projection, margin: float = MARGIN) -> dict[str, int]:
    """Resources covering a projection with ``margin``: MB rounded up to 500, minutes to 10."""
    mem = int(math.ceil(p.memory_mb * margin / 500) * 500)
    runtime = int(math.ceil(p.seconds * margin / 60 / 10) * 10)
    return {"mem_mb": max(mem, 500), "runtime": max(runtime, 10)}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def report(projections, planned: Mapping[str, dict], not_projected: Mapping[str, str],
           gpu_timed: Collection[str], benchmarked: Mapping, gpu_note: str) -> str:  # fmt: skip
    """A Markdown table: per rule the measured jobs, time and RSS, the units, the projection
    to the target's counts on this CPU, the target's request and whether it covers it (each
    study kind's rules not projected, timed on GPUs and benchmarked, and where its GPU times
    come from)."""
    lines = [
        "| rule | jobs measured → target | measured s (max) | max RSS MB | unit | "
        "units → target | projected / job (this CPU) | projected MB | request MB, min | covers |",
        "|---|---|---:|---:|---|---|---:|---:|---|---|",
    ]
    total, gpu_rules = 0.0, []
    for p in projections:
        if p.rule not in planned:
            continue  # not a rule of the target's DAG
        mem, runtime = request(planned, p.rule)
        if p.rule in not_projected:
            when, ok = "not projected", None
        elif p.rule in gpu_timed and planned[p.rule].get("gpu"):
            gpu_rules.append(p.rule)
            when, ok = "GPU rule: gpu_check", p.memory_mb <= mem
        elif planned[p.rule].get("gpu"):
            # no GPU rate measured: this CPU's time bounds the job's (its work moves to the
            # GPU; in float64 only on GPUs with fast FP64, docs §15.1)
            gpu_rules.append(p.rule)
            when = f"GPU (≤ {_hours(p.seconds)}, this CPU)"
            ok = p.memory_mb <= mem and p.seconds <= runtime * 60
        else:
            total += p.seconds * planned[p.rule]["jobs"]
            when, ok = _hours(p.seconds), p.memory_mb <= mem and p.seconds <= runtime * 60
        lines.append(
            f"| {p.rule} | {p.jobs} → {planned[p.rule]['jobs']} | {p.measured_s:,.1f} | "
            f"{p.measured_mb:,.0f} | {p.unit} | "
            f"{p.units:,.0f} → {p.target_units:,.0f} | {when} | "
            f"{p.memory_mb:,.0f} | {mem:,}, {runtime:,} | "
            f"{'—' if ok is None else 'yes' if ok else 'NO'} |"
        )
    for rule, why in not_projected.items():
        if rule in planned:
            lines.append(f"\n{rule}: not projected ({why}).")
    for rule, (_, source) in benchmarked.items():
        if rule in planned:
            lines.append(f"\n{rule}: at least the rate of {source}.")
    lines.append(f"\nProjected CPU time of the target study's CPU rules on this CPU: "
                 f"{_hours(total)} (one core per job); GPU rules ({', '.join(gpu_rules)}): "
                 f"{gpu_note}.")  # fmt: skip
    return "\n".join(lines)


def parse_cli(argv: list[str] | None, description: str,
              measured_from: Callable[[str], dict[str, Measured]]):  # fmt: skip
    """The arguments of a study kind's cost CLI and the measured rules (``measured_from``: a
    finished run's folder or a summary TSV, as the kind reads them); ``summary`` is carried
    out here (None is returned then)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("command", choices=["report", "resources", "summary"])
    parser.add_argument("measured", help="a finished run's results/<study> folder or a summary")
    parser.add_argument("--configfile", required=True, help="the config of that run")
    parser.add_argument("--target", help="the config to project to (report, resources)")
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--out", help="summary: the TSV to write")
    parser.add_argument("--note", default="", help="summary: the machine and run it measures")
    args = parser.parse_args(argv)
    measured = measured_from(args.measured)
    if args.command == "summary":
        if not args.out:
            parser.error("summary needs --out")
        write_summary(measured, args.out, args.note)
        return None
    if not args.target:
        parser.error(f"{args.command} needs --target")
    return args, measured
