# Seed statistics, every SA-MoE table and figure, and the comparison with the paper (§17–§22).


rule samoe_stats:
    input:
        seeds=PATHS["seeds"],
        dense=[PATHS["dense"].format(family=f) for f in STUDY.families],
        quality=per_run("quality", STUDY.runs),
        local_suppression=per_run("local_suppression", STUDY.state_runs),
        history=per_run("history", STUDY.state_runs),
        state_geometry=per_run("state_geometry", STUDY.state_runs),
        probes=per_run("probes", STUDY.state_runs),
        interventions=per_run("interventions", STUDY.state_runs),
        rankings=all_rankings(),
    output:
        seed_means=PATHS["seed_means"],
        contrasts=PATHS["contrasts"],
        counts=PATHS["counts"],
    log:
        log_of("samoe_stats"),
    benchmark:
        benchmark_of("samoe_stats")
    params:
        cfg=as_json(paper_config()),
        dense=as_json({f: PATHS["dense"].format(family=f) for f in STUDY.families}),
    threads: 1
    resources:
        **STUDY.resources("samoe_stats", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.stats "
        "--config-json {params.cfg:q} --dense-json {params.dense:q} "
        "--quality {input.quality} --local-suppression {input.local_suppression} "
        "--history {input.history} --state-geometry {input.state_geometry} "
        "--probes {input.probes} --interventions {input.interventions} "
        "--rankings {input.rankings} "
        "--seeds {input.seeds} --seed-means {output.seed_means} "
        "--contrasts {output.contrasts} --counts {output.counts} 2> {log}"


rule samoe_paper:
    input:
        counts=PATHS["counts"],
        seed_means=PATHS["seed_means"],
        contrasts=PATHS["contrasts"],
        history=per_run("history", STUDY.state_runs),
        history_pool=per_run("history_pool", STUDY.state_runs),
        quality=per_run("quality", STUDY.runs),
        seeds=PATHS["seeds"],
        probes=per_run("probes", STUDY.state_runs),
        rankings=all_rankings(),
        li=per_run("li", STUDY.ordinary_runs),
        audit_cost=[PATHS["audit_cost"].format(family=f) for f in STUDY.families],
        runtime=[PATHS["runtime"].format(family=f) for f in STUDY.families],
    output:
        tables=paper_files(reported=True)[0],
        figures=paper_files(reported=True)[1],
        comparison=PATHS["comparison"],
        comparison_md=PATHS["comparison"].replace(".parquet", ".md"),
    log:
        log_of("samoe_paper"),
    benchmark:
        benchmark_of("samoe_paper")
    params:
        cfg=as_json(paper_config()),
        tables_dir=lambda wildcards, output: os.path.dirname(output.tables[0]),
        figures_dir=lambda wildcards, output: os.path.dirname(output.figures[0]),
    threads: 1
    resources:
        **STUDY.resources("samoe_paper", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.samoe.stages.paper "
        "--config-json {params.cfg:q} --counts {input.counts} "
        "--seed-means {input.seed_means} --contrasts {input.contrasts} "
        "--history {input.history} --history-pool {input.history_pool} "
        "--quality {input.quality} --seeds {input.seeds} "
        "--probes {input.probes} --rankings {input.rankings} "
        "--li {input.li} --audit-cost {input.audit_cost} --runtime {input.runtime} "
        "--tables-dir {params.tables_dir} "
        "--figures-dir {params.figures_dir} --comparison {output.comparison} 2> {log}"
