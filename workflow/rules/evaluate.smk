rule evaluate_clean:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=PATHS["task"],
    output:
        PATHS["eval"],
    log:
        log_of("evaluate_clean", "{model}-s{seed}-{task}"),
    benchmark:
        benchmark_of("evaluate_clean", "{model}-s{seed}-{task}")
    threads: STUDY.threads("evaluate_clean")
    resources:
        **STUDY.resources("evaluate_clean", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/evaluate_clean.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --threads {threads} "
        "--out {output} 2> {log}"
