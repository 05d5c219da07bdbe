# The atlas's compression view (docs/atlas.md, Compression): compressed variants of the model
# scored on the sweep's windows and probes, beside the article's reference numbers.


rule atlas_compression:
    input:
        model=STUDY.model_files(),
        windows=PATHS["windows"],
        probes=PATHS["probes"],
    output:
        table=PATHS["compression"],
        report=PATHS["compression_report"],
    log:
        log_of("atlas_compression"),
    benchmark:
        benchmark_of("atlas_compression")
    params:
        cfg=as_json(STUDY.compression_config()),
    threads: STUDY.threads("atlas_compression")
    resources:
        **STUDY.resources("atlas_compression", mem_mb=8000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.compression --config-json {params.cfg:q} "
        "--windows {input.windows} --probes {input.probes} --threads {threads} "
        "--out {output.table} --out-report {output.report} 2> {log}"
