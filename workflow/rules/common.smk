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
from headgeom import zoo  # noqa: E402

STUDY = config["study"]
TASKS = ["sva", "quote", "plural"]
TABLES = ["table2", "table5", "table6", "lanes", "leakage"]
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
    tables = [f"{RESULTS}/tables/{name}.{ext}" for name in TABLES for ext in ("md", "csv")]
    # FIGURES is defined in geometry.smk beside the figure rule; this function is called
    # from the Snakefile's final target, after every include.
    figures = [f"{RESULTS}/figures/{name}.{ext}" for name in FIGURES for ext in ("png", "svg")]
    return tables + figures + [PARAM_COUNTS]


# ------------------------------------------------------------------ per-stage configs
# Each stage receives exactly the config it depends on, as canonical JSON in params, so a
# change reruns what it should and nothing else (`--list-changes params`).
def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def corpus_config_json(wildcards):
    return as_json(config["corpus"])


_MODEL_CONFIGS = {}


def model_config(model):
    """The model section of a run config: the geometry sized for the study's architecture,
    every choice explicit (headgeom.zoo.derive_model_config)."""
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
    return {"vocab": CORPUS["vocab"]} if config["corpus"].get("compact_vocab", True) else {}


def vocab_arg(wildcards, input):
    return f"--vocab {input.vocab}" if "vocab" in input.keys() else ""


def train_config_json(wildcards):
    return as_json(train_config(wildcards.model, wildcards.seed))


def task_config_json(wildcards):
    return as_json(config["tasks"][wildcards.task])


def resource(rule_name, key, fallback):
    """Per-rule resource from config (`resources.<rule>.<key>`, then `resources.default`)."""
    table = config.get("resources", {})
    for scope in (rule_name, "default"):
        if key in table.get(scope, {}):
            return table[scope][key]
    return fallback


# ------------------------------------------------------------------ paths
def model_dir(w):
    return f"{RESULTS}/models/{w.model}/s{w.seed}"


def checkpoint_path(w):
    return f"{model_dir(w)}/model.safetensors"


def manifest_path(w):
    return f"{model_dir(w)}/manifest.json"


def train_log_path(w):
    return f"{model_dir(w)}/train_log.parquet"


def task_path(w):
    return f"{RESULTS}/tasks/{w.task}.parquet"


PARAM_COUNTS = f"{RESULTS}/models/param_counts.parquet"

CORPUS = {
    "train": f"{RESULTS}/corpus/train_tokens.parquet",
    "val": f"{RESULTS}/corpus/val_tokens.parquet",
    "vocab": f"{RESULTS}/corpus/vocab.parquet",
    "manifest": f"{RESULTS}/corpus/manifest.json",
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


def table_inputs(wildcards):
    """The Parquets each paper table is a pure function of."""
    sources = {
        "table2": [f"{RESULTS}/models/{m}/s{s}/train_log.parquet" for m, s in model_seeds()]
        + [f"{RESULTS}/geometry/{m}/s{s}/summary.parquet" for m, s in model_seeds()],
        "table5": per_model_task("eval"),
        "table6": per_model_task("concentration"),
        "lanes": per_model_task("lanes"),
        "leakage": leakage_outputs(),
    }
    return sources[wildcards.table]
