# Weight-space geometry of each checkpoint (METHODS §9, §14.1, §14.3); Figures 1 and 7 are
# drawn from it by rule make_figure (tables.smk).


rule geometry_stats:
    input:
        checkpoint=checkpoint_path,
        manifest=manifest_path,
    output:
        pk=f"{RESULTS}/geometry/{{model}}/s{{seed}}/pk.parquet",
        summary=f"{RESULTS}/geometry/{{model}}/s{{seed}}/summary.parquet",
    log:
        f"{RESULTS}/logs/geometry_stats/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/geometry_stats/{{model}}-s{{seed}}.tsv"
    threads: cpus("geometry_stats")
    resources:
        mem_mb=resource("geometry_stats", "mem_mb", 4000),
        runtime=resource("geometry_stats", "runtime", 20),
        **placement("geometry_stats"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/geometry_stats.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --model-name {wildcards.model} --seed {wildcards.seed} "
        "--out-pk {output.pk} --out-summary {output.summary} 2> {log}"
