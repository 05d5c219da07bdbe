"""Every file the SA-MoE workflow reads or writes, once, relative to the study's results
directory ``results/<study>/`` (wildcards {family}, {variant}, {seed}, {table}, {figure}).
The workflow's ``PATHS`` prefixes these; the catalog and the docs read the same table."""

from __future__ import annotations

#: One run: (family, variant, seed).
RUN = "samoe/{family}/{variant}/s{seed}"

TEMPLATES = {
    # the toy corpus (SAMOE §3.3): one job for the study
    "corpus_dense_train": "samoe/corpus/dense_train.parquet",
    "corpus_dense_val": "samoe/corpus/dense_val.parquet",
    "corpus_cpt_train": "samoe/corpus/cpt_train.parquet",
    "corpus_vocab": "samoe/corpus/vocab.parquet",
    "pools": "samoe/corpus/pools.parquet",
    "downstream": "samoe/corpus/downstream.parquet",
    "corpus_manifest": "samoe/corpus/manifest.json",
    # the corpus of a Hub family (SAMOE §3.1, §3.2): its own tokenizer, one job per family
    "hub_cpt_train": "samoe/corpus/{family}/cpt_train.bin",
    "hub_cpt_train_meta": "samoe/corpus/{family}/cpt_train.json",
    "hub_pools": "samoe/corpus/{family}/pools.parquet",
    "hub_corpus_manifest": "samoe/corpus/{family}/manifest.json",
    # the dense source of a family (SAMOE §4)
    "dense": "samoe/{family}/dense/model.safetensors",
    "dense_log": "samoe/{family}/dense/train_log.parquet",
    "dense_manifest": "samoe/{family}/dense/manifest.json",
    "targets": "samoe/{family}/targets.parquet",
    # one run
    "step0": f"{RUN}/step0.safetensors",
    "init_manifest": f"{RUN}/init_manifest.json",
    "checkpoint": f"{RUN}/model.safetensors",
    "train_log": f"{RUN}/train_log.parquet",
    "manifest": f"{RUN}/manifest.json",
    "quality": f"{RUN}/quality.parquet",
    "harness": f"{RUN}/harness.parquet",  # a Hub run's lm-eval suite (samoe_harness)
    "state_geometry": f"{RUN}/state_geometry.parquet",
    "local_suppression": f"{RUN}/local_suppression.parquet",
    "history": f"{RUN}/history.parquet",
    "history_pool": f"{RUN}/history_pool.parquet",  # every decision (SAMOE §10.3 supplement)
    "probes": f"{RUN}/probes.parquet",
    "interventions": f"{RUN}/interventions.parquet",
    "rankings": f"{RUN}/rankings.parquet",
    "li": f"{RUN}/li.parquet",
    "li_rankings": f"{RUN}/li_rankings.parquet",
    # the study
    "seeds": "samoe/seeds.json",
    "audit_cost": "samoe/{family}/audit_cost.parquet",
    "runtime": "samoe/{family}/runtime.parquet",
    "counts": "samoe/counts.parquet",
    "seed_means": "samoe/stats/seed_means.parquet",
    "contrasts": "samoe/stats/contrasts.parquet",
    "comparison": "samoe/comparison.parquet",
    "table_md": "samoe/tables/{table}.md",
    "table_csv": "samoe/tables/{table}.csv",
    "table_tex": "samoe/tables/{table}.tex",
    "figure_png": "samoe/figures/{figure}.png",
    "figure_csv": "samoe/figures/{figure}.csv",
}
