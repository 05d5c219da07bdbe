# One job per run for every task (as concentration): the interpreter and its imports start once.
rule lanes:
    input:
        heads=[PATHS["heads"].replace("{task}", t) for t in TASKS],
    output:
        expand(PATHS["lanes"], task=TASKS, allow_missing=True),
    log:
        log_of("lanes", "{model}-s{seed}"),
    benchmark:
        benchmark_of("lanes", "{model}-s{seed}")
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
        "python -m headgeom.heads.stages.lanes --heads {input.heads} --split {params.split} "
        "--n-permutations {params.n_permutations} --seed {params.seed} --out {output} 2> {log}"
