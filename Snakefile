# headgeom: attention-head read/write geometry, end to end.
#   snakemake --cores all                                  # the embedded demo study
#   snakemake --cores all --configfile config/paper.yaml   # the paper (GPU cluster)
from snakemake.utils import min_version

min_version("9.0")


# A --configfile replaces the demo study instead of being merged into it: merging would
# silently add the demo's models to another study.
if not config:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/import.smk"  # imported models
include: "workflow/rules/models.smk"
include: "workflow/rules/tasks.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/patching.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/concentration.smk"
include: "workflow/rules/leakage.smk"
include: "workflow/rules/exclusivity.smk"
include: "workflow/rules/lanes.smk"
include: "workflow/rules/clamps.smk"
include: "workflow/rules/geometry.smk"
include: "workflow/rules/dynamics.smk"  # docs §13.2, §13.4, §14.2–14.5
include: "workflow/rules/edges.smk"  # docs §15.1, §15.4
include: "workflow/rules/coordinates.smk"  # docs §15.2
include: "workflow/rules/tables.smk"
include: "workflow/rules/document.smk"  # docs §17
include: "workflow/rules/explorer.smk"  # docs §19
include: "workflow/rules/ablation.smk"  # docs §10.6
include: "workflow/rules/checks.smk"  # docs §5.7, §18


# Seconds-long jobs that only read Parquet and write tables, figures or small records run on
# the submit host under a cluster profile instead of costing a submission each (slurm/config.yaml
# groups the per-run statistics the same way).
localrules:
    make_tasks,
    param_counts,
    basis_family,
    exclusivity,
    compare_concentration,
    concentration_loss,
    compare_modes,
    make_table,
    make_figure,
    make_document,
    catalog,
    explorer,
    checks,


rule all:
    default_target: True
    input:
        final_outputs(),


# config `resources` may name only the rules above (any other key would place nothing)
checked(STUDY.check_rules, [r.name for r in workflow.rules])
