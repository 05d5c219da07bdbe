# Validation and the study object (headgeom.heads.study), the one table of path templates every
# rule's input and output use, and resources. What the study means (runs, corpora, run
# configs, paper selections, pairs, cross-key checks) lives in headgeom.heads.study.
import json
import re
import sys
from pathlib import Path

# Stage scripts and the library are addressed from the workflow, so `snakemake -d elsewhere`
# works; PYTHONPATH makes the library importable even in a bare conda environment.
SRC = Path(workflow.basedir) / "src"
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
# The workflow reads the study with the same library (this checkout's, first).
sys.path.insert(0, str(SRC))
from headgeom import config_layers  # noqa: E402
from headgeom.kernels import pin_kernels  # noqa: E402
from headgeom.paths import TEMPLATES  # noqa: E402
from headgeom.heads.paper.outputs import FIGURES, TABLE_JOBS, record  # noqa: E402
from headgeom.heads.paper.plan import PaperPlan  # noqa: E402
from headgeom.heads.study import Study, StudyConfigError  # noqa: E402
from headgeom.vocabulary import TASKS  # noqa: E402


def checked(check, *args):
    """A study check; a bad config prints only its concise message (no schema) and stops."""
    try:
        return check(*args)
    except StudyConfigError as err:
        sys.exit(f"Invalid study config:\n{err}")


def extended(config):
    """The config with its `extends` chain applied (headgeom.config_layers)."""
    try:
        return config_layers.resolve(config)
    except (ValueError, OSError) as err:
        sys.exit(f"Invalid study config:\n{err}")


# One set of CPU kernel paths on every x86-64 machine with AVX2 (headgeom.kernels, docs §2.7):
# set here, before any job starts, so every job inherits it (locally and through Slurm).
try:
    pin_kernels()
except ValueError as err:
    sys.exit(f"Invalid environment: {err}")


# Schema: headgeom.validation.SCHEMA; the Snakefile checks `resources` keys against the rules.
STUDY = checked(Study.from_config, extended(config))
#: The paper's tables and figures in this study, and what each reads (headgeom.heads.paper.plan).
PAPER = PaperPlan(STUDY)
# Analyses an imported model's architecture cannot run are left out of the defaults: say so.
for skip in STUDY.skipped_analyses:
    message = f"headgeom: no {skip['run_set']} for {skip['model']}: {skip['reason']}"
    print(message, file=sys.stderr)


wildcard_constraints:
    study=STUDY.name,
    model="|".join(map(re.escape, STUDY.models)),
    seed=r"\d+",
    task="|".join(TASKS),
    mode="resample|mean|zero",  # ablation mode (docs §10.1)


# ------------------------------------------------------------------ paths
# Every file that rules read or write, once (headgeom.paths, under the study's results
# directory); per_run expands them. Logs and benchmarks: log_of, benchmark_of.
R = f"results/{STUDY.name}"
PATHS = {name: f"{R}/{template}" for name, template in TEMPLATES.items()}


def log_of(*parts):
    return f"{R}/logs/{'/'.join(parts)}.log"


def benchmark_of(*parts):
    return f"{R}/benchmarks/{'/'.join(parts)}.tsv"


def per_run(result, runs, tasks=TASKS):
    """PATHS[result] of every run (× task where it has one), run by run; None: one file."""
    if runs is None:  # one cross-run file (one per task where the template has {task})
        return (
            [PATHS[result].format(task=t) for t in tasks]
            if "{task}" in PATHS[result]
            else [PATHS[result]]
        )
    tasks = tasks if "{task}" in PATHS[result] else [None]
    return [PATHS[result].format(model=m, seed=s, task=t) for m, s in runs for t in tasks]


def model_corpus(role):
    """Input function: the `role` file of the corpus the job's model trains on."""

    def corpus_file(wildcards):
        return PATHS[f"corpus_{role}"].format(corpus=STUDY.model_corpus(wildcards.model))

    return corpus_file


def exportable_checkpoint(wildcards):
    """export_hf: the checkpoint of a model with a GPT-2 form (`learned`)."""
    STUDY.check_exportable(wildcards.model)
    return PATHS["checkpoint"].format(model=wildcards.model, seed=wildcards.seed)


def param_counts_vocab(wildcards):
    """A compacted vocabulary sets n_vocab; otherwise it is GPT-2's (no corpus needed)."""
    corpus = STUDY.vocab_corpus
    return {"vocab": PATHS["corpus_vocab"].format(corpus=corpus)} if corpus else {}


def compare_effects_inputs(wildcards):
    """Effects of every (model, seed) that a pair of the task's paired bootstrap names."""
    return per_run("effects", STUDY.pair_runs, tasks=[wildcards.task])


def paper_inputs(wildcards):
    """The Parquets a paper table or figure is a pure function of, by kind."""
    wanted = PAPER.paper_inputs(*_output_of(wildcards))
    return {kind: per_run(result, runs) for kind, (result, runs) in wanted.items()}


def study_outputs():
    """The default target's inputs (the Snakefile): every table, figure and record."""
    return final_outputs()


def final_outputs(catalog=True):
    """The paper tables and figures the study can make (PAPER.tables, PAPER.figures), the
    parameter counts and the §12 outputs (per run and task, paired, loss vs N_eff)."""
    tables = [
        PATHS[f"table_{x}"].format(table=t) for t in PAPER.tables for x in ("md", "csv", "tex")
    ]
    figures = [
        PATHS[f"figure_{x}"].format(figure=f) for f in PAPER.figures for x in ("png", "svg", "csv")
    ]
    per_run_task = [
        PATHS[kind].format(model=m, seed=s, task=t)
        for m, s in STUDY.runs
        for t in TASKS
        for kind in ("robustness", "conditions", "logo")
    ]
    # docs §10.1: AtP beside exact patching, every run: each task's agreement and the figure
    atp = [
        PATHS[kind].format(model=m, seed=s, task=t)
        for m, s in STUDY.runs
        for t in TASKS
        for kind in ("atp_agreement", "atp_figure")
    ]
    atp = list(dict.fromkeys(atp))  # one figure per run
    pairs = [PATHS[k].format(task=t) for t in TASKS for k in ("paired", "paired_logo")]
    pairs = pairs if STUDY.pairs else []
    cross_model = [PATHS["loss"], PATHS["spearman"]]
    # paper §5.1: the exclusivity Parquets (Table 1's "geometric exclusivity" inputs)
    exclusivity = [PATHS["exclusivity"]] if STUDY.run_set("leakage") else []
    # docs §10.6: the atlas Parquets and the mode comparison (also read by their tables)
    atlas = STUDY.run_set("ablation_atlas")
    ablation = [PATHS["ablation_atlas"].format(model=m, seed=s) for m, s in atlas]
    ablation += [PATHS["ablation_modes"]] if STUDY.run_set("ablation_modes") else []
    # docs §10.1: key/value-head patching of the grouped-query causal LMs
    kv_effects = per_run("kv_effects", STUDY.grouped_query_runs)
    # the document's tables (one job) and the catalog of every artifact
    document = [
        PATHS[f"table_{x}"].format(table=t)
        for t in PAPER.document_tables
        for x in ("md", "csv", "tex")
    ]
    # docs §18: every logged acceptance check in one table (also read by the document)
    checks = [PATHS["checks"]]
    # docs §19: the explorer reads the catalog, so the catalog waits for the explorer's inputs
    explorer = [p for paths in explorer_inputs(None).values() for p in paths]
    return (
        tables
        + figures
        + [PATHS["param_counts"]]
        + per_run_task
        + atp
        + pairs
        + cross_model
        + exclusivity
        + ablation
        + kv_effects
        + document
        + checks
        + explorer
        + ([PATHS["catalog"], PATHS["explorer"]] if catalog else [])
    )


def explorer_inputs(wildcards):
    """The Parquets of the explorer (docs §19), by headgeom.heads.explorer.data kind: every run's
    head effects and per-head geometry, and each run set's leakage, clamps, edges, atlas
    and timeline."""
    return {
        "heads": per_run("heads", STUDY.runs),
        "effects": per_run("effects", STUDY.runs),
        "geometry": per_run("geometry_heads", STUDY.runs),
        "leakage": per_run("leakage", STUDY.run_set("leakage")),
        "clamps": per_run("clamp_paths", STUDY.run_set("clamps")),
        "edges": per_run("edges", STUDY.run_set("edges")),
        "atlas": per_run("ablation_atlas", STUDY.run_set("ablation_atlas")),
        "timeline": per_run("timeline", STUDY.run_set("dynamics_timeline")),
    }


def explorer_input_args(wildcards, input):
    """`--<kind> PATH...` for every non-empty explorer input kind."""
    kinds = explorer_inputs(wildcards)
    return " ".join(f"--{k} " + " ".join(input[k]) for k in kinds if len(input[k]))


# ------------------------------------------------------------------ imported models
def import_files(wildcards):
    """import_model: the user's files (config.json and the weights) of an imported model."""
    return STUDY.import_inputs(wildcards.model)


def task_tokenizer_files(wildcards):
    """make_tasks: the files of the study's own tokenizer (none: GPT-2's, from a package)."""
    return STUDY.task_tokenizer_files()


# ------------------------------------------------------------------ params
# Each stage receives exactly the config it depends on, as canonical JSON in params, so a
# change reruns what it should and nothing else (`--list-changes params`).
def json_param(value, *wildcard_names):
    """A params function: canonical JSON of `value`, or of `value(<those wildcards>)` when
    wildcards are named (a plain string param would be formatted with the wildcards)."""

    def canonical_json(wildcards):
        obj = value(*(wildcards[w] for w in wildcard_names)) if wildcard_names else value
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))

    return canonical_json


def index_meaningful(wildcards):
    return "true" if STUDY.index_meaningful(wildcards.model) else "false"


def vocab_arg(wildcards, input):
    return f"--vocab {input.vocab}" if "vocab" in input.keys() else ""


def input_kinds(wildcards, input):
    """`--input KIND PATH...` for every named input of a table or figure rule."""
    groups = []
    for kind in input.keys():
        paths = input[kind]
        paths = [paths] if isinstance(paths, str) else list(paths)
        if paths:  # an empty kind is left for the builder to name
            groups.append(f"--input {kind} " + " ".join(paths))
    return " ".join(groups)


def clamp_heads(wildcards):
    """The clamps rule: the heads Parquet of every task of the run, in TASKS order."""
    return [
        PATHS["heads"].format(model=wildcards.model, seed=wildcards.seed, task=t) for t in TASKS
    ]


# coordinate concentration (docs §15.2)
def coordinate_heads(wildcards):
    """The heads Parquet of every task of coordinates.tasks, in that order."""
    return [
        PATHS["heads"].format(model=wildcards.model, seed=wildcards.seed, task=t)
        for t in STUDY.stage("coordinates")["tasks"]
    ]


def figure_models(wildcards):
    models = PAPER.figure_models(wildcards.figure)
    return "--models " + " ".join(models) if models else ""


# ------------------------------------------------------------------ resources
# Every rule: `threads: STUDY.threads(rule)` and `resources: **STUDY.resources(rule, mem_mb,
# runtime)` (config resources.<rule>, then resources.default, then the rule's fallbacks).
# Local runs share this machine's GPUs: at most `--resources gpu=N` GPU jobs at a time (one
# by default). Remote execution always has --jobs (the Slurm profile sets it), which sets
# `nodes`, and Slurm counts GPUs itself (the scheduler uses the same test).
# ------------------------------------------------------------------ ablation (docs §10.1, §10.6)
def patch_means(wildcards):
    """patch_heads: the run's means artifact when patching.mode is mean."""
    if STUDY.patch_mode != "mean":
        return {}
    return {"means": PATHS["ablation_means"].format(model=wildcards.model, seed=wildcards.seed)}


def means_arg(wildcards, input):
    return f"--means {input.means}" if "means" in input.keys() else ""


def mode_outs(wildcards, output):
    """patch_modes: `--out TASK MODE PATH` for each of its outputs (tasks × extra modes)."""
    pairs = [(t, m) for t in TASKS for m in STUDY.extra_modes]
    return " ".join(f"--out {t} {m} {path}" for (t, m), path in zip(pairs, output, strict=True))


def mode_task_args(wildcards, input):
    return " ".join(f"--task {t} {path}" for t, path in zip(TASKS, input.tasks, strict=True))


def _mode_file(kind, model, seed, task, mode):
    """A concentration or lanes file of one mode: patching.mode's are the main files."""
    name = kind if mode == STUDY.patch_mode else f"{kind}_mode"
    return PATHS[name].format(model=model, seed=seed, task=task, mode=mode)


def compare_modes_inputs(wildcards):
    """compare_modes: summary, heads and lanes of every mode-comparison run, task and mode."""
    keys = [(m, s, t, mode) for m, s in STUDY.run_set("ablation_modes") for t in TASKS
            for mode in STUDY.comparison_modes]  # fmt: skip
    return {
        kind: [_mode_file(kind, *key) for key in keys] for kind in ("summary", "heads", "lanes")
    }


def compare_modes_args(wildcards, input):
    runs = STUDY.run_set("ablation_modes")
    modes = [mode for _ in runs for _ in TASKS for mode in STUDY.comparison_modes]
    return " ".join(
        f"--input {mode} {s} {h} {l}"
        for mode, s, h, l in zip(modes, input.summary, input.heads, input.lanes, strict=True)
    )


if workflow.nodes is None and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 1)


# ---------------------------------------------------- dynamics (docs §13.2, §13.4, §14.2–14.5)
def dynamics_inputs(wildcards):
    """Rule dynamics: every checkpoint it reads (with manifests), the per-step results of
    the timeline steps and the final run's own SVA results."""
    run = {"model": wildcards.model, "seed": wildcards.seed}
    sva = {**run, "task": "sva"}
    steps = [STUDY.step_label(s) for s in STUDY.timeline_steps]
    read = [STUDY.step_label(s) for s in STUDY.dynamics_checkpoint_steps]
    return {
        "checkpoint": PATHS["checkpoint"].format(**run),
        "manifest": PATHS["manifest"].format(**run),
        "step_checkpoints": [PATHS["step_checkpoint"].format(**run, step=s) for s in read],
        "step_manifests": [PATHS["step_manifest"].format(**run, step=s) for s in read],
        "task": PATHS["task"].format(task="sva"),
        "val": PATHS["corpus_val"].format(corpus=STUDY.model_corpus(wildcards.model)),
        "heads": PATHS["heads"].format(**sva),
        "evals": [PATHS["step_eval"].format(**sva, step=s) for s in steps]
        + [PATHS["eval"].format(**sva)],
        "lanes": [PATHS["step_lanes"].format(**sva, step=s) for s in steps]
        + [PATHS["lanes"].format(**sva)],
        "geometry": [PATHS["step_geometry_summary"].format(**run, step=s) for s in steps]
        + [PATHS["geometry_summary"].format(**run)],
    }


# ------------------------------------------------------------------ document (docs §17)
def _output_of(wildcards):
    """(name, "table" or "figure") of a make_table or make_figure job."""
    if "table" in wildcards.keys():
        return wildcards.table, "table"
    return wildcards.figure, "figure"


def section_of(name, output="table"):
    """The report category of a paper table or figure: its paper section (its record)."""
    return record(output, name).section


def report_section(wildcards):
    """Report category function of the make_table and make_figure outputs."""
    return section_of(*_output_of(wildcards))


def document_inputs(wildcards):
    """Every Parquet of every table of rule make_document, keyed <table>__<kind>."""
    return {
        f"{table}__{kind}": per_run(result, runs)
        for table in PAPER.document_tables
        for kind, (result, runs) in PAPER.paper_inputs(table).items()
    }


def document_input_args(wildcards, input):
    """`--input TABLE:KIND PATH...` for every non-empty named input of make_document."""
    groups = []
    for key in input.keys():
        paths = input[key]
        paths = [paths] if isinstance(paths, str) else list(paths)
        if paths:
            groups.append(f"--input {key.replace('__', ':', 1)} " + " ".join(paths))
    return " ".join(groups)


# ------------------------------------------------------------------ checks (docs §18)
def checks_files():
    """Every artifact whose metadata logs acceptance checks (STUDY.checks_inputs): kind,
    path and the run and task it belongs to (rule checks)."""
    files = []
    for item in STUDY.checks_inputs():
        wildcards = {k: item[k] for k in ("model", "seed", "task") if k in item}
        files.append({"kind": item["kind"], "path": PATHS[item["result"]].format(**wildcards),
                      "model": None, "seed": None, "task": None, **wildcards})  # fmt: skip
    return files


def checks_paths(wildcards):
    return [f["path"] for f in checks_files()]


def catalog_templates(wildcards):
    """Canonical JSON {path template: rule} of every output template of the workflow's
    rules under the study's results (logs and benchmarks are not artifacts), for the
    catalog."""
    from snakemake.io import strip_wildcard_constraints

    found = {}
    for producer in workflow.rules:
        if producer.name == "explorer":  # it reads the catalog, so it is not in it
            continue
        for template in producer.output:
            template = strip_wildcard_constraints(str(template))
            if template.startswith(R + "/") and template not in found:
                found[template] = producer.name
    return json.dumps(found, sort_keys=True, separators=(",", ":"))


def folder_of(name):
    """A params function: the folder of output ``name`` (its first file)."""

    def folder(wildcards, output):
        files = output[name]
        return str(Path(files if isinstance(files, str) else files[0]).parent)

    return folder
