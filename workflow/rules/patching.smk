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
    resources:
        mem_mb=resource("patch_heads", "mem_mb", 4000),
        runtime=resource("patch_heads", "runtime", 60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/patch_heads.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --splits {params.splits} "
        "--batch-size {params.batch_size} --model-name {wildcards.model} "
        "--seed {wildcards.seed} --task-name {wildcards.task} --out {output.effects} 2> {log}"


rule concentration:
    input:
        effects=rules.patch_heads.output.effects,
    output:
        summary=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.parquet",
        heads=f"{RESULTS}/concentration/{{model}}/s{{seed}}/{{task}}.heads.parquet",
    log:
        f"{RESULTS}/logs/concentration/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/concentration/{{model}}-s{{seed}}-{{task}}.tsv"
    resources:
        mem_mb=resource("concentration", "mem_mb", 1000),
        runtime=resource("concentration", "runtime", 10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/concentration.py --effects {input.effects} "
        "--out-summary {output.summary} --out-heads {output.heads} 2> {log}"
