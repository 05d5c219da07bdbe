# Weight-space geometry of each checkpoint (METHODS §9, §14.1, §14.3) and the figures drawn
# from it (paper Figures 1 and 7).

FIGURES = ["figure1", "figure7"]

# The Parquets each figure is a pure function of. Figure 1 shows one checkpoint per model
# (its first configured seed); Figure 7 every (model, seed).
FIGURE_INPUTS = {
    "figure1": [
        f"{RESULTS}/geometry/{m}/s{spec['seeds'][0]}/pk.parquet"
        for m, spec in config["models"].items()
    ],
    "figure7": [f"{RESULTS}/geometry/{m}/s{s}/summary.parquet" for m, s in model_seeds()],
}


rule geometry_stats:
    input:
        checkpoint=checkpoint_path,
        manifest=manifest_path,
    output:
        pk=f"{RESULTS}/geometry/{{model}}/s{{seed}}/pk.parquet",
        summary=f"{RESULTS}/geometry/{{model}}/s{{seed}}/summary.parquet",
    log:
        f"{RESULTS}/logs/geometry_stats/{{model}}-s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/geometry_stats/{{model}}-s{{seed}}.tsv"
    resources:
        mem_mb=resource("geometry_stats", "mem_mb", 4000),
        runtime=resource("geometry_stats", "runtime", 20),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/geometry_stats.py --checkpoint {input.checkpoint} "
        "--manifest {input.manifest} --model-name {wildcards.model} --seed {wildcards.seed} "
        "--out-pk {output.pk} --out-summary {output.summary} 2> {log}"


rule make_figure:
    input:
        lookup(dpath="{figure}", within=FIGURE_INPUTS),
    output:
        png=report(
            f"{RESULTS}/figures/{{figure}}.png",
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
        svg=f"{RESULTS}/figures/{{figure}}.svg",
        csv=f"{RESULTS}/figures/{{figure}}.csv",
        sources=f"{RESULTS}/figures/{{figure}}.sources.json",
    log:
        f"{RESULTS}/logs/make_figure/{{figure}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_figure/{{figure}}.tsv"
    wildcard_constraints:
        figure="|".join(FIGURES),
    resources:
        mem_mb=resource("make_figure", "mem_mb", 2000),
        runtime=resource("make_figure", "runtime", 10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python src/make_figure.py --figure {wildcards.figure} --inputs {input} "
        "--out-png {output.png} --out-svg {output.svg} --out-csv {output.csv} "
        "--out-sources {output.sources} 2> {log}"
