# The SA-MoE study (docs/samoe.md): its rules, the local rules, the check of `resources`.
#   snakemake --cores all --configfile=config/samoe.yaml


report: "../report/samoe.rst"


include: "common.smk"
include: "models.smk"
include: "analyses.smk"
include: "paper.smk"


localrules:
    samoe_targets,
    samoe_stats,
    samoe_paper,


# config `resources` may name only the rules above (any other key would place nothing)
checked_rules([r.name for r in workflow.rules])
