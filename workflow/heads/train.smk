# Training (docs §7). Besides the final checkpoint and log, the train rule writes the
# intermediate checkpoints of training.checkpoint_steps (each with its manifest) and keeps a
# resumable state in s<seed>/resume/ (not an output: a restarted job continues from it to
# the same bytes; train.py deletes it when done).
rule train:
    wildcard_constraints:
        # trained (not imported) models without a timeline: no intermediate checkpoints
        model=STUDY.model_pattern(m for m in STUDY.trained_models if m not in STUDY.timeline_models),
    input:
        train=model_corpus("train"),
        val=model_corpus("val"),
        vocab=model_corpus("vocab"),
        corpus_manifest=model_corpus("manifest"),
    output:
        checkpoint=PATHS["checkpoint"],
        log=PATHS["train_log"],
    log:
        log_of("train", "{model}-s{seed}"),
    benchmark:
        benchmark_of("train", "{model}-s{seed}")
    params:
        cfg=json_param(STUDY.train_config, "model", "seed"),
        checkpoint_dir=PATHS["checkpoints"],
        resume_dir=PATHS["resume"],
    threads: STUDY.threads("train")
    resources:
        **STUDY.resources("train", mem_mb=4000, runtime=120),
    conda:
        "../../envs/headgeom.yaml"
    # exec: the job's process is train.py itself, so the signal Slurm sends a job step
    # (--signal=TERM@120, a time limit) reaches it with no shell in between to die first
    shell:
        "exec python -m headgeom.heads.stages.train "
        "--config-json {params.cfg:q} --threads {threads} "
        "--train-tokens {input.train} --val-tokens {input.val} --vocab {input.vocab} "
        "--corpus-manifest {input.corpus_manifest} "
        "--checkpoint {output.checkpoint} --log {output.log} "
        "--checkpoint-dir {params.checkpoint_dir} --resume-dir {params.resume_dir} 2> {log}"


# The timeline models (rule dynamics) also keep training.checkpoint_steps.
use rule train as train_timeline with:
    wildcard_constraints:
        model=STUDY.model_pattern(STUDY.timeline_models),
    output:
        checkpoint=PATHS["checkpoint"],
        log=PATHS["train_log"],
        intermediate=STUDY.intermediate_checkpoints(PATHS["checkpoints"]),


rule hash_checkpoint:
    wildcard_constraints:
        model=STUDY.model_pattern(STUDY.trained_models),  # not imported models (rule import_model)
    input:
        checkpoint=PATHS["checkpoint"],
        train_log=PATHS["train_log"],
        corpus_manifest=model_corpus("manifest"),
    output:
        manifest=PATHS["manifest"],
    log:
        log_of("hash_checkpoint", "{model}-s{seed}"),
    benchmark:
        benchmark_of("hash_checkpoint", "{model}-s{seed}")
    params:
        cfg=json_param(STUDY.train_config, "model", "seed"),
    threads: STUDY.threads("hash_checkpoint")
    resources:
        **STUDY.resources("hash_checkpoint", mem_mb=1000, runtime=10),
    conda:
        "../../envs/headgeom.yaml"
    shell:
        "python -m headgeom.heads.stages.hash_checkpoint --config-json {params.cfg:q} "
        "--checkpoint {input.checkpoint} --train-log {input.train_log} "
        "--corpus-manifest {input.corpus_manifest} --threads {threads} "
        "--out {output.manifest} 2> {log}"
