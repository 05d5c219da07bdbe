rule patch_heads:
    input:
        checkpoint=checkpoint_path,
        manifest=manifest_path,
        task=task_path,
    output:
        effects=f"{RESULTS}/patching/{{model}}/s{{seed}}/{{task}}.parquet",
    log:
        f"{RESULTS}/logs/patch_heads/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/patch_heads/{{model}}-s{{seed}}-{{task}}.tsv"
    params:
        splits=",".join(config["patching"]["splits"]),
        batch_size=config["patching"]["batch_size"],
        max_rows=config["patching"]["max_rows"],
    threads: cpus("patch_heads")
    resources:
        mem_mb=resource("patch_heads", "mem_mb", 4000),
        runtime=resource("patch_heads", "runtime", 60),
        **placement("patch_heads"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/patch_heads.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --splits {params.splits} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} "
        "--model-name {wildcards.model} "
        "--seed {wildcards.seed} --task-name {wildcards.task} --out {output.effects} 2> {log}"

