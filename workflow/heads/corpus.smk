# One job per corpus of the study (docs §3): the shared validation file, then the corpus
# with the validation documents left out, the vocabulary map and the corpus manifest.


rule tokenize_corpus:
    wildcard_constraints:
        corpus="|".join(map(re.escape, STUDY.corpora)),
    output:
        train=PATHS["corpus_train"],
        val=PATHS["corpus_val"],
        vocab=PATHS["corpus_vocab"],
        manifest=PATHS["corpus_manifest"],
    log:
        log_of("tokenize_corpus", "{corpus}"),
    benchmark:
        benchmark_of("tokenize_corpus", "{corpus}")
    params:
        cfg=json_param(STUDY.corpus_config, "corpus"),
    threads: STUDY.threads("tokenize_corpus")
    resources:
        **STUDY.resources("tokenize_corpus", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.tokenize_corpus "
        "--config-json {params.cfg:q} --threads {threads} "
        "--train {output.train} --val {output.val} --vocab {output.vocab} "
        "--manifest {output.manifest} 2> {log}"
