# Paper §5.1 summaries (docs §11.3–11.6): from the leakage rows of every run and
# task leakage measures, the per-head effects (top-3 selection) and the training logs.


rule exclusivity:
    input:
        leakage=per_run("leakage", STUDY.run_set("leakage")),
        heads=per_run("heads", STUDY.run_set("leakage")),
        runs=per_run("train_log", STUDY.run_set("leakage")),
    output:
        summary=PATHS["exclusivity"],
        pairs=PATHS["exclusivity_pairs"],
        heads=PATHS["exclusivity_heads"],
    log:
        log_of("exclusivity", "exclusivity"),
    benchmark:
        benchmark_of("exclusivity", "exclusivity")
    threads: STUDY.threads("exclusivity")
    resources:
        **STUDY.resources("exclusivity", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.exclusivity "
        "--leakage {input.leakage} --heads {input.heads} "
        "--runs {input.runs} --out-summary {output.summary} --out-pairs {output.pairs} "
        "--out-heads {output.heads} 2> {log}"
