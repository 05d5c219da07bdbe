# Attribution patching beside exact (docs §10.1): AtP's first-order estimate of every head's
# patch (two forwards and one backward per batch) next to the exact effects of patch_heads, on
# the concentration split, with their rank correlation, top-k overlap and largest misses. One
# job per run for every task (as patch_heads): the checkpoint is verified and loaded once.
rule atp_agreement:
    input:
        unpack(patch_means),  # mean ablation: AtP estimates the patch the effects made
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=[PATHS["task"].format(task=t) for t in TASKS],
        effects=[PATHS["effects"].replace("{task}", t) for t in TASKS],
    output:
        agreement=expand(PATHS["atp_agreement"], task=TASKS, allow_missing=True),
        heads=expand(PATHS["atp_heads"], task=TASKS, allow_missing=True),
        examples=expand(PATHS["atp_examples"], task=TASKS, allow_missing=True),
        figure=PATHS["atp_figure"],
    log:
        log_of("atp_agreement", "{model}-s{seed}"),
    benchmark:
        benchmark_of("atp_agreement", "{model}-s{seed}")
    params:
        split=STUDY.stage("concentration")["split"],
        batch_size=STUDY.stage("patching")["batch_size"],
        means=means_arg,
    threads: STUDY.threads("atp_agreement")
    resources:
        **STUDY.resources("atp_agreement", mem_mb=4000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.atp_agreement --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --effects {input.effects} "
        "--split {params.split} --batch-size {params.batch_size} "
        "--model-name {wildcards.model} --seed {wildcards.seed} --threads {threads} "
        "{params.means} --out-agreement {output.agreement} --out-heads {output.heads} "
        "--out-examples {output.examples} --out-figure {output.figure} 2> {log}"
