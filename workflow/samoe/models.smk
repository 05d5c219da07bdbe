# The toy corpus, the dense source, upcycling, continued pretraining and the seed registry
# (SAMOE §3–§7, §2). Every job verifies its inputs against their manifests first.


rule samoe_corpus:
    output:
        **{k: PATHS[f"corpus_{k}"] for k in ("dense_train", "dense_val", "cpt_train", "vocab")},
        pools=PATHS["pools"],
        downstream=PATHS["downstream"],
        manifest=PATHS["corpus_manifest"],
    log:
        log_of("samoe_corpus"),
    benchmark:
        benchmark_of("samoe_corpus")
    params:
        cfg=lambda wildcards: as_json(STUDY.corpus_config()),
        out_dir=directory_of("manifest"),
    threads: STUDY.threads("samoe_corpus")
    resources:
        **STUDY.resources("samoe_corpus", mem_mb=2000, runtime=30),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.corpus "
        "--config-json {params.cfg:q} --out-dir {params.out_dir} "
        "2> {log}"


rule samoe_dense:
    wildcard_constraints:
        family=STUDY.pattern(STUDY.toy_families),
    input:
        corpus_manifest=PATHS["corpus_manifest"],
        train=PATHS["corpus_dense_train"],
        val=PATHS["corpus_dense_val"],
        vocab=PATHS["corpus_vocab"],
    output:
        checkpoint=PATHS["dense"],
        log=PATHS["dense_log"],
        manifest=PATHS["dense_manifest"],
    log:
        log_of("samoe_dense", "{family}"),
    benchmark:
        benchmark_of("samoe_dense", "{family}")
    params:
        cfg=json_param(STUDY.dense_run_config, "family"),
        corpus_dir=lambda wildcards, input: os.path.dirname(input.corpus_manifest),
    threads: STUDY.threads("samoe_dense")
    resources:
        **STUDY.resources("samoe_dense", mem_mb=2000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.dense "
        "--config-json {params.cfg:q} --corpus-dir {params.corpus_dir} "
        "--checkpoint {output.checkpoint} --log {output.log} --manifest {output.manifest} "
        "--threads {threads} 2> {log}"


# Paper scale: a Hub family's own corpus (its tokenizer, the three Hub corpora packed into a
# memory-mapped stream, its held-out pools).
rule samoe_hub_corpus:
    wildcard_constraints:
        family=STUDY.pattern(STUDY.hub_families),
    input:
        source=source_files,
    output:
        cpt_train=PATHS["hub_cpt_train"],
        cpt_train_meta=PATHS["hub_cpt_train_meta"],
        pools=PATHS["hub_pools"],
        manifest=PATHS["hub_corpus_manifest"],
    log:
        log_of("samoe_hub_corpus", "{family}"),
    benchmark:
        benchmark_of("samoe_hub_corpus", "{family}")
    params:
        cfg=json_param(STUDY.hub_corpus_config, "family"),
        out_dir=directory_of("manifest"),
    threads: STUDY.threads("samoe_hub_corpus")
    resources:
        **STUDY.resources("samoe_hub_corpus", mem_mb=8000, runtime=1440),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.hub_corpus "
        "--config-json {params.cfg:q} --out-dir {params.out_dir} "
        "--threads {threads} 2> {log}"


# Paper scale: the family's pinned Hub checkpoint instead of a toy dense training.
rule samoe_import_dense:
    wildcard_constraints:
        family=STUDY.pattern(STUDY.hub_families),
    input:
        source=source_files,
    output:
        checkpoint=PATHS["dense"],
        log=PATHS["dense_log"],
        manifest=PATHS["dense_manifest"],
    log:
        log_of("samoe_import_dense", "{family}"),
    benchmark:
        benchmark_of("samoe_import_dense", "{family}")
    params:
        cfg=json_param(STUDY.import_config, "family"),
    threads: STUDY.threads("samoe_import_dense")
    resources:
        **STUDY.resources("samoe_import_dense", mem_mb=8000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.import_dense --config-json {params.cfg:q} "
        "--checkpoint {output.checkpoint} --log {output.log} --manifest {output.manifest} "
        "2> {log}"


rule samoe_upcycle:
    input:
        dense=PATHS["dense"],
        dense_manifest=PATHS["dense_manifest"],
    output:
        step0=PATHS["step0"],
        init=PATHS["init_manifest"],
    log:
        log_of("samoe_upcycle", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_upcycle", "{family}-{variant}-s{seed}")
    params:
        cfg=json_param(STUDY.run_config, "family", "variant", "seed"),
    priority: chain_priority("samoe_upcycle")
    threads: STUDY.threads("samoe_upcycle")
    resources:
        **STUDY.resources("samoe_upcycle", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.upcycle "
        "--config-json {params.cfg:q} --dense {input.dense} "
        "--dense-manifest {input.dense_manifest} --out {output.step0} "
        "--init-manifest {output.init} 2> {log}"


rule samoe_train:
    input:
        step0=PATHS["step0"],
        init=PATHS["init_manifest"],
        corpus=corpus_file("cpt_train"),
        corpus_manifest=corpus_file("corpus_manifest"),
    output:
        checkpoint=PATHS["checkpoint"],
        log=PATHS["train_log"],
        manifest=PATHS["manifest"],
    log:
        log_of("samoe_train", "{family}-{variant}-s{seed}"),
    benchmark:
        benchmark_of("samoe_train", "{family}-{variant}-s{seed}")
    params:
        cfg=json_param(STUDY.run_config, "family", "variant", "seed"),
        corpus_dir=lambda wildcards, input: os.path.dirname(input.corpus_manifest),
        # not an output: a restarted job continues from it (src/headgeom/samoe/stages/train.py)
        resume_dir=lambda wildcards, output: os.path.join(
            os.path.dirname(output.checkpoint), "resume"
        ),
        # one process per GPU the job asks for (torchrun), else one
        launch=STUDY.train_launcher,
    priority: chain_priority("samoe_train")
    threads: STUDY.threads("samoe_train")
    resources:
        **STUDY.resources("samoe_train", mem_mb=3000, runtime=120),
    conda:
        "../../envs/headgeom.yaml"
    # several threads on a shared CPU: a waiting thread sleeps instead of spinning on the core
    # its siblings need (the arithmetic is the same; one thread never waits)
    shell:
        "OMP_WAIT_POLICY=PASSIVE exec {params.launch} -m headgeom.samoe.stages.train "
        "--config-json {params.cfg:q} --step0 {input.step0} "
        "--init-manifest {input.init} --corpus-dir {params.corpus_dir} "
        "--checkpoint {output.checkpoint} --train-log {output.log} --manifest {output.manifest} "
        "--resume-dir {params.resume_dir} --threads {threads} 2> {log}"


rule samoe_seeds:
    input:
        step0=per_run("step0", STUDY.runs),
        init=per_run("init_manifest", STUDY.runs),
        manifests=per_run("manifest", STUDY.runs),
        dense=[PATHS["dense_manifest"].format(family=f) for f in STUDY.families],
        pools=corpus_files_of("pools", STUDY.families),
        corpus_manifest=corpus_files_of("corpus_manifest", STUDY.families),
    output:
        seeds=PATHS["seeds"],
    log:
        log_of("samoe_seeds"),
    benchmark:
        benchmark_of("samoe_seeds")
    params:
        runs=as_json(STUDY.runs),
        dense=as_json({f: PATHS["dense_manifest"].format(family=f) for f in STUDY.families}),
    threads: STUDY.threads("samoe_seeds")
    resources:
        **STUDY.resources("samoe_seeds", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.seeds --runs-json {params.runs:q} --step0 {input.step0} "
        "--init-manifests {input.init} --manifests {input.manifests} "
        "--dense-manifests-json {params.dense:q} --pools {input.pools} "
        "--corpus-manifest {input.corpus_manifest} --out {output.seeds} 2> {log}"
