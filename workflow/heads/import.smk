# Imported models: a checkpoint the user brings (models.<name>.import) instead of a training
# recipe. import_model writes what train + hash_checkpoint write for a trained model (the
# checkpoint, its manifest, a one-row run log), so every analysis reads it unchanged and
# load_verified gates it by the same hashes. Nothing is downloaded: the files are the user's.


rule import_model:
    wildcard_constraints:
        model=STUDY.model_pattern(STUDY.imported_models),
    input:
        files=import_files,
        val=model_corpus("val"),
    output:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        log=PATHS["train_log"],
    log:
        log_of("import_model", "{model}-s{seed}"),
    benchmark:
        benchmark_of("import_model", "{model}-s{seed}")
    params:
        run=json_param(STUDY.import_config, "model", "seed"),
        n_ctx=STUDY.config["architecture"]["n_ctx"],
        batch_size=STUDY.config["training"]["eval_batch_size"],
    threads: STUDY.threads("import_model")
    resources:
        **STUDY.resources("import_model", mem_mb=4000, runtime=20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.import_model "
        "--run-json {params.run:q} --val-tokens {input.val} "
        "--n-ctx {params.n_ctx} --batch-size {params.batch_size} --threads {threads} "
        "--checkpoint {output.checkpoint} --manifest {output.manifest} "
        "--log {output.log} 2> {log}"
