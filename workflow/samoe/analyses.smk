# The per-run analyses (SAMOE §10–§12): the audited targets of each family, quality of every
# run, and one clean capture of every state run (state geometry, local suppression, ledger).
# Every analysis that loads a checkpoint runs on config `analysis_device` (--device; auto =
# CUDA when the job sees one, else the CPU); config resources give it a GPU (samoe-paper.yaml).


rule samoe_targets:
    input:
        pools=corpus_file("pools"),
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        targets=PATHS["targets"],
    log:
        log_of("samoe_targets", "{family}"),
    benchmark:
        benchmark_of("samoe_targets", "{family}")
    params:
        layers=lambda wildcards: as_json(STUDY.target_layers(wildcards.family)),
    threads: 1
    resources:
        **STUDY.resources("samoe_targets", mem_mb=1000, runtime=5),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.targets "
        "--family {wildcards.family} --layers-json {params.layers:q} "
        "--pools {input.pools} --corpus-manifest {input.corpus_manifest} "
        "--out {output.targets} 2> {log}"


rule samoe_quality:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        pools=corpus_file("pools"),
        downstream=downstream_file,
        corpus_manifest=corpus_file("corpus_manifest"),
        dense=dense_files,
    output:
        quality=PATHS["quality"],
    log:
        log_of("samoe_quality", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_quality", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        device=STUDY.analysis_device,
        batch=STUDY.batch_flag,
        suite=downstream_flag,
        dense=dense_flag,
    priority: chain_priority("samoe_quality")
    threads: STUDY.threads("samoe_quality")
    resources:
        **STUDY.resources("samoe_quality", mem_mb=2000, runtime=20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.quality "
        "--run-json {params.run:q} --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --pools {input.pools} {params.suite} {input.downstream} "
        "{params.dense} --corpus-manifest {input.corpus_manifest} --out {output.quality} "
        "--threads {threads} --device {params.device} {params.batch} 2> {log}"


# Paper scale: a Hub run's downstream suite through lm-evaluation-harness at the pinned commit,
# in the harness's own environment (envs/lm-eval.yaml); samoe_quality reads its accuracies.
rule samoe_harness:
    wildcard_constraints:
        family=STUDY.pattern(STUDY.harness_families),
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        corpus_manifest=PATHS["hub_corpus_manifest"],
    output:
        harness=PATHS["harness"],
    log:
        log_of("samoe_harness", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_harness", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        cfg=as_json(STUDY.config["downstream"]),
        device=STUDY.analysis_device,
    threads: STUDY.threads("samoe_harness")
    resources:
        **STUDY.resources("samoe_harness", mem_mb=16000, runtime=120),
    conda:
        "../../envs/lm-eval.yaml"
    shell:
        "python -m headgeom.samoe.stages.harness "
        "--run-json {params.run:q} --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --corpus-manifest {input.corpus_manifest} "
        "--downstream-json {params.cfg:q} --out {output.harness} --threads {threads} "
        "--device {params.device} 2> {log}"


rule samoe_capture:
    wildcard_constraints:
        variant="latest|persistent",
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        pools=corpus_file("pools"),
        targets=PATHS["targets"],
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        state_geometry=PATHS["state_geometry"],
        local_suppression=PATHS["local_suppression"],
        history=PATHS["history"],
        history_pool=PATHS["history_pool"],
    log:
        log_of("samoe_capture", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_capture", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        cfg=json_param(STUDY.analysis_config, "family"),
        device=STUDY.analysis_device,
        batch=STUDY.batch_flag,
    priority: chain_priority("samoe_capture")
    threads: STUDY.threads("samoe_capture")
    resources:
        **STUDY.resources("samoe_capture", mem_mb=3000, runtime=20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.capture "
        "--run-json {params.run:q} --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} --pools {input.pools} "
        "--targets {input.targets} --corpus-manifest {input.corpus_manifest} "
        "--state-geometry {output.state_geometry} "
        "--local-suppression {output.local_suppression} --history {output.history} "
        "--history-pool {output.history_pool} "
        "--threads {threads} --device {params.device} {params.batch} 2> {log}"


rule samoe_probes:
    wildcard_constraints:
        variant="latest|persistent",
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        pools=corpus_file("pools"),
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        probes=PATHS["probes"],
    log:
        log_of("samoe_probes", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_probes", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        cfg=json_param(STUDY.analysis_config, "family"),
        device=STUDY.analysis_device,
        batch=STUDY.batch_flag,
    priority: chain_priority("samoe_probes")
    threads: STUDY.threads("samoe_probes")
    resources:
        **STUDY.resources("samoe_probes", mem_mb=3000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    # numpy's BLAS spins as many threads as cores unless told: the job's share only
    shell:
        "OPENBLAS_NUM_THREADS={threads} OMP_NUM_THREADS={threads} "
        "python -m headgeom.samoe.stages.probes "
        "--run-json {params.run:q} --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} --pools {input.pools} "
        "--corpus-manifest {input.corpus_manifest} --out {output.probes} "
        "--threads {threads} --device {params.device} {params.batch} 2> {log}"


rule samoe_interventions:
    wildcard_constraints:
        variant="latest|persistent",
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        pools=corpus_file("pools"),
        targets=PATHS["targets"],
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        interventions=PATHS["interventions"],
        rankings=PATHS["rankings"],
    log:
        log_of("samoe_interventions", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_interventions", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        cfg=json_param(STUDY.analysis_config, "family"),
        device=STUDY.analysis_device,
        batch=STUDY.batch_flag,
    priority: chain_priority("samoe_interventions")
    threads: STUDY.threads("samoe_interventions")
    resources:
        **STUDY.resources("samoe_interventions", mem_mb=3000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.interventions "
        "--run-json {params.run:q} --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} --pools {input.pools} "
        "--targets {input.targets} --corpus-manifest {input.corpus_manifest} "
        "--out {output.interventions} --rankings {output.rankings} --threads {threads} "
        "--device {params.device} {params.batch} 2> {log}"


rule samoe_li:
    wildcard_constraints:
        variant="ordinary",
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        pools=corpus_file("pools"),
        targets=PATHS["targets"],
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        li=PATHS["li"],
        rankings=PATHS["li_rankings"],
    log:
        log_of("samoe_li", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_li", "{family}-{variant}-s{seed}")
    params:
        run=run_json,
        cfg=json_param(STUDY.analysis_config, "family"),
        device=STUDY.analysis_device,
        batch=STUDY.batch_flag,
    priority: chain_priority("samoe_li")
    threads: STUDY.threads("samoe_li")
    resources:
        **STUDY.resources("samoe_li", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.li --run-json {params.run:q} --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} --pools {input.pools} "
        "--targets {input.targets} --corpus-manifest {input.corpus_manifest} "
        "--out {output.li} --rankings {output.rankings} --threads {threads} "
        "--device {params.device} {params.batch} 2> {log}"


# Times of one family's ranking_seed checkpoints (descriptive, SAMOE §16): one job, alone on
# its threads, so its three variants are timed under the same load.
rule samoe_audit_cost:
    input:
        checkpoints=lambda w: cost_runs("checkpoint", w.family),
        manifests=lambda w: cost_runs("manifest", w.family),
        pools=corpus_file("pools"),
        targets=PATHS["targets"],
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        audit_cost=PATHS["audit_cost"],
        runtime=PATHS["runtime"],
    log:
        log_of("samoe_audit_cost", "{family}"),
    benchmark:
        benchmark_of("samoe_audit_cost", "{family}")
    params:
        seed=STUDY.config["interventions"]["ranking_seed"],
        device=STUDY.analysis_device,
    threads: STUDY.threads("samoe_audit_cost")
    resources:
        **STUDY.resources("samoe_audit_cost", mem_mb=3000, runtime=20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.audit_cost "
        "--family {wildcards.family} --seed {params.seed} "
        "--checkpoints {input.checkpoints} --manifests {input.manifests} "
        "--pools {input.pools} --targets {input.targets} "
        "--corpus-manifest {input.corpus_manifest} --audit-cost {output.audit_cost} "
        "--runtime {output.runtime} --threads {threads} --device {params.device} 2> {log}"
