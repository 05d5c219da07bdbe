rule make_tasks:
    output:
        PATHS["task"],
    log:
        log_of("make_tasks", "{task}"),
    benchmark:
        benchmark_of("make_tasks", "{task}")
    params:
        cfg=json_param(STUDY.task_config, "task"),
    threads: STUDY.threads("make_tasks")
    resources:
        **STUDY.resources("make_tasks", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_tasks.py --task {wildcards.task} --config-json {params.cfg:q} "
        "--out {output} 2> {log}"
