# One job per run for every task (as evaluate_clean): the checkpoint is verified and loaded
# once, and a job's start-up (mostly torch) is paid once, not once per task.
rule patch_heads:
    input:
        unpack(patch_means),  # patching.mode mean reads the run's means (docs §10.1)
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        effects=expand(PATHS["effects"], task=TASKS, allow_missing=True),
    log:
        log_of("patch_heads", "{model}-s{seed}"),
    benchmark:
        benchmark_of("patch_heads", "{model}-s{seed}")
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
        "python -m headgeom.heads.stages.patch_heads --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --splits {params.splits} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} "
        "--model-name {wildcards.model} --threads {threads} "
        "--seed {wildcards.seed} --mode {params.mode} {params.means} "
        "--out {output.effects} 2> {log}"


# Key/value-head patching (docs §10.1) of the imported causal LMs whose query heads share
# key/value heads (STUDY.grouped_query_runs; the default target asks for their files only),
# one job per run for every task, as patch_heads.
rule patch_kv_heads:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        kv_effects=expand(PATHS["kv_effects"], task=TASKS, allow_missing=True),
    log:
        log_of("patch_kv_heads", "{model}-s{seed}"),
    benchmark:
        benchmark_of("patch_kv_heads", "{model}-s{seed}")
    params:
        splits=",".join(STUDY.stage("patching")["splits"]),
        batch_size=STUDY.stage("patching")["batch_size"],
        max_rows=STUDY.stage("patching")["max_rows"],
    threads: STUDY.threads("patch_kv_heads")
    resources:
        **STUDY.resources("patch_kv_heads", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.patch_kv_heads --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --splits {params.splits} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} "
        "--model-name {wildcards.model} --threads {threads} "
        "--seed {wildcards.seed} --out {output.kv_effects} 2> {log}"
