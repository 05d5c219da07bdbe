# headgeom: attention-head read/write geometry, end to end.
#   snakemake --cores all                                  # the embedded demo study
#   snakemake --cores all --configfile config/paper.yaml   # the paper (GPU cluster)
#   snakemake --cores all --configfile=config/samoe.yaml   # the second study: SA-MoE (docs/samoe.md)
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")
# The study kinds (headgeom.studies), from this checkout's library.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from headgeom.studies import StudyConfigError, kind_of  # noqa: E402

# A --configfile replaces the demo study instead of being merged into it: merging would
# silently add the demo's models to another study.
if not config:

    configfile: "config/config.yaml"


# The study kind picks the rules: its wing's rules folder (workflow/heads/ without `kind`,
# workflow/samoe/ for `kind: samoe`; one registration each in headgeom.studies).
try:
    STUDY_KIND = kind_of(config)
except StudyConfigError as err:
    sys.exit(f"Invalid study config:\n{err}")


include: STUDY_KIND.rules


# The study's own outputs (study_outputs: the kind's main.smk).
# Rule all lives here: an included file's first rule never becomes the default target.
rule all:
    default_target: True
    input:
        study_outputs(),
