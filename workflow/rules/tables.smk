rule make_table:
    input:
        table_inputs,
    output:
        md=report(
            f"{RESULTS}/tables/{{table}}.md",
            caption="../report/tables.rst",
            category="Tables",
            labels={"table": "{table}"},
        ),
        csv=f"{RESULTS}/tables/{{table}}.csv",
        sources=f"{RESULTS}/tables/{{table}}.sources.json",
    log:
        f"{RESULTS}/logs/make_table/{{table}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_table/{{table}}.tsv"
    wildcard_constraints:
        table="|".join(TABLES),
    resources:
        mem_mb=resource("make_table", "mem_mb", 1000),
        runtime=resource("make_table", "runtime", 10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_table.py --table {wildcards.table} --inputs {input} "
        "--out-md {output.md} --out-csv {output.csv} --out-sources {output.sources} 2> {log}"
