# The model zoo without training: every model built on the meta device with the real
# constructor and its parameters counted against docs §6.1 (§4.4 [CHECK]).


rule param_counts:
    input:
        unpack(param_counts_vocab),
    output:
        PATHS["param_counts"],
    log:
        log_of("param_counts"),
    benchmark:
        benchmark_of("param_counts")
    params:
        runs=json_param(STUDY.param_count_runs()),
        vocab=vocab_arg,
    threads: STUDY.threads("param_counts")
    resources:
        **STUDY.resources("param_counts", mem_mb=4000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.param_counts --runs-json {params.runs:q} {params.vocab} "
        "--threads {threads} --out {output} 2> {log}"
