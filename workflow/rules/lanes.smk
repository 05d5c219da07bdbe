rule lanes:
    input:
        heads=PATHS["heads"],
    output:
        PATHS["lanes"],
    log:
        log_of("lanes", "{model}-s{seed}-{task}"),
    benchmark:
        benchmark_of("lanes", "{model}-s{seed}-{task}")
    params:
        split=STUDY.stage("lanes")["split"],
        n_permutations=STUDY.stage("lanes")["n_permutations"],
        seed=STUDY.stage("lanes")["seed"],
    threads: STUDY.threads("lanes")
    resources:
        **STUDY.resources("lanes", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/lanes.py --heads {input.heads} --split {params.split} "
        "--n-permutations {params.n_permutations} --seed {params.seed} --out {output} 2> {log}"
