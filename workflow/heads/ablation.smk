# Ablation modes and the block ablation atlas (docs §10.6): the means artifact and
# atlas per run, head patching in the extra modes (one job per run), concentration and lanes
# per mode (the concentration and lanes rules with a {mode} path component), the comparison.


rule ablation_atlas:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        val=model_corpus("val"),
        tasks=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        means=PATHS["ablation_means"],
        atlas=PATHS["ablation_atlas"],
    log:
        log_of("ablation_atlas", "{model}-s{seed}"),
    benchmark:
        benchmark_of("ablation_atlas", "{model}-s{seed}")
    params:
        n_mean=STUDY.stage("ablation")["n_mean_windows"],
        n_eval=STUDY.stage("ablation")["n_eval_windows"],
        batch_size=STUDY.stage("ablation")["batch_size"],
        work_mb=STUDY.stage("ablation")["work_mb"],
        n_retention=STUDY.stage("ablation")["n_retention_examples"],
    threads: STUDY.threads("ablation_atlas")
    resources:
        **STUDY.resources(
            "ablation_atlas", mem_mb=STUDY.stage("ablation")["work_mb"] + 2000, runtime=20
        ),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.ablation_atlas --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --val-tokens {input.val} --tasks {input.tasks} "
        "--n-mean-windows {params.n_mean} --n-eval-windows {params.n_eval} "
        "--batch-size {params.batch_size} --work-mb {params.work_mb} "
        "--n-retention {params.n_retention} --threads {threads} "
        "--out-means {output.means} --out-atlas {output.atlas} 2> {log}"


rule patch_modes:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        means=PATHS["ablation_means"],
        tasks=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        [
            PATHS["effects_mode"].replace("{task}", t).replace("{mode}", m)
            for t in TASKS
            for m in STUDY.extra_modes
        ],
    log:
        log_of("patch_modes", "{model}-s{seed}"),
    benchmark:
        benchmark_of("patch_modes", "{model}-s{seed}")
    params:
        splits=",".join(STUDY.mode_splits),
        batch_size=STUDY.stage("patching")["batch_size"],
        max_rows=STUDY.stage("patching")["max_rows"],
        tasks=mode_task_args,
        outs=mode_outs,
    threads: STUDY.threads("patch_modes")
    resources:
        **STUDY.resources("patch_modes", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.patch_modes "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--means {input.means} {params.tasks} {params.outs} --splits {params.splits} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} "
        "--model-name {wildcards.model} --seed {wildcards.seed} --threads {threads} 2> {log}"


use rule concentration as concentration_mode with:
    input:
        effects=PATHS["effects_mode"],
    output:
        summary=PATHS["summary_mode"],
        heads=PATHS["heads_mode"],
        robustness=PATHS["robustness_mode"],
        conditions=PATHS["conditions_mode"],
        logo=PATHS["logo_mode"],
    log:
        log_of("concentration", "{model}-s{seed}-{task}-{mode}"),
    benchmark:
        benchmark_of("concentration", "{model}-s{seed}-{task}-{mode}")


use rule lanes as lanes_mode with:
    input:
        heads=PATHS["heads_mode"],
    output:
        PATHS["lanes_mode"],
    log:
        log_of("lanes", "{model}-s{seed}-{task}-{mode}"),
    benchmark:
        benchmark_of("lanes", "{model}-s{seed}-{task}-{mode}")


rule compare_modes:
    input:
        unpack(compare_modes_inputs),
    output:
        PATHS["ablation_modes"],
    log:
        log_of("compare_modes", "compare_modes"),
    benchmark:
        benchmark_of("compare_modes", "compare_modes")
    params:
        split=STUDY.stage("concentration")["split"],
        base_mode=STUDY.patch_mode,
        inputs=compare_modes_args,
    threads: STUDY.threads("compare_modes")
    resources:
        **STUDY.resources("compare_modes", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.compare_modes "
        "--split {params.split} --base-mode {params.base_mode} "
        "{params.inputs} --out {output} 2> {log}"
