# Paper tables and figures (docs §17), each a pure function of result Parquets taken by
# kind (each output's record in headgeom.heads.paper.outputs, resolved by common.smk: paper_inputs).


rule make_table:
    wildcard_constraints:
        table="|".join(TABLE_JOBS),
    input:
        unpack(paper_inputs),
    output:
        md=report(
            PATHS["table_md"],
            caption="../report/tables.rst",
            category=report_section,
            subcategory="Tables",
            labels={"table": "{table}"},
        ),
        csv=PATHS["table_csv"],
        tex=PATHS["table_tex"],
        sources=PATHS["table_sources"],
    log:
        log_of("make_table", "{table}"),
    benchmark:
        benchmark_of("make_table", "{table}")
    params:
        inputs=input_kinds,
    threads: STUDY.threads("make_table")
    resources:
        **STUDY.resources("make_table", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.make_table --table {wildcards.table} {params.inputs} "
        "--out-md {output.md} --out-csv {output.csv} --out-tex {output.tex} "
        "--out-sources {output.sources} 2> {log}"


rule make_figure:
    wildcard_constraints:
        figure="|".join(FIGURES),
    input:
        unpack(paper_inputs),
    output:
        png=report(
            PATHS["figure_png"],
            caption="../report/figures.rst",
            category=report_section,
            subcategory="Figures",
            labels={"figure": "{figure}"},
        ),
        svg=PATHS["figure_svg"],
        csv=PATHS["figure_csv"],
        sources=PATHS["figure_sources"],
    log:
        log_of("make_figure", "{figure}"),
    benchmark:
        benchmark_of("make_figure", "{figure}")
    params:
        inputs=input_kinds,
        models=figure_models,
    threads: STUDY.threads("make_figure")
    resources:
        **STUDY.resources("make_figure", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.make_figure "
        "--figure {wildcards.figure} {params.inputs} {params.models} "
        "--out-png {output.png} --out-svg {output.svg} --out-csv {output.csv} "
        "--out-sources {output.sources} 2> {log}"
