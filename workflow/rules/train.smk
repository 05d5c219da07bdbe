# Training (METHODS §7). Besides the final checkpoint and log, the train rule writes the
# intermediate checkpoints of training.checkpoint_steps (each with its manifest) and keeps a
# resumable state in s<seed>/resume/ (not an output: a restarted job continues from it to
# the same bytes; train.py deletes it when done).
rule train:
    input:
        train=CORPUS["train"],
        val=CORPUS["val"],
        vocab=CORPUS["vocab"],
        corpus_manifest=CORPUS["manifest"],
    output:
        checkpoint=f"{RESULTS}/models/{{model}}/s{{seed}}/model.safetensors",
        log=f"{RESULTS}/models/{{model}}/s{{seed}}/train_log.parquet",
        intermediate=intermediate_checkpoints(),
    log:
        f"{RESULTS}/logs/train/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}-s{{seed}}.tsv"
    params:
        cfg=train_config_json,
        checkpoint_dir=checkpoint_dir,
        resume_dir=resume_dir,
    threads: cpus("train")
    resources:
        mem_mb=resource("train", "mem_mb", 4000),
        runtime=resource("train", "runtime", 120),
        **placement("train"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/train.py --config-json {params.cfg:q} --threads {threads} "
        "--train-tokens {input.train} --val-tokens {input.val} --vocab {input.vocab} "
        "--corpus-manifest {input.corpus_manifest} "
        "--checkpoint {output.checkpoint} --log {output.log} "
        "--checkpoint-dir {params.checkpoint_dir} --resume-dir {params.resume_dir} 2> {log}"


rule hash_checkpoint:
    input:
        checkpoint=checkpoint_path,
        train_log=train_log_path,
        corpus_manifest=CORPUS["manifest"],
    output:
        manifest=f"{RESULTS}/models/{{model}}/s{{seed}}/manifest.json",
    log:
        f"{RESULTS}/logs/hash_checkpoint/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/hash_checkpoint/{{model}}-s{{seed}}.tsv"
    params:
        cfg=train_config_json,
    threads: cpus("hash_checkpoint")
    resources:
        mem_mb=resource("hash_checkpoint", "mem_mb", 1000),
        runtime=resource("hash_checkpoint", "runtime", 10),
        **placement("hash_checkpoint"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/hash_checkpoint.py --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --train-log {input.train_log} "
        "--corpus-manifest {input.corpus_manifest} --out {output.manifest} 2> {log}"
