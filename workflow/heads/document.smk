# The study as a document (docs §17): the paper tables whose records say `document`
# (Table 1, Table 4, the §12.1/§12.5 counts, seed statistics, the paper-vs-run comparison,
# the every-run Table 2) in one job, and the results catalog. Wiring a table in: its record
# in headgeom.heads.paper.outputs (document=True), its builder and its caption in report/document/.


rule make_document:
    input:
        unpack(document_inputs),
    output:
        md=[
            report(
                PATHS["table_md"].format(table=t),
                caption=f"../report/document/{t}.rst",
                category=section_of(t),
                subcategory="Tables",
                labels={"table": t},
            )
            for t in PAPER.document_tables
        ],
        csv=[PATHS["table_csv"].format(table=t) for t in PAPER.document_tables],
        tex=[PATHS["table_tex"].format(table=t) for t in PAPER.document_tables],
        sources=[PATHS["table_sources"].format(table=t) for t in PAPER.document_tables],
    log:
        log_of("make_document", "make_document"),
    benchmark:
        benchmark_of("make_document", "make_document")
    params:
        tables=" ".join(PAPER.document_tables),
        inputs=document_input_args,
        context=json_param(PAPER.document_context()),
        out_dir=folder_of("md"),
    threads: STUDY.threads("make_document")
    resources:
        **STUDY.resources("make_document", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.make_document --tables {params.tables} {params.inputs} "
        "--context {params.context:q} --out-dir {params.out_dir} 2> {log}"


rule catalog:
    input:
        final_outputs(catalog=False),
    output:
        catalog=PATHS["catalog"],
    log:
        log_of("catalog", "catalog"),
    benchmark:
        benchmark_of("catalog", "catalog")
    params:
        results=folder_of("catalog"),
        templates=catalog_templates,
        models=json_param(list(STUDY.models)),
    threads: STUDY.threads("catalog")
    resources:
        **STUDY.resources("catalog", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.catalog "
        "--results {params.results} --templates {params.templates:q} "
        "--models {params.models:q} --out {output.catalog} 2> {log}"
