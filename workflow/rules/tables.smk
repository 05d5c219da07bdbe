# Paper tables and figures (METHODS §17), each a pure function of result Parquets taken by
# kind (common.smk: table_inputs, figure_inputs).


rule make_table:
    input:
        unpack(table_inputs),
    output:
        md=report(
            f"{RESULTS}/tables/{{table}}.md",
            caption="../report/tables.rst",
            category="Tables",
            labels={"table": "{table}"},
        ),
        csv=f"{RESULTS}/tables/{{table}}.csv",
        tex=f"{RESULTS}/tables/{{table}}.tex",
        sources=f"{RESULTS}/tables/{{table}}.sources.json",
    log:
        f"{RESULTS}/logs/make_table/{{table}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_table/{{table}}.tsv"
    params:
        inputs=input_kinds,
    wildcard_constraints:
        table="|".join(TABLES),
    threads: cpus("make_table")
    resources:
        mem_mb=resource("make_table", "mem_mb", 1000),
        runtime=resource("make_table", "runtime", 10),
        **placement("make_table"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_table.py --table {wildcards.table} {params.inputs} "
        "--out-md {output.md} --out-csv {output.csv} --out-tex {output.tex} "
        "--out-sources {output.sources} 2> {log}"


rule make_figure:
    input:
        unpack(figure_inputs),
    output:
        png=report(
            f"{RESULTS}/figures/{{figure}}.png",
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
        svg=f"{RESULTS}/figures/{{figure}}.svg",
        csv=f"{RESULTS}/figures/{{figure}}.csv",
        sources=f"{RESULTS}/figures/{{figure}}.sources.json",
    log:
        f"{RESULTS}/logs/make_figure/{{figure}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_figure/{{figure}}.tsv"
    params:
        inputs=input_kinds,
        models=figure_models,
    wildcard_constraints:
        figure="|".join(FIGURES),
    threads: cpus("make_figure")
    resources:
        mem_mb=resource("make_figure", "mem_mb", 2000),
        runtime=resource("make_figure", "runtime", 10),
        **placement("make_figure"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_figure.py --figure {wildcards.figure} {params.inputs} {params.models} "
        "--out-png {output.png} --out-svg {output.svg} --out-csv {output.csv} "
        "--out-sources {output.sources} 2> {log}"
