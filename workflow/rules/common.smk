# Validation and the study object (headgeom.study), the one table of path templates every
# rule's input and output use, and resources. What the study means (runs, corpora, run
# configs, paper selections, pairs, cross-key checks) lives in headgeom.study.
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
from headgeom.paper.selections import PAPER_FIGURES, PAPER_TABLES  # noqa: E402
from headgeom.study import TASKS, Study, StudyConfigError  # noqa: E402


def checked(check, *args):
    """A study check; a bad config prints only its concise message (no schema) and stops."""
    try:
        return check(*args)
    except StudyConfigError as err:
        sys.exit(f"Invalid study config:\n{err}")


# Schema: headgeom.study.SCHEMA; the Snakefile checks `resources` keys against the rules.
STUDY = checked(Study.from_config, config)


wildcard_constraints:
    study=STUDY.name,
    model="|".join(map(re.escape, STUDY.models)),
    seed=r"\d+",
    task="|".join(TASKS),


# ------------------------------------------------------------------ paths
# Every file that rules read or write, once (wildcards {corpus}, {model}, {seed}, {task},
# {table}, {figure}); per_run expands them. Logs and benchmarks: log_of, benchmark_of.
R = f"results/{STUDY.name}"
PATHS = {
    name: f"{R}/{template}"
    for name, template in {
        # one corpus of STUDY.corpora (rule tokenize_corpus)
        "corpus_train": "corpus/{corpus}/train_tokens.parquet",
        "corpus_val": "corpus/{corpus}/val_tokens.parquet",
        "corpus_vocab": "corpus/{corpus}/vocab.parquet",
        "corpus_manifest": "corpus/{corpus}/manifest.json",
        "task": "tasks/{task}.parquet",
        # one run (model, seed)
        "checkpoint": "models/{model}/s{seed}/model.safetensors",
        "train_log": "models/{model}/s{seed}/train_log.parquet",
        "manifest": "models/{model}/s{seed}/manifest.json",
        "checkpoints": "models/{model}/s{seed}/checkpoints",  # training.checkpoint_steps
        "resume": "models/{model}/s{seed}/resume",  # resumable training state; not an output
        "hf": "models/{model}/s{seed}/hf",
        "pk": "geometry/{model}/s{seed}/pk.parquet",
        "geometry_summary": "geometry/{model}/s{seed}/summary.parquet",
        # one run and task
        "eval": "eval/{model}/s{seed}/{task}.parquet",
        "effects": "patching/{model}/s{seed}/{task}.parquet",
        "summary": "concentration/{model}/s{seed}/{task}.parquet",
        "heads": "concentration/{model}/s{seed}/{task}.heads.parquet",
        "robustness": "concentration/{model}/s{seed}/{task}.robustness.parquet",
        "conditions": "concentration/{model}/s{seed}/{task}.conditions.parquet",
        "logo": "concentration/{model}/s{seed}/{task}.logo.parquet",
        "leakage": "leakage/{model}/s{seed}/{task}.parquet",
        "lanes": "lanes/{model}/s{seed}/{task}.parquet",
        # one run, every task (rule clamps; issue 11)
        "clamp_pairs": "clamps/{model}/s{seed}/pairs.parquet",
        "clamp_paths": "clamps/{model}/s{seed}/paths.parquet",
        "clamp_lumped": "clamps/{model}/s{seed}/lumped.parquet",
        # across runs
        "param_counts": "models/param_counts.parquet",
        "paired": "concentration/compare/{task}.paired.parquet",
        "paired_logo": "concentration/compare/{task}.paired_logo.parquet",
        "loss": "concentration/compare/loss.parquet",
        "spearman": "concentration/compare/spearman.parquet",
        # issue 13 (§15.1, §15.4): one run
        "edges": "edges/{model}/s{seed}/edges.parquet",
        "edge_summary": "edges/{model}/s{seed}/summary.parquet",
        "acdc": "edges/{model}/s{seed}/acdc.parquet",
        # issue 10 (§5.1): across the leakage runs
        "exclusivity": "exclusivity/summary.parquet",
        "exclusivity_pairs": "exclusivity/pairs.parquet",
        "exclusivity_heads": "exclusivity/heads.parquet",
        "table_md": "tables/{table}.md",
        "table_csv": "tables/{table}.csv",
        "table_tex": "tables/{table}.tex",
        "table_sources": "tables/{table}.sources.json",
        "figure_png": "figures/{figure}.png",
        "figure_svg": "figures/{figure}.svg",
        "figure_csv": "figures/{figure}.csv",
        "figure_sources": "figures/{figure}.sources.json",
    }.items()
}


def log_of(*parts):
    return f"{R}/logs/{'/'.join(parts)}.log"


def benchmark_of(*parts):
    return f"{R}/benchmarks/{'/'.join(parts)}.tsv"


def per_run(result, runs, tasks=TASKS):
    """PATHS[result] of every run (× task where it has one), run by run; None: one file."""
    if runs is None:
        return [PATHS[result]]
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
    wanted = STUDY.paper_inputs(wildcards.get("table", wildcards.get("figure")))
    return {kind: per_run(result, runs) for kind, (result, runs) in wanted.items()}


def final_outputs():
    """The paper tables and figures the study can make (STUDY.tables, STUDY.figures), the
    parameter counts and the §12 outputs (per run and task, paired, loss vs N_eff)."""
    tables = [
        PATHS[f"table_{x}"].format(table=t) for t in STUDY.tables for x in ("md", "csv", "tex")
    ]
    figures = [
        PATHS[f"figure_{x}"].format(figure=f) for f in STUDY.figures for x in ("png", "svg", "csv")
    ]
    per_run_task = [
        PATHS[kind].format(model=m, seed=s, task=t)
        for m, s in STUDY.runs
        for t in TASKS
        for kind in ("robustness", "conditions", "logo")
    ]
    pairs = [PATHS[k].format(task=t) for t in TASKS for k in ("paired", "paired_logo")]
    pairs = pairs if STUDY.pairs else []
    cross_model = [PATHS["loss"], PATHS["spearman"]]
    # issue 10 (§5.1): the exclusivity Parquets (Table 1's "geometric exclusivity" inputs)
    exclusivity = [PATHS["exclusivity"]] if STUDY.leakage_runs else []
    return (
        tables + figures + [PATHS["param_counts"]] + per_run_task + pairs + cross_model
        + exclusivity
    )


# ------------------------------------------------------------------ imported models (issue 15)
def import_files(wildcards):
    """import_model: the user's files (config.json and the weights) of an imported model."""
    return STUDY.import_inputs(wildcards.model)


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
    return [PATHS["heads"].format(model=wildcards.model, seed=wildcards.seed, task=t) for t in TASKS]


def figure_models(wildcards):
    models = STUDY.figure_models(wildcards.figure)
    return "--models " + " ".join(models) if models else ""


# ------------------------------------------------------------------ resources
# Every rule: `threads: STUDY.threads(rule)` and `resources: **STUDY.resources(rule, mem_mb,
# runtime)` (config resources.<rule>, then resources.default, then the rule's fallbacks).
# Local runs share this machine's GPUs: at most `--resources gpu=N` GPU jobs at a time (one
# by default). Remote execution always has --jobs (the Slurm profile sets it), which sets
# `nodes`, and Slurm counts GPUs itself (the scheduler uses the same test).
if workflow.nodes is None and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 1)
