rule make_tasks:
    output:
        f"{RESULTS}/tasks/{{task}}.parquet",
    log:
        f"{RESULTS}/logs/make_tasks/{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_tasks/{{task}}.tsv"
    params:
        cfg=task_config_json,
    threads: cpus("make_tasks")
    resources:
        mem_mb=resource("make_tasks", "mem_mb", 1000),
        runtime=resource("make_tasks", "runtime", 10),
        **placement("make_tasks"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_tasks.py --task {wildcards.task} --config-json {params.cfg:q} "
        "--out {output} 2> {log}"
