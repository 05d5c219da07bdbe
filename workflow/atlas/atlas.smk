# The edit atlas of one model (docs/atlas.md): its inputs (corpora cut with its tokenizer,
# the skills' items), the per-layer profile, the sweep of edits in shards, the merged tables.


rule atlas_inputs:
    input:
        model=STUDY.model_files(),
    output:
        windows=PATHS["windows"],
        probes=PATHS["probes"],
    log:
        log_of("atlas_inputs"),
    benchmark:
        benchmark_of("atlas_inputs")
    params:
        cfg=as_json(STUDY.inputs_config()),
    threads: STUDY.threads("atlas_inputs")
    resources:
        **STUDY.resources("atlas_inputs", mem_mb=2000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.inputs --config-json {params.cfg:q} "
        "--out-windows {output.windows} --out-probes {output.probes} 2> {log}"


rule atlas_profile:
    input:
        model=STUDY.model_files(),
        windows=PATHS["windows"],
    output:
        PATHS["profile"],
    log:
        log_of("atlas_profile"),
    benchmark:
        benchmark_of("atlas_profile")
    params:
        cfg=as_json(STUDY.profile_config()),
    threads: STUDY.threads("atlas_profile")
    resources:
        **STUDY.resources("atlas_profile", mem_mb=4000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.profile --config-json {params.cfg:q} "
        "--windows {input.windows} --threads {threads} --out {output} 2> {log}"


rule atlas_sweep:
    input:
        model=STUDY.model_files(),
        windows=PATHS["windows"],
        probes=PATHS["probes"],
    output:
        effects=PATHS["effects_shard"],
        retention=PATHS["retention_shard"],
    log:
        log_of("atlas_sweep", "{shard}"),
    benchmark:
        benchmark_of("atlas_sweep", "{shard}")
    params:
        cfg=as_json(STUDY.sweep_config()),
    threads: STUDY.threads("atlas_sweep")
    resources:
        **STUDY.resources("atlas_sweep", mem_mb=6000, runtime=240),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.sweep --config-json {params.cfg:q} "
        "--windows {input.windows} --probes {input.probes} --shard {wildcards.shard} "
        "--threads {threads} --out-effects {output.effects} "
        "--out-retention {output.retention} 2> {log}"


rule atlas_report:
    input:
        effects=per_shard("effects_shard"),
        retention=per_shard("retention_shard"),
        profile=PATHS["profile"],
    output:
        effects=PATHS["effects"],
        retention=PATHS["retention"],
        summary=PATHS["summary"],
        report=PATHS["report"],
    log:
        log_of("atlas_report"),
    benchmark:
        benchmark_of("atlas_report")
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.report --effects {input.effects} "
        "--retention {input.retention} --profile {input.profile} --top 15 "
        "--out-effects {output.effects} --out-retention {output.retention} "
        "--out-summary {output.summary} --out-report {output.report} 2> {log}"
