# Concentration of head-patching effects and the robustness analyses of METHODS §10.2–10.4
# and §12: per (model, seed, task), then across models (paired bootstrap, loss vs N_eff).
# Helpers (pairs, models, split check) are in common.smk.


rule concentration:
    input:
        effects=rules.patch_heads.output.effects,
    output:
        summary=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.parquet",
        heads=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.heads.parquet",
        robustness=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.robustness.parquet",
        conditions=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.conditions.parquet",
        logo=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.logo.parquet",
    log:
        f"{RESULTS}/logs/concentration/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/concentration/{{model}}-s{{seed}}-{{task}}.tsv"
    params:
        split=config["concentration"]["split"],
        n_bootstrap=config["concentration"]["n_bootstrap"],
        bootstrap_seed=config["concentration"]["bootstrap_seed"],
        n_permutations=config["concentration"]["n_permutations"],
        permutation_seed=config["concentration"]["permutation_seed"],
        ci=config["concentration"]["ci"],
        index_meaningful=index_meaningful,
    threads: cpus("concentration")
    resources:
        mem_mb=resource("concentration", "mem_mb", 1000),
        runtime=resource("concentration", "runtime", 10),
        **placement("concentration"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/concentration.py --effects {input.effects} --split {params.split} "
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
        paired=f"{RESULTS}/concentration/compare/{{task}}.paired.parquet",
        logo=f"{RESULTS}/concentration/compare/{{task}}.paired_logo.parquet",
    log:
        f"{RESULTS}/logs/compare_concentration/{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/compare_concentration/{{task}}.tsv"
    params:
        split=config["concentration"]["split"],
        pairs=concentration_pairs_json,
        n_bootstrap=config["concentration"]["n_bootstrap"],
        bootstrap_seed=config["concentration"]["bootstrap_seed"],
        ci=config["concentration"]["ci"],
    threads: cpus("compare_concentration")
    resources:
        mem_mb=resource("compare_concentration", "mem_mb", 2000),
        runtime=resource("compare_concentration", "runtime", 10),
        **placement("compare_concentration"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/compare_concentration.py --task {wildcards.task} --split {params.split} "
        "--pairs {params.pairs:q} --effects {input.effects} "
        "--n-bootstrap {params.n_bootstrap} --bootstrap-seed {params.bootstrap_seed} "
        "--ci {params.ci} --out-paired {output.paired} --out-logo {output.logo} 2> {log}"


rule concentration_loss:
    input:
        robustness=[
            f"{RESULTS}/concentration/{m}/s{s}/{t}.robustness.parquet"
            for m, s in model_seeds()
            for t in TASKS
        ],
        manifests=[f"{RESULTS}/models/{m}/s{s}/manifest.json" for m, s in model_seeds()],
    output:
        loss=f"{RESULTS}/concentration/compare/loss.parquet",
        spearman=f"{RESULTS}/concentration/compare/spearman.parquet",
    log:
        f"{RESULTS}/logs/concentration_loss/concentration_loss.log",
    benchmark:
        f"{RESULTS}/benchmarks/concentration_loss/concentration_loss.tsv"
    params:
        split=config["concentration"]["split"],
        models=concentration_models_json,
        base_n_head=config["architecture"]["n_head"],
        loss_models=loss_models_json,
    threads: cpus("concentration_loss")
    resources:
        mem_mb=resource("concentration_loss", "mem_mb", 1000),
        runtime=resource("concentration_loss", "runtime", 10),
        **placement("concentration_loss"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/concentration_loss.py --robustness {input.robustness} "
        "--manifests {input.manifests} --models {params.models:q} "
        "--base-n-head {params.base_n_head} --split {params.split} "
        "--loss-models {params.loss_models:q} --out-loss {output.loss} "
        "--out-spearman {output.spearman} 2> {log}"
