"""Cost model of the head-geometry workflow (its machinery: :mod:`headgeom.cost`): per rule,
the work of one job in units that only config counts set, fitted from a finished run's
Snakemake ``benchmark:`` files and projected to another study's counts (the rehearsal → the
paper: same shapes, larger counts).

For each rule R with ``units(study)`` (work per job) and ``rows(study)`` (inputs held in
memory at once per job):

    seconds(paper) = max_j s_j / units(rehearsal) · units(paper)
    memory(paper)  = fixed + (max_j rss_j − fixed) · max(1, rows(paper) / rows(rehearsal))

(for a rule the target runs on a GPU, host memory is the measured peak, unscaled: its rows'
activations live on the device, which ``benchmarks/gpu_check.py`` measures)

with s_j, rss_j the measured wall seconds and peak RSS (MB) of the rehearsal's jobs of R, and
``fixed`` the RSS of loading the largest model (interpreter + torch + its weights, the
``hash_checkpoint`` jobs' peak; 0 for rules that load no model). Proportional time (no fixed
start-up term) over-estimates a job scaled up, never under-estimates it; the max over jobs
covers the largest architecture family of the rule (16 heads, 21-layer multiscreen).
Units are documented per rule in :data:`UNITS`; the fit and the projection are
:func:`fit` and :func:`project`; the jobs of every rule in a study's DAG, from its run sets,
are :data:`JOBS` (:func:`job_counts`).

    python -m headgeom.heads.cost report results/rehearsal --configfile config/rehearsal.yaml \\
        --target config/paper.yaml
    python -m headgeom.heads.cost summary results/rehearsal --configfile config/rehearsal.yaml \\
        --out benchmarks/rehearsal_cpu.tsv --note "2-core AMD EPYC, ..."
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from headgeom import config_layers
from headgeom import cost as shared
from headgeom.cost import Measured, Projection, planned_requests, read_benchmarks, read_summary
from headgeom.data.tasks import resolve_task_config
from headgeom.heads.paper.plan import PaperPlan
from headgeom.heads.study import Study
from headgeom.vocabulary import TASKS

#: GPU rules whose time only GPU rates give (benchmarks/gpu_check.py): on this CPU a paper
#: training run takes months, no bound worth requesting. Every other GPU rule's request must
#: cover its CPU projection, an upper bound of its time on a GPU.
GPU_TIMED = {"train", "train_timeline"}

#: Rules whose time depends on what the model learned, not only on counts, with a per-unit
#: rate from a paper-shape benchmark (seconds per unit, source): the projection is the larger
#: of that and the rehearsal's fit. ACDC recomputes only nodes still reaching the logits, so a
#: 4-step rehearsal model (tiny effects, most edges cut early) runs far faster than a trained
#: one; benchmarks/acdc_engine.py's worst case (every logits edge kept) is the bound.
BENCHMARKED = {
    "acdc": (1.94 * 3600 / 16, "benchmarks/acdc_engine.py, paper shape, float64, 16 SVA "
             "examples, every logits edge kept: 4.66 metric calls/s, 1.94 h per run"),
}  # fmt: skip

#: Rules whose rehearsal job does not do the paper's kind of work, with the reason.
NOT_PROJECTED = {
    "tokenize_corpus": "the rehearsal tokenizes the embedded generator's text; the paper "
    "streams FineWeb-Edu over the network with 16 CPUs",
}


def _splits(study: Study, task: str) -> dict[str, int]:
    """Examples per split of ``task``: its config's splits, defaults filled."""
    return resolve_task_config(task, study.task_config(task))["splits"]


def _split(study: Study, task: str, split: str) -> int:
    return int(_splits(study, task)[split])


def _patched_task(study: Study, task: str = "sva") -> int:
    """Examples patched of one task: every split of patching.splits."""
    return sum(_split(study, task, s) for s in study.stage("patching")["splits"])


def _patched(study: Study) -> int:
    """Examples patched per patch_heads job: one run, every task."""
    return sum(_patched_task(study, t) for t in TASKS)


def _tokens_trained(study: Study) -> float:
    t = study.stage("training")
    n_ctx = study.config["architecture"]["n_ctx"]
    n_evals = t["steps"] // t["eval_every"] + 1
    n_val = min(spec.get("n_val_tokens", 0) for spec in study.corpora.values()) or n_ctx
    return 3 * t["steps"] * t["batch_size"] * n_ctx + n_evals * n_val  # backward ≈ 2 forwards


def _task_examples(study: Study, task: str = "sva") -> int:
    return sum(_splits(study, task).values())


def _all_examples(study: Study) -> int:
    return sum(_task_examples(study, t) for t in TASKS)


def _mode_patched(study: Study) -> int:
    """Examples patched per patch_modes job: the mode splits of every task, each extra mode."""
    per_task = sum(_split(study, "sva", s) for s in study.mode_splits)
    return len(study.extra_modes) * len(TASKS) * per_task


def _dynamics(study: Study) -> float:
    d, n_ctx = study.stage("dynamics"), study.config["architecture"]["n_ctx"]
    timeline = (len(study.timeline_steps) + 1) * _split(study, "sva", "evaluation")
    vgrad = len(d["value_gradient_steps"]) * d["value_gradient_sequences"] * n_ctx * 3
    return timeline + vgrad


def _one(study: Study) -> float:
    return 1.0


#: Work units of one job per rule (the docstring of each lambda is the unit's name).
UNITS: dict[str, tuple[str, Callable[[Study], float]]] = {
    "tokenize_corpus": ("train + validation tokens", lambda s: max(
        spec["n_train_tokens"] + spec.get("n_val_tokens", 0) for spec in s.corpora.values())),
    "train": ("forward-token equivalents (3 × trained + evaluated)", _tokens_trained),
    "train_timeline": ("forward-token equivalents (3 × trained + evaluated)", _tokens_trained),
    "evaluate_clean": ("task examples (every split)", _all_examples),
    "evaluate_step": ("task examples (every split, SVA)", _task_examples),
    "patch_heads": ("examples patched (every task)", _patched),
    "patch_kv_heads": ("examples patched (every task)", _patched),
    "patch_step": ("examples patched (lanes split)", lambda s: _split(s, "sva", s.stage(
        "lanes")["split"])),
    "patch_modes": ("examples patched (tasks × extra modes)", _mode_patched),
    "atp_agreement": ("examples estimated (concentration split, every task)", lambda s: sum(
        _split(s, t, s.stage("concentration")["split"]) for t in TASKS)),
    "concentration": ("bootstrap + permutation draws (every task)", lambda s: len(TASKS) * (
        s.stage("concentration")["n_bootstrap"] + s.stage("concentration")["n_permutations"])),
    "concentration_step": ("bootstrap + permutation draws", lambda s: s.stage("concentration")[
        "n_bootstrap"] + s.stage("concentration")["n_permutations"]),
    "concentration_mode": ("bootstrap + permutation draws", lambda s: s.stage("concentration")[
        "n_bootstrap"] + s.stage("concentration")["n_permutations"]),
    "compare_concentration": ("bootstrap draws", lambda s: s.stage("concentration")[
        "n_bootstrap"]),
    "lanes": ("permutations (every task)", lambda s: len(TASKS) * s.stage("lanes")[
        "n_permutations"]),
    "lanes_step": ("permutations", lambda s: s.stage("lanes")["n_permutations"]),
    "lanes_mode": ("permutations", lambda s: s.stage("lanes")["n_permutations"]),
    "leakage": ("examples (every task)", lambda s: sum(_split(s, t, s.stage("leakage")[
        "split"]) for t in TASKS)),
    "clamps": ("examples (3 tasks)", lambda s: 3 * _split(s, "sva", s.stage("clamps")["split"])),
    "edges": ("examples", lambda s: s.stage("edges")["n_examples"]),
    "acdc": ("examples", lambda s: s.stage("edges")["n_examples"]),
    "coordinates": ("examples × tasks + random sets", lambda s: len(s.stage("coordinates")[
        "tasks"]) * (_split(s, "sva", "validation") + _split(s, "sva", "evaluation"))
        + s.stage("coordinates")["n_random_sets"]),
    "dynamics": ("timeline examples + 3 × V-gradient tokens", _dynamics),
    "scalar_ablation": ("edits × evaluation examples (3 tasks)", lambda s: (
        s.stage("dynamics")["ablation_draws"] + 1) * 3 * _split(s, "sva", "evaluation")),
    "ablation_atlas": ("evaluation windows", lambda s: s.stage("ablation")["n_eval_windows"]),
}  # fmt: skip

#: Inputs held in memory at once per job (rules not named hold a fixed amount).
ROWS: dict[str, Callable[[Study], float]] = {
    "train": lambda s: s.stage("training")["batch_size"],
    "train_timeline": lambda s: s.stage("training")["batch_size"],
    "patch_heads": lambda s: min(_patched_task(s), s.stage("patching")["batch_size"]),
    "patch_kv_heads": lambda s: min(_patched_task(s), s.stage("patching")["batch_size"]),
    "patch_step": lambda s: min(UNITS["patch_step"][1](s), s.stage("patching")["batch_size"]),
    "atp_agreement": lambda s: min(_split(s, "sva", s.stage("concentration")["split"]),
                                   s.stage("patching")["batch_size"]),
    "leakage": lambda s: _split(s, "sva", s.stage("leakage")["split"]),
    "clamps": lambda s: min(_split(s, "sva", s.stage("clamps")["split"]),
                            s.stage("clamps")["batch_size"]),
    "edges": lambda s: min(s.stage("edges")["n_examples"], s.stage("edges")["batch_size"]),
    "acdc": lambda s: s.stage("edges")["n_examples"],
    "coordinates": lambda s: min(_split(s, "sva", "evaluation"),
                                 s.stage("coordinates")["batch_size"]),
    "dynamics": lambda s: min(s.stage("dynamics")["value_gradient_sequences"],
                              s.stage("dynamics")["backward_sequences"]),
    "concentration": lambda s: s.stage("concentration")["n_bootstrap"],
    "compare_concentration": lambda s: s.stage("concentration")["n_bootstrap"],
}  # fmt: skip

#: Rules whose jobs load no model (their memory has no model part).
NO_MODEL = {"tokenize_corpus", "make_tasks", "concentration", "concentration_step",
            "compare_concentration", "lanes", "lanes_step", "exclusivity", "make_table",
            "make_figure", "make_document", "catalog", "explorer", "checks", "concentration_loss",
            "param_counts", "basis_family", "compare_modes"}  # fmt: skip


# ----------------------------------------------------------------------------- jobs
# The jobs of every rule in a study's DAG (what `rule all` requests), from the Study's run
# sets: each job as its wildcards, so a job's model is known where it has one.
Job = dict[str, str | int]


def _runs(runs, tasks=(None,), **extra) -> list[Job]:
    return [{"model": m, "seed": s, **({"task": t} if t else {}), **extra}
            for m, s in runs for t in tasks]  # fmt: skip


def _read_by_outputs(study: Study, result: str) -> list[tuple[str, int]]:
    """Runs whose ``result`` a paper table, figure or the document reads, in run order."""
    plan = PaperPlan(study)
    made = [("table", n) for n in [*plan.tables, *plan.document_tables]]
    made += [("figure", n) for n in plan.figures]
    wanted = {run for kind, name in made for res, runs in plan.paper_inputs(name, kind).values()
              if res == result and runs for run in runs}  # fmt: skip
    return [r for r in study.runs if r in wanted]


def _union(study: Study, *run_sets) -> list[tuple[str, int]]:
    wanted = {r for runs in run_sets for r in runs}
    return [r for r in study.runs if r in wanted]


def _steps(study: Study, task: bool = True) -> list[Job]:
    """One job per timeline run and timeline step (SVA only where a task is a wildcard)."""
    return [{**job, "step": step} for job in _runs(study.run_set("dynamics_timeline"),
            ("sva",) if task else (None,)) for step in study.timeline_steps]  # fmt: skip


def _corpora(study: Study) -> list[Job]:
    used = {study.model_corpus(m) for m in study.trained_models}
    used |= {study.model_corpus(m) for m, _ in _means_runs(study)} | {study.vocab_corpus}
    return [{"corpus": c} for c in study.corpora if c in used]


def _means_runs(study: Study) -> list[tuple[str, int]]:
    """Runs of rule ablation_atlas (it also writes the means): the atlas, the mode
    comparison, and every patched run when patching.mode is mean."""
    mean_mode = study.runs if study.patch_mode == "mean" else []
    return _union(
        study, study.run_set("ablation_atlas"), study.run_set("ablation_modes"), mean_mode
    )


def _mode_jobs(study: Study) -> list[Job]:
    return [{**job, "mode": mode} for job in _runs(study.run_set("ablation_modes"), TASKS)
            for mode in study.extra_modes]  # fmt: skip


def _lanes(study: Study) -> list[Job]:
    """Λ (every task, one job per run) of the runs the outputs and the mode comparison read,
    and of the timeline runs (rule dynamics reads their SVA)."""
    return _runs(_union(study, _read_by_outputs(study, "lanes"), study.run_set("ablation_modes"),
                        study.run_set("dynamics_timeline")))  # fmt: skip


def _once(condition: bool = True) -> list[Job]:
    return [{}] if condition else []


#: Jobs per rule of a study's DAG (docstring above); rules `all` does not reach: none.
JOBS: dict[str, Callable[[Study], list[Job]]] = {
    "tokenize_corpus": _corpora,
    "make_tasks": lambda s: [{"task": t} for t in TASKS],
    "train": lambda s: _runs([r for r in s.runs if r[0] in s.trained_models
                              and r[0] not in s.timeline_models]),
    "train_timeline": lambda s: _runs([r for r in s.runs if r[0] in s.timeline_models]),
    "import_model": lambda s: _runs([r for r in s.runs if s.is_imported(r[0])]),
    "hash_checkpoint": lambda s: _runs([r for r in s.runs if r[0] in s.trained_models]),
    "param_counts": lambda s: _once(),
    "basis_family": lambda s: _once(bool(s.basis_family_models())),
    "evaluate_clean": lambda s: _runs(_union(s, _read_by_outputs(s, "eval"),
                                             s.run_set("dynamics_timeline"))),
    "evaluate_step": _steps,
    "patch_heads": lambda s: _runs(s.runs),  # every run's concentration (rule all), all tasks
    "patch_kv_heads": lambda s: _runs(s.grouped_query_runs),
    "patch_step": _steps,
    "atp_agreement": lambda s: _runs(s.runs),  # every run (rule all), all tasks
    "concentration": lambda s: _runs(s.runs),
    "concentration_step": _steps,
    "compare_concentration": lambda s: [{"task": t} for t in TASKS] if s.pairs else [],
    "concentration_loss": lambda s: _once(),
    "lanes": _lanes,
    "lanes_step": _steps,
    "leakage": lambda s: _runs(s.run_set("leakage")),
    "exclusivity": lambda s: _once(bool(s.run_set("leakage"))),
    "clamps": lambda s: _runs(s.run_set("clamps")),
    "geometry_stats": lambda s: _runs(s.runs),  # every run's summary (rule checks)
    "geometry_step": lambda s: _steps(s, task=False),
    "dynamics": lambda s: _runs(s.run_set("dynamics_timeline")),
    "scalar_ablation": lambda s: _runs(s.run_set("dynamics_ablation")),
    "edges": lambda s: _runs(s.run_set("edges")),
    "acdc": lambda s: _runs(s.run_set("acdc")),
    "coordinates": lambda s: _runs(s.run_set("coordinates")),
    "ablation_atlas": lambda s: _runs(_means_runs(s)),
    "patch_modes": lambda s: _runs(s.run_set("ablation_modes")),
    "concentration_mode": _mode_jobs,
    "lanes_mode": _mode_jobs,
    "compare_modes": lambda s: _once(bool(s.run_set("ablation_modes"))),
    "make_table": lambda s: [{"table": t} for t in PaperPlan(s).tables],
    "make_figure": lambda s: [{"figure": f} for f in PaperPlan(s).figures],
    "make_document": lambda s: _once(bool(PaperPlan(s).document_tables)),
    "catalog": lambda s: _once(),
    "explorer": lambda s: _once(),
    "checks": lambda s: _once(),
    "export_hf": lambda s: [],  # asked for by name only
}  # fmt: skip


def jobs(study: Study) -> dict[str, list[Job]]:
    """Every rule's jobs (:data:`JOBS`) in ``study``'s DAG."""
    return {rule: of(study) for rule, of in JOBS.items()}


def job_counts(study: Study) -> dict[str, int]:
    """Jobs per rule of ``study``'s DAG (0: the rule is not in it)."""
    return {rule: len(js) for rule, js in jobs(study).items()}


def measured_of(source: str | Path) -> dict[str, Measured]:
    """A run's results folder (its benchmark files) or a summary TSV."""
    return read_summary(source) if Path(source).is_file() else read_benchmarks(source)


#: Rules that became one job per run (every task) after earlier calibrations measured them
#: one job per (run, task).
PER_RUN_SINCE_CALIBRATED = ("patch_heads", "concentration", "lanes", "leakage")


def per_task_calibration(rule: str, m: Measured, study: Study) -> int:
    """len(TASKS) when ``m`` measured ``rule`` one job per (run, task), i.e. in len(TASKS) ×
    the jobs ``study`` now plans (benchmarks/rehearsal_cpu.tsv): a run's job then does at
    most len(TASKS) × the largest task job's work; else 1."""
    if rule not in PER_RUN_SINCE_CALIBRATED:
        return 1
    return len(TASKS) if m.jobs == len(TASKS) * len(JOBS[rule](study)) else 1


def fit(
    measured: Mapping[str, Measured], study: Study, target: Study, on_gpu: Collection[str] = ()
) -> list[Projection]:
    """:class:`Projection` of every measured rule from ``study``'s counts to ``target``'s;
    ``on_gpu``: rules the target runs on a GPU (host memory not scaled by rows)."""
    fixed = measured["hash_checkpoint"].max_rss_mb if "hash_checkpoint" in measured else 0.0
    out = []
    for rule, m in sorted(measured.items()):
        unit, units_of = UNITS.get(rule, ("job", _one))
        units, target_units = units_of(study), units_of(target)
        measured_s = m.seconds * per_task_calibration(rule, m, study)
        seconds = measured_s / units * target_units if units else measured_s
        if rule in BENCHMARKED:
            seconds = max(seconds, BENCHMARKED[rule][0] * target_units)
        base = 0.0 if rule in NO_MODEL else min(fixed, m.max_rss_mb)
        rows = ROWS.get(rule)
        ratio = max(1.0, rows(target) / rows(study)) if rows and rule not in on_gpu else 1.0
        memory = base + (m.max_rss_mb - base) * ratio
        out.append(Projection(rule, m.jobs, m.seconds, m.max_rss_mb, unit, units, target_units,
                              seconds, memory))  # fmt: skip
    return out


def local_rules(root: str | Path = ".") -> set[str]:
    """The head-geometry workflow's ``localrules`` (workflow/heads/main.smk: run on the submit
    host, never submitted) and ``all``."""
    text = (Path(root) / "workflow" / "heads" / "main.smk").read_text()
    block = re.search(r"^localrules:\n((?:    \w+,\n)+)", text, re.M)
    return (set(re.findall(r"(\w+),", block.group(1))) if block else set()) | {"all"}


def rule_blocks(root: str | Path = ".") -> list[tuple[str, str | None, str]]:
    """(rule, base rule of a ``use rule A as B`` copy or None, the rule's text) of every rule
    in ``root``/workflow/heads/*.smk, in file order."""
    header = re.compile(r"^(?:rule (\w+)|use rule (\w+) as (\w+)).*:")
    blocks = []
    for path in sorted((Path(root) / "workflow" / "heads").glob("*.smk")):
        block: list[str] = []
        for line in [*path.read_text().splitlines(), "END"]:
            if line[:1].strip() and not line.startswith("#") and block:
                m = header.match(block[0])
                blocks.append((m.group(1) or m.group(3), m.group(2), "\n".join(block)))
                block = []
            if header.match(line) or block:
                block.append(line)
    return blocks


def workflow_rules(root: str | Path = ".") -> dict[str, dict[str, str]]:
    """Every rule of ``root``/workflow/heads/*.smk: the rule whose config resources it asks for
    (``STUDY.resources("<rule>", ...)``; a ``use rule A as B`` copy without its own: A's) and
    the folder of its benchmark files (``benchmark_of("<folder>", ...)``)."""
    rules: dict[str, dict[str, str | None]] = {}
    for name, base, text in rule_blocks(root):
        res = re.search(r'STUDY\.resources\(\s*"(\w+)"', text)
        bench = re.search(r'benchmark_of\(\s*"(\w+)"', text)
        rules[name] = {
            "base": base,
            "resources": res and res.group(1),
            "benchmark": bench and bench.group(1),
        }
    for spec in rules.values():  # a copy takes what it does not set from its base rule
        base = rules.get(spec["base"]) if spec["base"] else None
        for key in ("resources", "benchmark"):
            spec[key] = spec[key] or (base or {}).get(key)
    return {name: {k: spec[k] for k in ("resources", "benchmark")} for name, spec in rules.items()}


#: How the report says where the GPU rules' times come from.
GPU_NOTE = "`python benchmarks/gpu_check.py` on the GPU"


def report(projections, planned: Mapping[str, dict]) -> str:
    """:func:`headgeom.cost.report` with this study's rules not projected, timed on GPUs
    and benchmarked."""
    return shared.report(projections, planned, NOT_PROJECTED, GPU_TIMED, BENCHMARKED, GPU_NOTE)


def _study(path: str) -> Study:
    return Study.from_config(config_layers.load(path))


def main(argv: list[str] | None = None) -> int:
    parsed = shared.parse_cli(argv, __doc__.split("\n\n")[0], measured_of)
    if parsed is None:
        return 0
    args, measured = parsed
    planned = planned_requests(args.target)
    on_gpu = {rule for rule, res in planned.items() if res.get("gpu")}
    projections = fit(measured, _study(args.configfile), _study(args.target), on_gpu)
    if args.command == "report":
        print(report(projections, planned))
    else:
        for p in projections:
            print(f"  {p.rule}: {shared.suggested(p, args.margin)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
