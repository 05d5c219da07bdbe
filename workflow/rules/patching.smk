rule patch_heads:
    input:
        unpack(patch_means),  # patching.mode mean reads the run's means (docs §10.1)
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=PATHS["task"],
    output:
        effects=PATHS["effects"],
    log:
        log_of("patch_heads", "{model}-s{seed}-{task}"),
    benchmark:
        benchmark_of("patch_heads", "{model}-s{seed}-{task}")
    params:
        splits=",".join(STUDY.stage("patching")["splits"]),
        batch_size=STUDY.stage("patching")["batch_size"],
        max_rows=STUDY.stage("patching")["max_rows"],
        mode=STUDY.patch_mode,
        means=means_arg,
    threads: STUDY.threads("patch_heads")
    resources:
        **STUDY.resources("patch_heads", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/patch_heads.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --splits {params.splits} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} "
        "--model-name {wildcards.model} --threads {threads} "
        "--seed {wildcards.seed} --task-name {wildcards.task} --mode {params.mode} {params.means} "
        "--out {output.effects} 2> {log}"
