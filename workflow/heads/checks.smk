# The numerical acceptance checks (docs §18): the basis family record with C2–C5 (docs §5.7)
# and one table of every check the DAG logs (headgeom.checks), which the document shows.


rule basis_family:
    output:
        PATHS["basis_family"],
    log:
        log_of("basis_family", "basis_family"),
    benchmark:
        benchmark_of("basis_family", "basis_family")
    params:
        runs=json_param(STUDY.basis_family_models()),
    threads: STUDY.threads("basis_family")
    resources:
        **STUDY.resources("basis_family", mem_mb=4000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.basis_family "
        "--runs-json {params.runs:q} --out {output} 2> {log}"


rule checks:
    input:
        checks_paths,
    output:
        PATHS["checks"],
    log:
        log_of("checks", "checks"),
    benchmark:
        benchmark_of("checks", "checks")
    params:
        files=json_param(checks_files()),
        runs=json_param(STUDY.checks_runs()),
    threads: STUDY.threads("checks")
    resources:
        **STUDY.resources("checks", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.checks "
        "--files-json {params.files:q} --runs-json {params.runs:q} "
        "--out {output} 2> {log}"
