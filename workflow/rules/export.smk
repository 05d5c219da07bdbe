# A `learned` checkpoint as a Hugging Face GPT2LMHeadModel directory, for cross-checks in
# transformers/TransformerLens (headgeom.model.interop). Not part of `all`; ask for it by name:
#   snakemake --cores all results/demo/models/learned/s42/hf


rule export_hf:
    input:
        checkpoint=learned_checkpoint_path,
        manifest=manifest_path,
    output:
        directory(f"{RESULTS}/models/{{model}}/s{{seed}}/hf"),
    log:
        f"{RESULTS}/logs/export_hf/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/export_hf/{{model}}-s{{seed}}.tsv"
    threads: cpus("export_hf")
    resources:
        mem_mb=resource("export_hf", "mem_mb", 2000),
        runtime=resource("export_hf", "runtime", 10),
        **placement("export_hf"),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/export_hf.py --checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--out-dir {output} 2> {log}"
