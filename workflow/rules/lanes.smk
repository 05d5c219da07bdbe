rule lanes:
    input:
        heads=rules.concentration.output.heads,
    output:
        f"{RESULTS}/lanes/{{model}}/s{{seed}}/{{task}}.parquet",
    log:
        f"{RESULTS}/logs/lanes/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/lanes/{{model}}-s{{seed}}-{{task}}.tsv"
    params:
        split=config["lanes"]["split"],
        n_permutations=config["lanes"]["n_permutations"],
        seed=config["lanes"]["seed"],
    threads: cpus("lanes")
    resources:
        mem_mb=resource("lanes", "mem_mb", 1000),
        runtime=resource("lanes", "runtime", 10),
        **placement("lanes"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/lanes.py --heads {input.heads} --split {params.split} "
        "--n-permutations {params.n_permutations} --seed {params.seed} --out {output} 2> {log}"
