# Edge patching vs weight-space PK (docs §15.1, Table 7) and the ACDC circuit (§15.4): one
# job per run of STUDY.run_set("edges"), one per run of STUDY.run_set("acdc").
rule edges:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=PATHS["task"].format(task=STUDY.stage("edges")["task"]),
    output:
        edges=PATHS["edges"],
        summary=PATHS["edge_summary"],
    log:
        log_of("edges", "{model}-s{seed}"),
    benchmark:
        benchmark_of("edges", "{model}-s{seed}")
    params:
        split=STUDY.stage("edges")["split"],
        n_examples=STUDY.stage("edges")["n_examples"],
        batch_size=STUDY.stage("edges")["batch_size"],
        max_rows=STUDY.stage("edges")["max_rows"],
        dtype=STUDY.stage("edges")["dtype"],
    threads: STUDY.threads("edges")
    resources:
        **STUDY.resources("edges", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.edges "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--task {input.task} --split {params.split} --n-examples {params.n_examples} "
        "--batch-size {params.batch_size} --max-rows {params.max_rows} --dtype {params.dtype} "
        "--threads {threads} --out-edges {output.edges} --out-summary {output.summary} "
        "2> {log}"


rule acdc:
    input:
        checkpoint=PATHS["checkpoint"],
        manifest=PATHS["manifest"],
        task=PATHS["task"].format(task=STUDY.stage("edges")["task"]),
    output:
        acdc=PATHS["acdc"],
    log:
        log_of("acdc", "{model}-s{seed}"),
    benchmark:
        benchmark_of("acdc", "{model}-s{seed}")
    params:
        split=STUDY.stage("edges")["split"],
        n_examples=STUDY.stage("edges")["n_examples"],
        threshold=STUDY.stage("edges")["acdc_threshold"],
        dtype=STUDY.stage("edges")["dtype"],
    threads: STUDY.threads("acdc")
    resources:
        **STUDY.resources("acdc", mem_mb=4000, runtime=60),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.acdc "
        "--checkpoint {input.checkpoint} --manifest {input.manifest} "
        "--task {input.task} --split {params.split} --n-examples {params.n_examples} "
        "--acdc-threshold {params.threshold} --dtype {params.dtype} --threads {threads} "
        "--out {output.acdc} "
        "2> {log}"
