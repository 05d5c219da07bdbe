# Weight-space geometry of each checkpoint (docs §9, §14.1, §14.3); Figures 1 and 7 are
# drawn from it by rule make_figure (tables.smk).


rule geometry_stats:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
    output:
        pk=PATHS["pk"],
        summary=PATHS["geometry_summary"],
        heads=PATHS["geometry_heads"],
    log:
        log_of("geometry_stats", "{model}-s{seed}"),
    benchmark:
        benchmark_of("geometry_stats", "{model}-s{seed}")
    threads: STUDY.threads("geometry_stats")
    resources:
        **STUDY.resources("geometry_stats", mem_mb=4000, runtime=20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.geometry_stats --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --model-name {wildcards.model} --seed {wildcards.seed} "
        "--threads {threads} --out-pk {output.pk} --out-summary {output.summary} --out-heads {output.heads} 2> {log}"
