# The SA-MoE study object, the one table of paths every rule uses, and the helpers of the
# rules (workflow/samoe/*.smk). No rules here.
import json
import os
import sys
from pathlib import Path

SRC = Path(workflow.basedir) / "src"
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
sys.path.insert(0, str(SRC))
from headgeom.kernels import pin_kernels  # noqa: E402
from headgeom.samoe.paths import TEMPLATES  # noqa: E402
from headgeom.samoe.schedule import chain_seconds  # noqa: E402
from headgeom.samoe.study import SAMoEStudy  # noqa: E402
from headgeom.validation import StudyConfigError  # noqa: E402

try:
    pin_kernels()  # the same CPU kernel paths as the head-geometry study (docs §2.7)
except ValueError as err:
    sys.exit(f"Invalid environment: {err}")
try:
    STUDY = SAMoEStudy.from_config(config)  # the study kind `samoe` (headgeom.studies)
except StudyConfigError as err:
    sys.exit(f"Invalid study config:\n{err}")

R = f"results/{STUDY.name}"
PATHS = {name: f"{R}/{template}" for name, template in TEMPLATES.items()}


wildcard_constraints:
    family=STUDY.pattern(STUDY.families),
    variant=STUDY.pattern(STUDY.variants),
    seed=r"\d+",


def log_of(*parts):
    return f"{R}/logs/samoe/{'/'.join(parts)}.log"


def benchmark_of(*parts):
    return f"{R}/benchmarks/samoe/{'/'.join(parts)}.tsv"


def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def json_param(fn, *names):
    """A params function: canonical JSON of fn(<those wildcards>)."""
    return lambda wildcards: as_json(fn(*(wildcards[n] for n in names)))


def per_run(result, runs):
    return [PATHS[result].format(family=f, variant=v, seed=s) for f, v, s in runs]


def run_json(wildcards):
    return as_json(
        {"family": wildcards.family, "variant": wildcards.variant, "seed": int(wildcards.seed)}
    )


def chain_priority(name):
    """A ``priority:`` function: the job with the longest chain of work ahead starts first
    (headgeom.samoe.schedule)."""
    return lambda wildcards: chain_seconds(name, wildcards["variant"])


#: The corpus files a family's jobs read: the study's toy corpus (rule samoe_corpus) for a
#: toy family, the family's own (rule samoe_hub_corpus) for a Hub family.
CORPUS_FILES = {
    "cpt_train": ("corpus_cpt_train", "hub_cpt_train"),
    "pools": ("pools", "hub_pools"),
    "corpus_manifest": ("corpus_manifest", "hub_corpus_manifest"),
}


def corpus_file(name):
    """An input function: the corpus file ``name`` of the job's family."""
    toy, hub = CORPUS_FILES[name]
    return lambda wildcards: (
        PATHS[toy]
        if STUDY.is_toy(wildcards["family"])
        else PATHS[hub].format(family=wildcards["family"])
    )


def downstream_file(wildcards):
    """samoe_quality's downstream suite: the study's toy suite (samoe_corpus) for a toy
    family, the run's lm-evaluation-harness results (samoe_harness) for a Hub family, none
    where the harness is left out (downstream.run_harness: false)."""
    if STUDY.is_toy(wildcards["family"]):
        return PATHS["downstream"]
    if wildcards["family"] not in STUDY.harness_families:
        return []
    return PATHS["harness"].format(**{k: wildcards[k] for k in ("family", "variant", "seed")})


def downstream_flag(wildcards):
    """samoe_quality's option for that file."""
    if STUDY.is_toy(wildcards["family"]):
        return "--downstream"
    return "--harness" if wildcards["family"] in STUDY.harness_families else "--no-suite"


def dense_files(wildcards):
    """samoe_quality's dense source of an imported family (its perplexity beside the run's);
    none for a toy family."""
    if STUDY.is_toy(wildcards["family"]):
        return []
    return [PATHS[k].format(family=wildcards["family"]) for k in ("dense", "dense_manifest")]


def dense_flag(wildcards, input):
    """samoe_quality's options for those files."""
    if not input.dense:
        return ""
    return f"--dense {input.dense[0]} --dense-manifest {input.dense[1]}"


def source_files(wildcards):
    """The local files a source family's import and corpus read (tracked by the workflow)."""
    return STUDY.source_files(wildcards["family"])


def corpus_files_of(name, families):
    """The corpus file ``name`` of each of ``families`` (one per corpus, in family order)."""
    return list(dict.fromkeys(corpus_file(name)({"family": f}) for f in families))


def directory_of(key):
    """A params function: the directory of the job's input or output file ``key``."""
    return lambda wildcards, input, output: os.path.dirname(
        getattr(output, key, None) or getattr(input, key)
    )


def cost_runs(result, family):
    """``result`` of every variant of ``family`` at the ranking seed (the audit pilot's)."""
    seed = STUDY.config["interventions"]["ranking_seed"]
    return [PATHS[result].format(family=family, variant=v, seed=seed) for v in STUDY.variants]


def all_rankings():
    """The ranking metrics of every run: the state runs' ledger rankings, the ordinary runs'
    Li attribution (one schema)."""
    return per_run("rankings", STUDY.state_runs) + per_run("li_rankings", STUDY.ordinary_runs)


def paper_config():
    c = STUDY.config
    keys = (
        "moe",
        "cpt",
        "variants",
        "seeds",
        "noninferiority",
        "families",
        "probes",
        "interventions",
        "downstream",
    )
    return {k: c[k] for k in keys}


SAMOE_TABLES = [
    *(f"table{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 22)),
    "table_history",
    "table_history_pool",
    "table_quality_dense",
    "table_step0",
    "table_rankings_seeds",
    "table_state_geometry",
]
SAMOE_FIGURES = ["figure1", "figure2a", "figure2b", "figure3", "figure4"]


def paper_files(reported=False):
    """The table and figure files of rule samoe_paper; with ``reported``, the Markdown
    tables and PNG figures wrapped for ``snakemake --report`` (category SA-MoE)."""
    tables, figures = _paper_files()
    if not reported:
        return tables, figures

    def wrap(path, sub):
        caption = "../report/samoe_outputs.rst"
        return report(path, caption=caption, category="SA-MoE", subcategory=sub)

    return ([wrap(p, "Tables") if p.endswith(".md") else p for p in tables],
            [wrap(p, "Figures") if p.endswith(".png") else p for p in figures])  # fmt: skip


def _paper_files():
    tables = [
        PATHS[f"table_{x}"].format(table=t) for t in SAMOE_TABLES for x in ("md", "csv", "tex")
    ]
    figures = [PATHS[f"figure_{x}"].format(figure=f) for f in SAMOE_FIGURES for x in ("png", "csv")]
    return tables, figures


def study_outputs():
    """The default target's inputs: every SA-MoE table, figure and record."""
    tables, figures = paper_files()
    return [*tables, *figures, PATHS["comparison"], PATHS["seeds"],
            *per_run("train_log", STUDY.runs)]  # fmt: skip


def checked_rules(names):
    try:
        STUDY.check_rules(names)
    except StudyConfigError as err:
        sys.exit(f"Invalid study config:\n{err}")
