rule train:
    input:
        train=CORPUS["train"],
        val=CORPUS["val"],
        vocab=CORPUS["vocab"],
        corpus_manifest=CORPUS["manifest"],
    output:
        checkpoint=f"{RESULTS}/models/{{model}}/s{{seed}}/model.safetensors",
        log=f"{RESULTS}/models/{{model}}/s{{seed}}/train_log.parquet",
    log:
        f"{RESULTS}/logs/train/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}-s{{seed}}.tsv"
    params:
        cfg=train_config_json,
    threads: resource("train", "threads", 1)
    resources:
        mem_mb=resource("train", "mem_mb", 4000),
        runtime=resource("train", "runtime", 120),
        gpu=resource("train", "gpu", 0),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/train.py --config-json {params.cfg:q} --threads {threads} "
        "--train-tokens {input.train} --val-tokens {input.val} --vocab {input.vocab} "
        "--corpus-manifest {input.corpus_manifest} "
        "--checkpoint {output.checkpoint} --log {output.log} 2> {log}"


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
    resources:
        mem_mb=resource("hash_checkpoint", "mem_mb", 1000),
        runtime=resource("hash_checkpoint", "runtime", 10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/hash_checkpoint.py --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --train-log {input.train_log} "
        "--corpus-manifest {input.corpus_manifest} --out {output.manifest} 2> {log}"
