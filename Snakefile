# headgeom: attention-head read/write geometry, end to end.
#   snakemake --cores all                                  # the embedded demo study
#   snakemake --cores all --configfile config/paper.yaml   # the paper (GPU cluster)
#   snakemake --cores all --configfile=config/samoe.yaml   # the second study: SA-MoE (docs/samoe.md)
from snakemake.utils import min_version

min_version("9.0")


# A --configfile replaces the demo study instead of being merged into it: merging would
# silently add the demo's models to another study.
if not config:

    configfile: "config/config.yaml"


# The study kind picks the rules: `kind: samoe` is the SA-MoE study, anything else head geometry.
if config.get("kind") == "samoe":

    include: "workflow/samoe/main.smk"

else:

    include: "workflow/headgeom.smk"


# The study's own outputs (study_outputs: workflow/headgeom.smk or workflow/samoe/main.smk).
# Rule all lives here: an included file's first rule never becomes the default target.
rule all:
    default_target: True
    input:
        study_outputs(),
