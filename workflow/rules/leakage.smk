rule leakage:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=PATHS["task"],
        effects=PATHS["effects"],
    output:
        PATHS["leakage"],
    log:
        log_of("leakage", "{model}-s{seed}-{task}"),
    benchmark:
        benchmark_of("leakage", "{model}-s{seed}-{task}")
    params:
        split=STUDY.stage("leakage")["split"],
    threads: STUDY.threads("leakage")
    resources:
        **STUDY.resources("leakage", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/leakage.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --effects {input.effects} "
        "--split {params.split} --threads {threads} --out {output} 2> {log}"
