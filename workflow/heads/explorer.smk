# The explorer (docs §19): one offline interactive page of the study's results, linked to
# from the report. It reads the catalog (to cite each Parquet's SHA-256), so it comes after
# it and is not in it.


rule explorer:
    input:
        unpack(explorer_inputs),
        catalog=PATHS["catalog"],
    output:
        html=report(
            PATHS["explorer"],
            caption="../report/explorer.rst",
            category="Explorer",
            labels={"page": "explorer"},
        ),
    log:
        log_of("explorer", "explorer"),
    benchmark:
        benchmark_of("explorer", "explorer")
    params:
        inputs=explorer_input_args,
        study=STUDY.name,
    threads: STUDY.threads("explorer")
    resources:
        **STUDY.resources("explorer", mem_mb=4000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.explorer {params.inputs} --catalog {input.catalog} "
        "--study {params.study} --out {output.html} 2> {log}"
