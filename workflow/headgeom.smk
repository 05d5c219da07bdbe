# The head-geometry study (docs/methods.md): every rule, the local rules and the default target.
# The Snakefile includes this file for every config without `kind: samoe`.


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/corpus.smk"
include: "rules/train.smk"
include: "rules/import.smk"  # imported models
include: "rules/models.smk"
include: "rules/tasks.smk"
include: "rules/evaluate.smk"
include: "rules/patching.smk"
include: "rules/atp.smk"  # docs §10.1: AtP beside exact patching
include: "rules/export.smk"
include: "rules/concentration.smk"
include: "rules/leakage.smk"
include: "rules/exclusivity.smk"
include: "rules/lanes.smk"
include: "rules/clamps.smk"
include: "rules/geometry.smk"
include: "rules/dynamics.smk"  # docs §13.2, §13.4, §14.2–14.5
include: "rules/edges.smk"  # docs §15.1, §15.4
include: "rules/coordinates.smk"  # docs §15.2
include: "rules/tables.smk"
include: "rules/document.smk"  # docs §17
include: "rules/explorer.smk"  # docs §19
include: "rules/ablation.smk"  # docs §10.6
include: "rules/checks.smk"  # docs §5.7, §18


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


# config `resources` may name only the rules above (any other key would place nothing)
checked(STUDY.check_rules, [r.name for r in workflow.rules])
