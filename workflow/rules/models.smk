# The model zoo without training: every model built on the meta device with the real
# constructor and its parameters counted against METHODS §6.1 (§4.4 [CHECK]).


rule param_counts:
    input:
        unpack(param_counts_vocab),
    output:
        PARAM_COUNTS,
    log:
        f"{RESULTS}/logs/param_counts.log",
    benchmark:
        f"{RESULTS}/benchmarks/param_counts.tsv"
    params:
        runs=param_count_runs_json,
        vocab=vocab_arg,
    threads: cpus("param_counts")
    resources:
        mem_mb=resource("param_counts", "mem_mb", 4000),
        runtime=resource("param_counts", "runtime", 10),
        **placement("param_counts"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/param_counts.py --runs-json {params.runs:q} {params.vocab} "
        "--out {output} 2> {log}"
