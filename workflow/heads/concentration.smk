# Concentration of head-patching effects and the robustness analyses of docs §10.2–10.4
# and §12: per (model, seed) for every task, then across models (paired bootstrap, loss vs N_eff).
# The pairs and models come from the study (headgeom.heads.study, headgeom.heads.selections).

#: The bootstrap and permutation settings of every concentration job (final and per step).
RESAMPLING = {
    key: STUDY.stage("concentration")[key]
    for key in ("n_bootstrap", "bootstrap_seed", "n_permutations", "permutation_seed", "ci")
}


# One job per run for every task (as patch_heads): the interpreter and its imports start once.
rule concentration:
    input:
        effects=[PATHS["effects"].replace("{task}", t) for t in TASKS],
    output:
        summary=expand(PATHS["summary"], task=TASKS, allow_missing=True),
        heads=expand(PATHS["heads"], task=TASKS, allow_missing=True),
        robustness=expand(PATHS["robustness"], task=TASKS, allow_missing=True),
        conditions=expand(PATHS["conditions"], task=TASKS, allow_missing=True),
        logo=expand(PATHS["logo"], task=TASKS, allow_missing=True),
    log:
        log_of("concentration", "{model}-s{seed}"),
    benchmark:
        benchmark_of("concentration", "{model}-s{seed}")
    params:
        **RESAMPLING,
        split=STUDY.stage("concentration")["split"],
        index_meaningful=index_meaningful,
    threads: STUDY.threads("concentration")
    resources:
        **STUDY.resources("concentration", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.concentration "
        "--effects {input.effects} --split {params.split} "
        "--n-bootstrap {params.n_bootstrap} --bootstrap-seed {params.bootstrap_seed} "
        "--n-permutations {params.n_permutations} --permutation-seed {params.permutation_seed} "
        "--ci {params.ci} --index-meaningful {params.index_meaningful} "
        "--out-summary {output.summary} --out-heads {output.heads} "
        "--out-robustness {output.robustness} --out-conditions {output.conditions} "
        "--out-logo {output.logo} 2> {log}"


rule compare_concentration:
    input:
        effects=compare_effects_inputs,
    output:
        paired=PATHS["paired"],
        logo=PATHS["paired_logo"],
    log:
        log_of("compare_concentration", "{task}"),
    benchmark:
        benchmark_of("compare_concentration", "{task}")
    params:
        split=STUDY.stage("concentration")["split"],
        pairs=json_param(STUDY.pairs),
        n_bootstrap=STUDY.stage("concentration")["n_bootstrap"],
        bootstrap_seed=STUDY.stage("concentration")["bootstrap_seed"],
        ci=STUDY.stage("concentration")["ci"],
    threads: STUDY.threads("compare_concentration")
    resources:
        **STUDY.resources("compare_concentration", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.compare_concentration "
        "--task {wildcards.task} --split {params.split} "
        "--pairs {params.pairs:q} --effects {input.effects} "
        "--n-bootstrap {params.n_bootstrap} --bootstrap-seed {params.bootstrap_seed} "
        "--ci {params.ci} --out-paired {output.paired} --out-logo {output.logo} 2> {log}"


rule concentration_loss:
    input:
        robustness=per_run("robustness", STUDY.runs),
        manifests=per_run("manifest", STUDY.runs),
    output:
        loss=PATHS["loss"],
        spearman=PATHS["spearman"],
    log:
        log_of("concentration_loss", "concentration_loss"),
    benchmark:
        benchmark_of("concentration_loss", "concentration_loss")
    params:
        split=STUDY.stage("concentration")["split"],
        models=json_param(STUDY.concentration_models()),
        base_n_head=STUDY.stage("architecture")["n_head"],
        loss_models=json_param(STUDY.loss_models),
        paper_runs=json_param(STUDY.patching_summary_runs),
        figure3_runs=json_param(PAPER.selection(record("figure", "figure3"))),
    threads: STUDY.threads("concentration_loss")
    resources:
        **STUDY.resources("concentration_loss", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.concentration_loss --robustness {input.robustness} "
        "--manifests {input.manifests} --models {params.models:q} "
        "--base-n-head {params.base_n_head} --split {params.split} "
        "--loss-models {params.loss_models:q} --paper-runs {params.paper_runs:q} "
        "--figure3-runs {params.figure3_runs:q} --out-loss {output.loss} "
        "--out-spearman {output.spearman} 2> {log}"
