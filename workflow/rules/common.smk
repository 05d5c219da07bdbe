# The only place that turns config into paths, wildcard lists and parameters.
import json
import re
import sys
from pathlib import Path

from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

# Stage scripts and the library are addressed from the workflow, so `snakemake -d elsewhere`
# works; PYTHONPATH makes the library importable even in a bare conda environment.
SRC = Path(workflow.basedir) / "src"
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
# The workflow itself sizes models with the same library (this checkout's, first).
sys.path.insert(0, str(SRC))
from headgeom.model import zoo  # noqa: E402
from headgeom.paper import selections  # noqa: E402

STUDY = config["study"]
TASKS = ["sva", "quote", "plural"]
TABLES = ["table2", "table3", "table5", "table6", "lanes", "leakage"]
FIGURES = ["figure1", "figure3", "figure4", "figure5", "figure7"]
RESULTS = f"results/{STUDY}"

wildcard_constraints:
    study=STUDY,
    model="|".join(map(re.escape, config["models"])),
    seed=r"\d+",
    task="|".join(TASKS),


def model_seeds():
    """(model, seed) pairs of the study, in config order."""
    return [(m, s) for m, spec in config["models"].items() for s in spec["seeds"]]


def per_model_task(stage):
    """results/<study>/<stage>/<model>/s<seed>/<task>.parquet for every model, seed, task."""
    return [
        f"results/{STUDY}/{stage}/{m}/s{s}/{t}.parquet"
        for m, s in model_seeds()
        for t in TASKS
    ]


def free_reader_models():
    """Leakage needs a shared LN_1 before free readers (METHODS §11.1); by default every
    model whose geometry has them."""
    free = [m for m, spec in config["models"].items() if zoo.has_free_readers(spec["geometry"])]
    chosen = config["leakage"].get("models", free)
    unknown = set(chosen) - set(config["models"])
    if unknown:
        raise ValueError(f"config leakage.models names unknown models {sorted(unknown)}")
    return chosen


def leakage_outputs():
    return [
        f"{RESULTS}/leakage/{m}/s{s}/{t}.parquet"
        for m, s in model_seeds()
        if m in free_reader_models()
        for t in TASKS
    ]


def final_outputs():
    # a paper table or figure whose models the study lacks (paper_selection) is left out
    tables = [
        f"{RESULTS}/tables/{name}.{ext}"
        for name in TABLES
        if has_selection(name)
        for ext in ("md", "csv", "tex")
    ]
    figures = [
        f"{RESULTS}/figures/{name}.{ext}"
        for name in FIGURES
        if has_selection(name)
        for ext in ("png", "svg", "csv")
    ]
    return tables + figures + [PARAM_COUNTS] + concentration_outputs()


# ------------------------------------------------------------------ concentration (§12)
def concentration_pairs():
    """Model pairs of the paired bootstrap: config concentration.pairs, or the paper's pairs
    present in the study (headgeom.paper.selections.default_pairs)."""
    return selections.resolve_pairs(config["models"], config["concentration"].get("pairs"))


def concentration_loss_models():
    """Models of the loss-versus-N_eff correlation (METHODS §12.7)."""
    return selections.loss_models(config["models"], config["concentration"].get("loss_models"))


def compare_effects_inputs(wildcards):
    """Effects of every (model, seed) that a pair of the task's paired bootstrap names."""
    keys = []
    for pair in concentration_pairs():
        for key in ((pair["model_a"], pair["seed_a"]), (pair["model_b"], pair["seed_b"])):
            if key not in keys:
                keys.append(key)
    return [f"{RESULTS}/patching/{m}/s{s}/{wildcards.task}.parquet" for m, s in keys]


def check_concentration_split():
    split = config["concentration"]["split"]
    if split not in config["patching"]["splits"]:
        raise ValueError(
            f"config concentration.split is {split!r} but patching.splits "
            f"{config['patching']['splits']} does not include it; add it to patching.splits"
        )


check_concentration_split()


def index_meaningful(wildcards):
    """Head indices form the paper's lanes only with the base head count (METHODS §10.3)."""
    n_head = model_config(wildcards.model)["n_head"]
    return "true" if n_head == config["architecture"]["n_head"] else "false"


def concentration_pairs_json(wildcards):
    return as_json(concentration_pairs())


def concentration_models_json(wildcards):
    """What the loss-versus-N_eff table says about each model (METHODS §12.7)."""
    return as_json(
        {
            m: {
                "display_name": spec.get("display_name", m),
                "geometry": spec["geometry"],
                "corpus": spec.get("corpus"),
                "n_head": model_config(m)["n_head"],
                "reader_type": reader_type(spec["geometry"]),
            }
            for m, spec in config["models"].items()
        }
    )


def reader_type(geometry):
    """block for the block-reader geometries (METHODS §4.3.1), free otherwise (multiscreen
    tiles read freely too, though without a shared LN)."""
    if geometry in zoo.MULTISCREEN_GEOMETRIES:
        return "free"
    return "free" if zoo.has_free_readers(geometry) else "block"


def loss_models_json(wildcards):
    return as_json(concentration_loss_models())


def concentration_outputs():
    """The §12 outputs of every (model, seed, task), the paired comparisons when the study
    has pairs, and the loss-versus-N_eff table."""
    per_model = [
        f"{RESULTS}/concentration/{m}/s{s}/{t}.{kind}.parquet"
        for m, s in model_seeds()
        for t in TASKS
        for kind in ("robustness", "conditions", "logo")
    ]
    compare = [
        f"{RESULTS}/concentration/compare/{t}.{kind}.parquet"
        for t in TASKS
        for kind in ("paired", "paired_logo")
        if concentration_pairs()
    ]
    return per_model + compare + [
        f"{RESULTS}/concentration/compare/{name}.parquet" for name in ("loss", "spearman")
    ]


# ------------------------------------------------------------------ per-stage configs
# Each stage receives exactly the config it depends on, as canonical JSON in params, so a
# change reruns what it should and nothing else (`--list-changes params`).
def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def corpus_config_json(wildcards):
    """The config of one corpus: the source keys plus its name, size, order and sampling."""
    return as_json(CORPORA[wildcards.corpus])


_MODEL_CONFIGS = {}


def model_config(model):
    """The model section of a run config: the geometry sized for the study's architecture,
    every choice explicit (headgeom.model.zoo.derive_model_config)."""
    if model not in _MODEL_CONFIGS:
        spec = config["models"][model]
        try:
            _MODEL_CONFIGS[model] = zoo.derive_model_config(
                spec["geometry"], config["architecture"], spec.get("geometry_params")
            )
        except ValueError as err:
            raise ValueError(f"config models.{model}: {err}") from None
    return _MODEL_CONFIGS[model]


def repository_name(model, seed):
    """The repository name of (model, seed) from `repository_names`, or None."""
    names = config["models"][model].get("repository_names", {})
    return names.get(int(seed), names.get(str(seed)))


def check_model_names():
    for model, spec in config["models"].items():
        seeds = {str(s) for s in spec["seeds"]}
        extra = {str(s) for s in spec.get("repository_names", {})} - seeds
        if extra:
            raise ValueError(
                f"config models.{model}.repository_names names seeds {sorted(extra)} that are "
                f"not in its seeds {spec['seeds']}"
            )
        model_config(model)  # a geometry impossible at this size fails before any job


check_model_names()


def train_config(model, seed):
    spec = config["models"][model]
    cfg = {
        "model_name": model,
        "seed": int(seed),
        "data_seed": config["data_seed"],
        "model": model_config(model),
        "training": config["training"],
    }
    if repository_name(model, seed):
        cfg["repository_name"] = repository_name(model, seed)
    for key in ("display_name", "corpus"):  # corpus: Table 2 compares within a corpus
        if key in spec:
            cfg[key] = spec[key]
    return cfg


def param_count_runs_json(wildcards):
    """Every (model, seed) with the model section of its run config (rule param_counts)."""
    return as_json(
        [
            {
                "model": m,
                "seed": int(s),
                "repository_name": repository_name(m, s),
                "display_name": config["models"][m].get("display_name", m),
                "geometry": config["models"][m]["geometry"],
                "corpus": config["models"][m].get("corpus"),
                "model_config": model_config(m),
            }
            for m, s in model_seeds()
        ]
    )


def param_counts_vocab(wildcards):
    """A compacted vocabulary sets n_vocab; otherwise it is GPT-2's (no corpus needed)."""
    compact = config["corpus"].get("compact_vocab", True)  # then the study has one corpus
    return {"vocab": corpus_file(DEFAULT_CORPUS, "vocab")} if compact else {}


def vocab_arg(wildcards, input):
    return f"--vocab {input.vocab}" if "vocab" in input.keys() else ""


def train_config_json(wildcards):
    return as_json(train_config(wildcards.model, wildcards.seed))


def task_config_json(wildcards):
    return as_json(config["tasks"][wildcards.task])


# ------------------------------------------------------------------ resources
# One config places the DAG on a laptop and on Slurm (slurm/config.yaml). Cluster requests
# come from config values, never from `threads`: `--cores all` caps threads to the submit
# host's cores (snakemake #2447), and the Slurm plugin would otherwise derive
# --cpus-per-task from the capped value.
def resource(rule_name, key, fallback):
    """Per-rule resource from config (`resources.<rule>.<key>`, then `resources.default`)."""
    table = config.get("resources", {})
    for scope in (rule_name, "default"):
        if key in table.get(scope, {}):
            return table[scope][key]
    return fallback


def _cpu_request(rule_name):
    """(key, value) of the CPU request from the nearest scope that names one: cpus_per_task,
    or cpus_per_gpu for a GPU job; None when no scope does."""
    table = config.get("resources", {})
    gpu = resource(rule_name, "gpu", 0)
    for scope in (rule_name, "default"):
        entry = table.get(scope, {})
        if "cpus_per_task" in entry:
            return "cpus_per_task", entry["cpus_per_task"]
        if gpu and "cpus_per_gpu" in entry:
            return "cpus_per_gpu", entry["cpus_per_gpu"]
    return None


def cpus(rule_name, fallback=1):
    """Threads of a rule's job: `threads` from config, else the CPUs it asks Slurm for."""
    request = _cpu_request(rule_name)
    if request is None:
        return resource(rule_name, "threads", fallback)
    key, value = request
    per_job = value * resource(rule_name, "gpu", 0) if key == "cpus_per_gpu" else value
    return resource(rule_name, "threads", per_job)


# Passed to the Slurm executor plugin as they are (sbatch -p, -A, --gpus=<model>:<n>, -C, ...).
SLURM_KEYS = ("slurm_partition", "slurm_account", "slurm_extra", "gpu_model", "constraint", "qos")


def placement(rule_name, fallback_threads=1):
    """A rule's GPUs and Slurm placement: `gpu` (sbatch --gpus; locally it draws on the
    workflow's `gpu` pool, see below), the CPU request pinned from config (cpus_per_task, or
    cpus_per_gpu for GPU jobs; by default the rule's threads as config gives them) and the
    plugin keys of SLURM_KEYS that config sets."""
    out = {"gpu": resource(rule_name, "gpu", 0)}
    key, value = _cpu_request(rule_name) or ("cpus_per_task", cpus(rule_name, fallback_threads))
    out[key] = value
    for key in SLURM_KEYS:
        value = resource(rule_name, key, None)
        if value is not None:
            out[key] = value
    return out


def check_resource_rules():
    """Every key of config `resources` must be `default` or a rule; a typo would place nothing."""
    rules_dir = Path(workflow.basedir) / "workflow" / "rules"
    known = {
        m.group(1)
        for smk in rules_dir.glob("*.smk")
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):", smk.read_text(), re.M)
    }
    unknown = sorted(set(config.get("resources", {})) - known - {"default"})
    if unknown:
        raise ValueError(
            f"config resources names {unknown}, which are not rules; use `default` or one of "
            f"{sorted(known)}"
        )
    for scope, entry in config.get("resources", {}).items():
        if "cpus_per_task" in entry and "cpus_per_gpu" in entry:
            raise ValueError(
                f"config resources.{scope} sets both cpus_per_task ({entry['cpus_per_task']}) "
                f"and cpus_per_gpu ({entry['cpus_per_gpu']}); Slurm takes one of them"
            )


check_resource_rules()


# Local runs share this machine's GPUs: at most `--resources gpu=N` GPU jobs at a time, one
# unless the command line says otherwise. On a cluster Slurm counts GPUs itself; remote
# execution always has --jobs (the Slurm profile sets it), which sets `nodes` (the executor
# itself is not known yet while the workflow is parsed; Snakemake's scheduler uses the same
# test to stop limiting local cores).
if workflow.nodes is None and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 1)


# ------------------------------------------------------------------ paths
def model_dir(w):
    return f"{RESULTS}/models/{w.model}/s{w.seed}"


def checkpoint_path(w):
    return f"{model_dir(w)}/model.safetensors"


def manifest_path(w):
    return f"{model_dir(w)}/manifest.json"


def train_log_path(w):
    return f"{model_dir(w)}/train_log.parquet"


def checkpoint_dir(w):
    """Intermediate checkpoints of one run (training.checkpoint_steps below the final step)."""
    return f"{model_dir(w)}/checkpoints"


def resume_dir(w):
    """The resumable training state of one run; not an output, gone once training is done."""
    return f"{model_dir(w)}/resume"


def intermediate_checkpoints():
    """Output patterns (wildcards model, seed) of every intermediate checkpoint and manifest."""
    from headgeom.training import TrainConfig, checkpoint_name, checkpoint_schedule

    steps = checkpoint_schedule(TrainConfig.from_dict(config["training"]))
    names = [checkpoint_name(s) for s in steps]
    names += [n.replace(".safetensors", ".manifest.json") for n in names]
    return [f"{RESULTS}/models/{{model}}/s{{seed}}/checkpoints/{n}" for n in names]


def task_path(w):
    return f"{RESULTS}/tasks/{w.task}.parquet"


def learned_checkpoint_path(w):
    """export_hf: the checkpoint of a `learned` model; other geometries have no GPT-2 form."""
    geometry = config["models"][w.model]["geometry"]
    if geometry != "learned":
        raise ValueError(
            f"export_hf: model {w.model!r} has geometry {geometry!r}; only 'learned' "
            "checkpoints can be exported to GPT-2"
        )
    return checkpoint_path(w)


PARAM_COUNTS = f"{RESULTS}/models/param_counts.parquet"

# ------------------------------------------------------------------ corpora
# A study declares its corpora in `corpus` (one corpus: n_train_tokens at the top; several:
# `corpus.corpora`, e.g. the paper's R and S); each is built by one tokenize_corpus job into
# results/<study>/corpus/<name>/ with its own byte-identical copy of the shared validation
# file. A model trains on models.<name>.corpus, or on the default corpus.
CORPUS_FILES = {
    "train": "train_tokens.parquet",
    "val": "val_tokens.parquet",
    "vocab": "vocab.parquet",
    "manifest": "manifest.json",
}
_PER_CORPUS_KEYS = ("n_train_tokens", "order", "sampling")


def _declared_corpora():
    """name -> the config of that corpus as src/tokenize_corpus.py takes it."""
    block = config["corpus"]
    source = {k: v for k, v in block.items() if k not in ("corpora", "default", *_PER_CORPUS_KEYS)}
    named = block.get("corpora")
    if named is None:
        if "n_train_tokens" not in block:
            raise ValueError(
                "config corpus: give n_train_tokens (a study with one corpus) or corpora "
                "(named corpora, e.g. {R: {n_train_tokens: 200000000}})"
            )
        own = {k: block[k] for k in _PER_CORPUS_KEYS if k in block}
        return {"default": {**source, "name": "default", **own}}
    misplaced = [k for k in _PER_CORPUS_KEYS if k in block]
    if misplaced:
        raise ValueError(
            f"config corpus: {misplaced} set beside corpus.corpora; give them per corpus "
            f"(corpus.corpora.<name>.{misplaced[0]})"
        )
    if block.get("compact_vocab", True) and len(named) > 1:
        raise ValueError(
            f"config corpus: compact_vocab is true but corpus.corpora declares {sorted(named)}; "
            "each corpus would get its own vocabulary, so set corpus.compact_vocab: false"
        )
    return {name: {**source, "name": name, **spec} for name, spec in named.items()}


CORPORA = _declared_corpora()
DEFAULT_CORPUS = config["corpus"].get("default", next(iter(CORPORA)))
CORPUS_NAMES = "|".join(map(re.escape, CORPORA))  # the `corpus` wildcard of tokenize_corpus


def model_corpus(model):
    """The corpus a model trains on (models.<model>.corpus, else the default corpus)."""
    return config["models"][model].get("corpus", DEFAULT_CORPUS)


def check_corpora():
    if DEFAULT_CORPUS not in CORPORA:
        raise ValueError(
            f"config corpus.default is {DEFAULT_CORPUS!r}; declared corpora: {sorted(CORPORA)}"
        )
    steps, batch = config["training"]["steps"], config["training"]["batch_size"]
    needed = steps * batch * config["architecture"]["n_ctx"] + 1  # +1: the last target
    for model in config["models"]:
        name = model_corpus(model)
        if name not in CORPORA:
            raise ValueError(
                f"config models.{model}.corpus is {name!r}, which the study does not declare "
                f"(declared: {sorted(CORPORA)}; add it under corpus.corpora)"
            )
        spec = CORPORA[name]
        if spec.get("sampling") == "read_once" and spec["n_train_tokens"] < needed:
            raise ValueError(
                f"config corpus {name} is read once but holds {spec['n_train_tokens']:,} tokens; "
                f"model {model} consumes {needed:,} (training.steps × batch_size × n_ctx + 1)"
            )


check_corpora()


def corpus_file(name, role):
    return f"{RESULTS}/corpus/{name}/{CORPUS_FILES[role]}"


def corpus_train_path(wildcards):
    return corpus_file(model_corpus(wildcards.model), "train")


def corpus_val_path(wildcards):
    return corpus_file(model_corpus(wildcards.model), "val")


def corpus_vocab_path(wildcards):
    return corpus_file(model_corpus(wildcards.model), "vocab")


def corpus_manifest_path(wildcards):
    return corpus_file(model_corpus(wildcards.model), "manifest")


# What rules of one (model, seed) read: functions of the model's corpus.
CORPUS = {
    "train": corpus_train_path,
    "val": corpus_val_path,
    "vocab": corpus_vocab_path,
    "manifest": corpus_manifest_path,
}


def check_split_choices():
    """Lanes and leakage read effects of one split, so patching must produce it."""
    patched = config["patching"]["splits"]
    for key in ("lanes", "leakage"):
        split = config[key]["split"]
        if split not in patched:
            raise ValueError(
                f"config {key}.split is {split!r} but patching.splits {patched} does not "
                f"include it; add it to patching.splits"
            )


check_split_choices()


# ------------------------------------------------------------------ tables and figures
# Paper tables and figures read their inputs by kind (`--input KIND PATH...`, see
# headgeom.paper.tables); the models of Table 3 and Figures 3-5 are the paper's (METHODS §17),
# chosen by geometry from this study's models (headgeom.paper.tables.select_models).
def paper_selection(name):
    """(model, seed) pairs a paper table/figure shows; every run for the others."""
    if name in selections.PAPER_SELECTIONS:
        return selections.select_models(config["models"], name)
    return model_seeds()


def has_selection(name):
    return bool(paper_selection(name))


def _runs(pairs):
    return [f"{RESULTS}/models/{m}/s{s}/train_log.parquet" for m, s in pairs]


def _per_task(stage, pairs, suffix=""):
    return [f"{RESULTS}/{stage}/{m}/s{s}/{t}{suffix}.parquet" for m, s in pairs for t in TASKS]


def table_inputs(wildcards):
    """The Parquets each paper table is a pure function of, by kind."""
    name = wildcards.table
    runs = model_seeds()
    chosen = paper_selection(name)
    sources = {
        "table2": lambda: {
            "runs": _runs(runs),
            "geometry": [f"{RESULTS}/geometry/{m}/s{s}/summary.parquet" for m, s in runs],
        },
        "table3": lambda: {
            "runs": _runs(chosen),
            "robustness": _per_task("concentration", chosen, ".robustness"),
        },
        "table5": lambda: {"runs": _runs(runs), "eval": _per_task("eval", runs)},
        "table6": lambda: {"runs": _runs(runs), "summaries": _per_task("concentration", runs)},
        "lanes": lambda: {"lanes": per_model_task("lanes")},
        "leakage": lambda: {"leakage": leakage_outputs()},
    }
    return sources[name]()


def figure_inputs(wildcards):
    """The Parquets each paper figure is a pure function of, by kind."""
    name = wildcards.figure
    chosen = paper_selection(name)
    sources = {
        # one checkpoint per model: its first configured seed
        "figure1": lambda: {
            "pk": [
                f"{RESULTS}/geometry/{m}/s{spec['seeds'][0]}/pk.parquet"
                for m, spec in config["models"].items()
            ]
        },
        "figure3": lambda: {
            "runs": _runs(chosen),
            "robustness": _per_task("concentration", chosen, ".robustness"),
        },
        "figure4": lambda: {"loss": [f"{RESULTS}/concentration/compare/loss.parquet"]},
        "figure5": lambda: {
            "runs": _runs(chosen),
            "heads": _per_task("concentration", chosen, ".heads"),
            "lanes": _per_task("lanes", chosen),
            "eval": _per_task("eval", chosen),
        },
        "figure7": lambda: {
            "geometry": [f"{RESULTS}/geometry/{m}/s{s}/summary.parquet" for m, s in model_seeds()]
        },
    }
    return sources[name]()


def input_kinds(wildcards, input):
    """`--input KIND PATH...` for every named input of a table or figure rule."""
    groups = []
    for kind in input.keys():
        paths = input[kind]
        paths = [paths] if isinstance(paths, str) else list(paths)
        if paths:  # an empty kind is left for the builder to name
            groups.append(f"--input {kind} " + " ".join(paths))
    return " ".join(groups)


def figure_models(wildcards):
    """Figure 4 plots the paper's models from the cross-model loss Parquet."""
    if wildcards.figure != "figure4":
        return ""
    return "--models " + " ".join(dict.fromkeys(m for m, _ in paper_selection("figure4")))
