rule leakage:
    input:
        checkpoint=checkpoint_path,
        manifest=manifest_path,
        task=task_path,
        effects=rules.patch_heads.output.effects,
    output:
        f"{RESULTS}/leakage/{{model}}/s{{seed}}/{{task}}.parquet",
    log:
        f"{RESULTS}/logs/leakage/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/leakage/{{model}}-s{{seed}}-{{task}}.tsv"
    params:
        split=config["leakage"]["split"],
    threads: cpus("leakage")
    resources:
        mem_mb=resource("leakage", "mem_mb", 4000),
        runtime=resource("leakage", "runtime", 60),
        **placement("leakage"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/leakage.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --effects {input.effects} "
        "--split {params.split} --out {output} 2> {log}"
