# Our own checkpoints as model sources (config `format: checkpoint`): the head-geometry
# study's runs make them. Where some this study reads are missing, this one rule stands in
# for them and stops saying which study to run first (no MissingInputException).

MISSING = STUDY.missing_checkpoints()

if MISSING:
    print(f"Note: {STUDY.missing_note()}", file=sys.stderr)

    rule atlas_missing_checkpoints:
        output:
            MISSING,
        log:
            log_of("atlas_missing_checkpoints"),
        benchmark:
            benchmark_of("atlas_missing_checkpoints")
        params:
            note=STUDY.missing_note(),
        conda:
            "../../envs/headgeom.yaml"
        shell:
            "echo {params.note:q} | tee {log} >&2; exit 1"

    localrules:
        atlas_missing_checkpoints,
