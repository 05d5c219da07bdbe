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

R = f"results/{STUDY.name}"
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
    compression view where enabled, the page."""
    names = ("effects", "retention", "summary", "profile", "report")
    if STUDY.compression_enabled:  # the compression view (workflow/atlas/compression.smk)
        names += ("compression", "compression_report")
    return [PATHS[k] for k in (*names, "page")]


def checked_rules(names):
    try:
        STUDY.check_rules(names)
    except StudyConfigError as err:
        sys.exit(f"Invalid study config:\n{err}")
