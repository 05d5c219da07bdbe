# The edit atlas's study object, the one table of paths every rule uses, and the helpers of
# the rules (workflow/atlas/*.smk). No rules here.
import json
import sys
from pathlib import Path

SRC = Path(workflow.basedir) / "src"
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
sys.path.insert(0, str(SRC))
from headgeom.atlas.paths import TEMPLATES  # noqa: E402
from headgeom.atlas.study import AtlasStudy  # noqa: E402
from headgeom.kernels import pin_kernels  # noqa: E402
from headgeom.validation import StudyConfigError  # noqa: E402

try:
    pin_kernels()  # the same CPU kernel paths as the other studies (docs §2.7)
except ValueError as err:
    sys.exit(f"Invalid environment: {err}")
try:
    STUDY = AtlasStudy.from_config(config)  # the study kind `atlas` (headgeom.studies)
except StudyConfigError as err:
    sys.exit(f"Invalid study config:\n{err}")
if STUDY.model_note():  # e.g. Hub weights that need network: say so before planning
    print(f"Note: {STUDY.model_note()}", file=sys.stderr)

R = STUDY.results_dir
PATHS = {name: f"{R}/{template}" for name, template in TEMPLATES.items()}


wildcard_constraints:
    shard=STUDY.pattern(STUDY.shards),


def log_of(*parts):
    return f"{R}/logs/atlas/{'/'.join(parts)}.log"


def benchmark_of(*parts):
    return f"{R}/benchmarks/atlas/{'/'.join(parts)}.tsv"


def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def per_shard(result):
    return [PATHS[result].format(shard=s) for s in STUDY.shards]


def study_outputs():
    """The default target's inputs: the merged tables, the profile, the report, the
    compression view where enabled, each pair's report, the page."""
    names = ("effects", "retention", "summary", "profile", "report")
    if STUDY.compression_enabled:  # the compression view (workflow/atlas/compression.smk)
        names += ("compression", "compression_report")
    reports = [PATHS["pair_report"].format(pair=p) for p in STUDY.pairs]
    return [PATHS[k] for k in names] + reports + [PATHS["page"]]


#: The pair views' tables the page shows (workflow/atlas/pairs.smk), by page table name.
PAIR_VIEWS = {"blend": "pair_blend", "probes": "pair_probes", "grafts": "pair_grafts",
              "drift": "pair_drift", "lowrank": "pair_lowrank"}  # fmt: skip


def pair_tables():
    """Every pair's tables, as the page rule's named inputs."""
    return {f"pair{i}_{view}": PATHS[path].format(pair=pair)
            for i, pair in enumerate(STUDY.pairs) for view, path in PAIR_VIEWS.items()}  # fmt: skip


def pair_folders():
    """The page's --pair NAME=FOLDER arguments."""
    return " ".join(f"--pair {pair}={R}/atlas/pairs/{pair}" for pair in STUDY.pairs)


def pair_inputs(wildcards):
    """A view's inputs: the pair's windows and probe items (the study's own where A is the
    study's model), and both checkpoints' files."""
    pair = wildcards.pair
    shared = STUDY.pair_shares_inputs(pair)
    windows, probes = ("windows", "probes") if shared else ("pair_windows", "pair_items")
    return {
        "windows": PATHS[windows].format(pair=pair),
        "probes": PATHS[probes].format(pair=pair),
        "a": STUDY.pair_files(pair, "a"),
        "b": STUDY.pair_files(pair, "b"),
    }


def pair_cfg(wildcards):
    return as_json(STUDY.pair_config(wildcards.pair))


def checked_rules(names):
    try:
        STUDY.check_rules(names)
    except StudyConfigError as err:
        sys.exit(f"Invalid study config:\n{err}")
