rule evaluate_clean:
    input:
        checkpoint=checkpoint_path,
        manifest=manifest_path,
        task=task_path,
    output:
        f"{RESULTS}/eval/{{model}}/s{{seed}}/{{task}}.parquet",
    log:
        f"{RESULTS}/logs/evaluate_clean/{{model}}-s{{seed}}-{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate_clean/{{model}}-s{{seed}}-{{task}}.tsv"
    threads: cpus("evaluate_clean")
    resources:
        mem_mb=resource("evaluate_clean", "mem_mb", 2000),
        runtime=resource("evaluate_clean", "runtime", 10),
        **placement("evaluate_clean"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/evaluate_clean.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --task {input.task} --out {output} 2> {log}"
