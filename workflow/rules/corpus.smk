rule tokenize_corpus:
    output:
        train=CORPUS["train"],
        val=CORPUS["val"],
        vocab=CORPUS["vocab"],
        manifest=CORPUS["manifest"],
    log:
        f"{RESULTS}/logs/tokenize_corpus.log",
    benchmark:
        f"{RESULTS}/benchmarks/tokenize_corpus.tsv"
    params:
        cfg=corpus_config_json,
    threads: 1
    resources:
        mem_mb=resource("tokenize_corpus", "mem_mb", 4000),
        runtime=resource("tokenize_corpus", "runtime", 60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/tokenize_corpus.py --config-json {params.cfg:q} "
        "--train {output.train} --val {output.val} --vocab {output.vocab} "
        "--manifest {output.manifest} 2> {log}"
