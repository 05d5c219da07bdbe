# The atlas page (docs/atlas.md, The page): one offline HTML file of the model's profile,
# its edits' effects, retention and summary, and the optional tables the study makes
# (STUDY.page_optional: the compression table where config `compression` asks for it), and
# each pair's two-checkpoint views (config `pairs`).


rule atlas_page:
    input:
        **{k: PATHS[k] for k in STUDY.page_optional() if k in PATHS},
        **pair_tables(),
        profile=PATHS["profile"],
        effects=PATHS["effects"],
        retention=PATHS["retention"],
        summary=PATHS["summary"],
    output:
        PATHS["page"],
    log:
        log_of("atlas_page"),
    benchmark:
        benchmark_of("atlas_page")
    params:
        model=STUDY.model_name,
        pairs=pair_folders(),
        optional=lambda wildcards, input: " ".join(
            f"--{k} {input[k]}" for k in STUDY.page_optional() if k in input.keys()
        ),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.atlas.stages.page --model {params.model:q} "
        "--profile {input.profile} --effects {input.effects} --retention {input.retention} "
        "--summary {input.summary} {params.optional} {params.pairs} --out {output} 2> {log}"


localrules:
    atlas_page,
