# One job per run for every task (as patch_heads): the checkpoint is verified and loaded once.
rule leakage:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=[PATHS["task"].format(task=t) for t in TASKS],
        effects=[PATHS["effects"].replace("{task}", t) for t in TASKS],
    output:
        expand(PATHS["leakage"], task=TASKS, allow_missing=True),
    log:
        log_of("leakage", "{model}-s{seed}"),
    benchmark:
        benchmark_of("leakage", "{model}-s{seed}")
    params:
        split=STUDY.stage("leakage")["split"],
    threads: STUDY.threads("leakage")
    resources:
        **STUDY.resources("leakage", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.leakage --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --effects {input.effects} "
        "--split {params.split} --threads {threads} --out {output} 2> {log}"
