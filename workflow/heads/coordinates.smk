# Coordinate concentration (docs §15.2): one job per run of STUDY.run_set("coordinates"),
# every task of coordinates.tasks (the best head's layer of each, directions selected on validation).
rule coordinates:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        tasks=[PATHS["task"].format(task=t) for t in STUDY.stage("coordinates")["tasks"]],
        heads=coordinate_heads,
    output:
        coordinates=PATHS["coordinates"],
        directions=PATHS["coordinate_directions"],
    log:
        log_of("coordinates", "{model}-s{seed}"),
    benchmark:
        benchmark_of("coordinates", "{model}-s{seed}")
    params:
        n_sets=STUDY.stage("coordinates")["n_random_sets"],
        null_seed=STUDY.stage("coordinates")["null_seed"],
        rotation_seed=STUDY.stage("coordinates")["rotation_seed"],
        batch_size=STUDY.stage("coordinates")["batch_size"],
        max_rows=STUDY.stage("coordinates")["max_rows"],
    threads: STUDY.threads("coordinates")
    resources:
        **STUDY.resources("coordinates", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.coordinates "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--tasks {input.tasks} --heads {input.heads} --n-random-sets {params.n_sets} "
        "--null-seed {params.null_seed} --rotation-seed {params.rotation_seed} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} --threads {threads} "
        "--out {output.coordinates} --out-directions {output.directions} 2> {log}"
