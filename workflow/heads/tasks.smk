# The study's task files, under GPT-2's tokenizer, or under the tokenizer of the study's
# imported causal LM (Study.task_tokenizer: its files are inputs, its path rides in the
# config JSON, so the default study's command and params are unchanged).
rule make_tasks:
    input:
        tokenizer=task_tokenizer_files,
    output:
        PATHS["task"],
    log:
        log_of("make_tasks", "{task}"),
    benchmark:
        benchmark_of("make_tasks", "{task}")
    params:
        cfg=json_param(STUDY.make_tasks_config, "task"),
    threads: STUDY.threads("make_tasks")
    resources:
        **STUDY.resources("make_tasks", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.make_tasks "
        "--task {wildcards.task} --config-json {params.cfg:q} "
        "--out {output} 2> {log}"
