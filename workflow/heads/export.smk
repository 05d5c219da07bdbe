# A `learned` checkpoint as a Hugging Face GPT2LMHeadModel directory, for cross-checks in
# transformers/TransformerLens (headgeom.model.interop). Not part of `all`; ask for it by name:
#   snakemake --cores all results/demo/models/learned/s42/hf


rule export_hf:
    input:
        checkpoint=exportable_checkpoint,
        manifest=PATHS["manifest"],
    output:
        directory(PATHS["hf"]),
    log:
        log_of("export_hf", "{model}-s{seed}"),
    benchmark:
        benchmark_of("export_hf", "{model}-s{seed}")
    threads: STUDY.threads("export_hf")
    resources:
        **STUDY.resources("export_hf", mem_mb=2000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.export_hf "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--threads {threads} --out-dir {output} 2> {log}"
