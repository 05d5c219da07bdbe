# Clean task performance (Table 5), one job per run for every task: the checkpoint is
# verified and loaded once (a job's start-up, mostly torch, costs more than a task's
# evaluation). evaluate_step (dynamics.smk) reuses it per intermediate checkpoint and task.
rule evaluate_clean:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        expand(PATHS["eval"], task=TASKS, allow_missing=True),
    log:
        log_of("evaluate_clean", "{model}-s{seed}"),
    benchmark:
        benchmark_of("evaluate_clean", "{model}-s{seed}")
    threads: STUDY.threads("evaluate_clean")
    resources:
        **STUDY.resources("evaluate_clean", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.evaluate_clean --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --threads {threads} "
        "--out {output} 2> {log}"
