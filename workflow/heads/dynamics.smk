# Training dynamics (docs §13.2, §13.4, §14.2, §14.4): the stages of the final
# checkpoint rerun on each intermediate checkpoint of the timeline runs
# (STUDY.run_set("dynamics_timeline")), SVA only, as the same rules with a {step} wildcard: each checkpoint is
# verified against its own manifest (checkpoints/step<NNNNNN>.manifest.json) by the reused
# script. Rule dynamics gathers them with τ and the V-gradient traces; rule scalar_ablation
# (§14.5) edits copies of the final checkpoint. Figure 6a–c and the tables: tables.smk.


wildcard_constraints:
    step=r"\d{6}",
    edit=r"scalar|random\d+",


# step rules and rule dynamics run on the timeline runs' models only
TIMELINE_MODELS = STUDY.model_pattern(
    dict.fromkeys(m for m, _ in STUDY.run_set("dynamics_timeline"))
)


use rule evaluate_clean as evaluate_step with:
    wildcard_constraints:
        model=TIMELINE_MODELS,
    input:
        checkpoint=PATHS["step_checkpoint"],
        manifest=PATHS["step_manifest"],
        task=PATHS["task"],
    output:
        PATHS["step_eval"],
    log:
        log_of("evaluate_step", "{model}-s{seed}-step{step}-{task}"),
    benchmark:
        benchmark_of("evaluate_step", "{model}-s{seed}-step{step}-{task}")


# Λ reads the lanes split only (discovery): the step patches that split alone.
use rule patch_heads as patch_step with:
    wildcard_constraints:
        model=TIMELINE_MODELS,
    input:
        checkpoint=PATHS["step_checkpoint"],
        manifest=PATHS["step_manifest"],
        task=PATHS["task"],
    output:
        effects=PATHS["step_effects"],
    log:
        log_of("patch_step", "{model}-s{seed}-step{step}-{task}"),
    benchmark:
        benchmark_of("patch_step", "{model}-s{seed}-step{step}-{task}")
    params:
        splits=STUDY.stage("lanes")["split"],
        batch_size=STUDY.stage("patching")["batch_size"],
        max_rows=STUDY.stage("patching")["max_rows"],


use rule concentration as concentration_step with:
    input:
        effects=PATHS["step_effects"],
    output:
        summary=PATHS["step_summary"],
        heads=PATHS["step_heads"],
        robustness=PATHS["step_robustness"],
        conditions=PATHS["step_conditions"],
        logo=PATHS["step_logo"],
    log:
        log_of("concentration_step", "{model}-s{seed}-step{step}-{task}"),
    benchmark:
        benchmark_of("concentration_step", "{model}-s{seed}-step{step}-{task}")
    params:
        **RESAMPLING,
        split=STUDY.stage("lanes")["split"],
        index_meaningful=index_meaningful,


use rule lanes as lanes_step with:
    input:
        heads=PATHS["step_heads"],
    output:
        PATHS["step_lanes"],
    log:
        log_of("lanes_step", "{model}-s{seed}-step{step}-{task}"),
    benchmark:
        benchmark_of("lanes_step", "{model}-s{seed}-step{step}-{task}")


use rule geometry_stats as geometry_step with:
    wildcard_constraints:
        model=TIMELINE_MODELS,
    input:
        checkpoint=PATHS["step_checkpoint"],
        manifest=PATHS["step_manifest"],
    output:
        pk=PATHS["step_pk"],
        summary=PATHS["step_geometry_summary"],
        heads=PATHS["step_geometry_heads"],
    log:
        log_of("geometry_step", "{model}-s{seed}-step{step}"),
    benchmark:
        benchmark_of("geometry_step", "{model}-s{seed}-step{step}")


rule dynamics:
    wildcard_constraints:
        model=TIMELINE_MODELS,
    input:
        unpack(dynamics_inputs),
    output:
        timeline=PATHS["timeline"],
        tau=PATHS["tau"],
        value_gradients=PATHS["value_gradients"],
    log:
        log_of("dynamics", "{model}-s{seed}"),
    benchmark:
        benchmark_of("dynamics", "{model}-s{seed}")
    params:
        checkpoint_steps=" ".join(map(str, STUDY.dynamics_checkpoint_steps)),
        timeline_steps=" ".join(map(str, STUDY.timeline_steps)),
        value_gradient_steps=" ".join(map(str, STUDY.stage("dynamics")["value_gradient_steps"])),
        sequences=STUDY.stage("dynamics")["value_gradient_sequences"],
        backward=STUDY.stage("dynamics")["backward_sequences"],
        lane_split=STUDY.stage("lanes")["split"],
    threads: STUDY.threads("dynamics")
    resources:
        **STUDY.resources("dynamics", mem_mb=4000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.dynamics "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--checkpoint-steps {params.checkpoint_steps} --step-checkpoints {input.step_checkpoints} "
        "--step-manifests {input.step_manifests} --timeline-steps {params.timeline_steps} "
        "--value-gradient-steps {params.value_gradient_steps} --sequences {params.sequences} "
        "--backward-sequences {params.backward} --task {input.task} --val-tokens {input.val} --heads {input.heads} "
        "--lane-split {params.lane_split} --evals {input.evals} --lanes {input.lanes} "
        "--geometry {input.geometry} --threads {threads} --out-timeline {output.timeline} "
        "--out-tau {output.tau} --out-value-gradients {output.value_gradients} 2> {log}"


# The scalar-part ablation (docs §14.5): edited copies of the final checkpoint, each with a
# manifest naming its parent, evaluated on every task (evaluation split).
rule scalar_ablation:
    wildcard_constraints:
        model=STUDY.model_pattern(dict.fromkeys(m for m, _ in STUDY.run_set("dynamics_ablation"))),
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        tasks=[PATHS["task"].format(task=t) for t in TASKS],
    output:
        ablation=PATHS["scalar_ablation"],
        checkpoints=expand(
            PATHS["scalar_ablation_checkpoint"], edit=STUDY.ablation_edits(), allow_missing=True
        ),
        manifests=expand(
            PATHS["scalar_ablation_manifest"], edit=STUDY.ablation_edits(), allow_missing=True
        ),
    log:
        log_of("scalar_ablation", "{model}-s{seed}"),
    benchmark:
        benchmark_of("scalar_ablation", "{model}-s{seed}")
    params:
        layers=lambda wildcards: " ".join(map(str, STUDY.ablation_layers(wildcards.model))),
        draws=STUDY.stage("dynamics")["ablation_draws"],
        seed=STUDY.stage("dynamics")["ablation_seed"],
    threads: STUDY.threads("scalar_ablation")
    resources:
        **STUDY.resources("scalar_ablation", mem_mb=4000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.scalar_ablation "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--tasks {input.tasks} --layers {params.layers} --draws {params.draws} "
        "--seed {params.seed} --threads {threads} --out {output.ablation} "
        "--out-checkpoints {output.checkpoints} --out-manifests {output.manifests} 2> {log}"
