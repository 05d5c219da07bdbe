# Clamp analyses (docs §13.3, §15.3): one job per run of STUDY.run_set("clamps"),
# every task; checks C12 and C13 fail the job.
rule clamps:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        tasks=[PATHS["task"].format(task=t) for t in TASKS],
        heads=clamp_heads,
    output:
        pairs=PATHS["clamp_pairs"],
        paths=PATHS["clamp_paths"],
        lumped=PATHS["clamp_lumped"],
    log:
        log_of("clamps", "{model}-s{seed}"),
    benchmark:
        benchmark_of("clamps", "{model}-s{seed}")
    params:
        split=STUDY.stage("clamps")["split"],
        batch_size=STUDY.stage("clamps")["batch_size"],
        max_rows=STUDY.stage("clamps")["max_rows"],
    threads: STUDY.threads("clamps")
    resources:
        **STUDY.resources("clamps", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.clamps "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--tasks {input.tasks} --heads {input.heads} --split {params.split} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} --threads {threads} "
        "--out-pairs {output.pairs} --out-paths {output.paths} --out-lumped {output.lumped} "
        "2> {log}"
