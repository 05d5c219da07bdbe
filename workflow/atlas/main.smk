# The edit atlas (docs/atlas.md): its rules, the local rules, the check of `resources`.
#   snakemake --cores all --configfile=config/atlas-smollm2.yaml


include: "common.smk"
include: "atlas.smk"
include: "compression.smk"
include: "pairs.smk"
include: "checkpoints.smk"
include: "page.smk"


localrules:
    atlas_report,


# config `resources` may name only the rules above (any other key would place nothing)
checked_rules([r.name for r in workflow.rules])
