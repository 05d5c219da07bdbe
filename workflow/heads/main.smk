# The head-geometry study (docs/methods.md): every rule, the local rules and the default target.
# The Snakefile includes this file for a config without `kind` (headgeom.studies).


report: "../report/workflow.rst"


include: "common.smk"
include: "corpus.smk"
include: "train.smk"
include: "import.smk"  # imported models
include: "models.smk"
include: "tasks.smk"
include: "evaluate.smk"
include: "patching.smk"
include: "atp.smk"  # docs §10.1: AtP beside exact patching
include: "export.smk"
include: "concentration.smk"
include: "leakage.smk"
include: "exclusivity.smk"
include: "lanes.smk"
include: "clamps.smk"
include: "geometry.smk"
include: "dynamics.smk"  # docs §13.2, §13.4, §14.2–14.5
include: "edges.smk"  # docs §15.1, §15.4
include: "coordinates.smk"  # docs §15.2
include: "tables.smk"
include: "document.smk"  # docs §17
include: "explorer.smk"  # docs §19
include: "ablation.smk"  # docs §10.6
include: "checks.smk"  # docs §5.7, §18


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
