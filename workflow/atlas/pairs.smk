# Two checkpoints of one lineage (docs/atlas.md, Two checkpoints): for each pair of config
# `pairs`, its windows and probe items cut with A's tokenizer, B fine-tuned from A where the
# pair asks for it, and the views: the blend dial, grafts, drift, low-rank deltas, a report.


wildcard_constraints:
    pair=STUDY.pattern(STUDY.pairs),


rule atlas_pair_inputs:
    input:
        model=lambda wildcards: STUDY.pair_files(wildcards.pair, "a"),
    output:
        windows=PATHS["pair_windows"],
        probes=PATHS["pair_items"],
    log:
        log_of("atlas_pair_inputs", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_inputs", "{pair}")
    params:
        cfg=lambda wildcards: as_json(STUDY.pair_inputs_config(wildcards.pair)),
    threads: STUDY.threads("atlas_pair_inputs")
    resources:
        **STUDY.resources("atlas_pair_inputs", mem_mb=2000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.inputs --config-json {params.cfg:q} "
        "--out-windows {output.windows} --out-probes {output.probes} 2> {log}"


rule atlas_pair_fine_tune:
    wildcard_constraints:
        pair=STUDY.pattern(STUDY.fine_tuned_pairs),
    input:
        model=lambda wildcards: STUDY.pair_files(wildcards.pair, "a"),
    output:
        checkpoint=PATHS["pair_tuned"],
        manifest=PATHS["pair_tuned_manifest"],
    log:
        log_of("atlas_pair_fine_tune", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_fine_tune", "{pair}")
    params:
        cfg=lambda wildcards: as_json(STUDY.pair_fine_tune_config(wildcards.pair)),
    threads: STUDY.threads("atlas_pair_fine_tune")
    resources:
        **STUDY.resources("atlas_pair_fine_tune", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_fine_tune --config-json {params.cfg:q} "
        "--threads {threads} --out-checkpoint {output.checkpoint} "
        "--out-manifest {output.manifest} 2> {log}"


rule atlas_pair_blend:
    input:
        unpack(pair_inputs),
    output:
        blend=PATHS["pair_blend"],
        probes=PATHS["pair_probes"],
    log:
        log_of("atlas_pair_blend", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_blend", "{pair}")
    params:
        cfg=pair_cfg,
    threads: STUDY.threads("atlas_pair_blend")
    resources:
        **STUDY.resources("atlas_pair_blend", mem_mb=6000, runtime=120),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_blend --config-json {params.cfg:q} "
        "--windows {input.windows} --probes {input.probes} --threads {threads} "
        "--out-blend {output.blend} --out-probes {output.probes} 2> {log}"


rule atlas_pair_grafts:
    input:
        unpack(pair_inputs),
    output:
        PATHS["pair_grafts"],
    log:
        log_of("atlas_pair_grafts", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_grafts", "{pair}")
    params:
        cfg=pair_cfg,
    threads: STUDY.threads("atlas_pair_grafts")
    resources:
        **STUDY.resources("atlas_pair_grafts", mem_mb=6000, runtime=120),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_grafts --config-json {params.cfg:q} "
        "--windows {input.windows} --probes {input.probes} --threads {threads} "
        "--out {output} 2> {log}"


rule atlas_pair_lowrank:
    input:
        unpack(pair_inputs),
    output:
        PATHS["pair_lowrank"],
    log:
        log_of("atlas_pair_lowrank", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_lowrank", "{pair}")
    params:
        cfg=pair_cfg,
    threads: STUDY.threads("atlas_pair_lowrank")
    resources:
        **STUDY.resources("atlas_pair_lowrank", mem_mb=6000, runtime=120),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_lowrank --config-json {params.cfg:q} "
        "--windows {input.windows} --probes {input.probes} --threads {threads} "
        "--out {output} 2> {log}"


rule atlas_pair_drift:
    input:
        a=lambda wildcards: STUDY.pair_files(wildcards.pair, "a"),
        b=lambda wildcards: STUDY.pair_files(wildcards.pair, "b"),
    output:
        PATHS["pair_drift"],
    log:
        log_of("atlas_pair_drift", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_drift", "{pair}")
    params:
        cfg=lambda wildcards: as_json(STUDY.pair_drift_config(wildcards.pair)),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_drift --config-json {params.cfg:q} "
        "--out {output} 2> {log}"


rule atlas_pair_report:
    input:
        blend=PATHS["pair_blend"],
        probes=PATHS["pair_probes"],
        drift=PATHS["pair_drift"],
        grafts=PATHS["pair_grafts"],
        lowrank=PATHS["pair_lowrank"],
    output:
        PATHS["pair_report"],
    log:
        log_of("atlas_pair_report", "{pair}"),
    benchmark:
        benchmark_of("atlas_pair_report", "{pair}")
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.pair_report --name {wildcards.pair} "
        "--blend {input.blend} --probes {input.probes} --drift {input.drift} "
        "--grafts {input.grafts} --lowrank {input.lowrank} --out {output} 2> {log}"


localrules:
    atlas_pair_drift,
    atlas_pair_report,
