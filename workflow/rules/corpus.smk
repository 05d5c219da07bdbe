# One job per corpus of the study (METHODS §3): the shared validation file, then the corpus
# with the validation documents left out, the vocabulary map and the corpus manifest.


rule tokenize_corpus:
    output:
        train=f"{RESULTS}/corpus/{{corpus}}/{CORPUS_FILES['train']}",
        val=f"{RESULTS}/corpus/{{corpus}}/{CORPUS_FILES['val']}",
        vocab=f"{RESULTS}/corpus/{{corpus}}/{CORPUS_FILES['vocab']}",
        manifest=f"{RESULTS}/corpus/{{corpus}}/{CORPUS_FILES['manifest']}",
    log:
        f"{RESULTS}/logs/tokenize_corpus/{{corpus}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/tokenize_corpus/{{corpus}}.tsv"
    wildcard_constraints:
        corpus=CORPUS_NAMES,
    params:
        cfg=corpus_config_json,
    threads: cpus("tokenize_corpus")
    resources:
        mem_mb=resource("tokenize_corpus", "mem_mb", 4000),
        runtime=resource("tokenize_corpus", "runtime", 60),
        **placement("tokenize_corpus"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/tokenize_corpus.py --config-json {params.cfg:q} --threads {threads} "
        "--train {output.train} --val {output.val} --vocab {output.vocab} "
        "--manifest {output.manifest} 2> {log}"
