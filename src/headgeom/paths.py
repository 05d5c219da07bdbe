"""Every file the workflow reads or writes, once: one template per result, relative to the
study's results directory ``results/<study>/`` (wildcards {corpus}, {model}, {seed}, {task},
{step}, {mode}, {edit}, {table}, {figure}).

The workflow's ``PATHS`` prefixes these with the study's directory; the catalog, the report
captions and docs/map.md read the same table. The dynamics' stages and the extra ablation
modes write a run's files again under a step directory or with a mode suffix
(:func:`at_step`, :func:`in_mode`), so those copies are derived, not written out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: The files of one run (and task), each stage's directory first: the dynamics' stages and the
#: extra ablation modes write the same files under a step directory or with a mode suffix.
RUN_TEMPLATES = {
    "pk": "geometry/{model}/s{seed}/pk.parquet",
    "geometry_summary": "geometry/{model}/s{seed}/summary.parquet",
    "geometry_heads": "geometry/{model}/s{seed}/heads.parquet",
    # one run and task
    "eval": "eval/{model}/s{seed}/{task}.parquet",
    "effects": "patching/{model}/s{seed}/{task}.parquet",
    "summary": "concentration/{model}/s{seed}/{task}.parquet",
    "heads": "concentration/{model}/s{seed}/{task}.heads.parquet",
    "robustness": "concentration/{model}/s{seed}/{task}.robustness.parquet",
    "conditions": "concentration/{model}/s{seed}/{task}.conditions.parquet",
    "logo": "concentration/{model}/s{seed}/{task}.logo.parquet",
    "leakage": "leakage/{model}/s{seed}/{task}.parquet",
    "lanes": "lanes/{model}/s{seed}/{task}.parquet",
}
#: Stages rerun on every intermediate checkpoint (rule dynamics; wildcard {step}).
STEP_STAGES = ("eval", "effects", "summary", "heads", "robustness", "conditions", "logo", "lanes",
               "pk", "geometry_summary", "geometry_heads")  # fmt: skip
#: Stages rerun in every extra ablation mode (wildcard {mode}; docs §10.6).
MODE_STAGES = ("effects", "summary", "heads", "robustness", "conditions", "logo", "lanes")


def at_step(template):
    """A run's file for one intermediate checkpoint: <stage>/{model}/s{seed}/<file> becomes
    dynamics/{model}/s{seed}/step{step}/<stage>/<file>."""
    stage, file = template.split("/{model}/s{seed}/")
    return f"dynamics/{{model}}/s{{seed}}/step{{step}}/{stage}/{file}"


def in_mode(template):
    """A run and task's file in another ablation mode: {task}.<kind> becomes
    {task}.{mode}.<kind>."""
    return template.replace("{task}.", "{task}.{mode}.", 1)


#: name -> template, in the order the workflow declares them.
TEMPLATES = {
    # one corpus of STUDY.corpora (rule tokenize_corpus)
    "corpus_train": "corpus/{corpus}/train_tokens.parquet",
    "corpus_val": "corpus/{corpus}/val_tokens.parquet",
    "corpus_vocab": "corpus/{corpus}/vocab.parquet",
    "corpus_manifest": "corpus/{corpus}/manifest.json",
    "task": "tasks/{task}.parquet",
    # one run (model, seed)
    "checkpoint": "models/{model}/s{seed}/model.safetensors",
    "train_log": "models/{model}/s{seed}/train_log.parquet",
    "manifest": "models/{model}/s{seed}/manifest.json",
    "checkpoints": "models/{model}/s{seed}/checkpoints",  # training.checkpoint_steps
    "resume": "models/{model}/s{seed}/resume",  # resumable training state; not an output
    "hf": "models/{model}/s{seed}/hf",
    **RUN_TEMPLATES,
    # one run and task of a grouped-query causal LM (rule patch_kv_heads; docs §10.1)
    "kv_effects": "patching_kv/{model}/s{seed}/{task}.parquet",
    # one run, every task (rule clamps; docs §13.3, §15.3)
    "clamp_pairs": "clamps/{model}/s{seed}/pairs.parquet",
    "clamp_paths": "clamps/{model}/s{seed}/paths.parquet",
    "clamp_lumped": "clamps/{model}/s{seed}/lumped.parquet",
    # attribution patching beside exact (rule atp_agreement): one run and task, and one
    # figure per run
    "atp_agreement": "atp/{model}/s{seed}/{task}.parquet",
    "atp_heads": "atp/{model}/s{seed}/{task}.heads.parquet",
    "atp_examples": "atp/{model}/s{seed}/{task}.examples.parquet",
    "atp_figure": "atp/{model}/s{seed}/agreement.png",
    # across runs
    "param_counts": "models/param_counts.parquet",
    "paired": "concentration/compare/{task}.paired.parquet",
    "paired_logo": "concentration/compare/{task}.paired_logo.parquet",
    "loss": "concentration/compare/loss.parquet",
    "spearman": "concentration/compare/spearman.parquet",
    # edges and ACDC (docs §15.1, §15.4): one run
    "edges": "edges/{model}/s{seed}/edges.parquet",
    "edge_summary": "edges/{model}/s{seed}/summary.parquet",
    "acdc": "edges/{model}/s{seed}/acdc.parquet",
    # coordinate concentration (docs §15.2): one run, every task
    "coordinates": "coordinates/{model}/s{seed}/coordinates.parquet",
    "coordinate_directions": "coordinates/{model}/s{seed}/directions.parquet",
    # exclusivity (paper §5.1, docs §11.3–11.6): across the leakage runs
    "exclusivity": "exclusivity/summary.parquet",
    "exclusivity_pairs": "exclusivity/pairs.parquet",
    "exclusivity_heads": "exclusivity/heads.parquet",
    # training dynamics (docs §13.2, §13.4, §14.2–14.5): one intermediate checkpoint
    # (wildcard {step}: its zero-padded step) and the reused stages' outputs on it
    "step_checkpoint": "models/{model}/s{seed}/checkpoints/step{step}.safetensors",
    "step_manifest": "models/{model}/s{seed}/checkpoints/step{step}.manifest.json",
    **{f"step_{name}": at_step(RUN_TEMPLATES[name]) for name in STEP_STAGES},
    # one timeline run (rule dynamics) and one ablation run (rule scalar_ablation)
    "timeline": "dynamics/{model}/s{seed}/timeline.parquet",
    "tau": "dynamics/{model}/s{seed}/tau.parquet",
    "value_gradients": "dynamics/{model}/s{seed}/value_gradients.parquet",
    "scalar_ablation": "scalar_ablation/{model}/s{seed}/scalar_ablation.parquet",
    "scalar_ablation_checkpoint": "scalar_ablation/{model}/s{seed}/{edit}.safetensors",
    "scalar_ablation_manifest": "scalar_ablation/{model}/s{seed}/{edit}.manifest.json",
    # ablation (docs §10.6): the means artifact and block ablation atlas of one run;
    # effects and concentration of one run, task and extra ablation mode; the mode comparison
    "ablation_means": "ablation/{model}/s{seed}/means.safetensors",
    "ablation_atlas": "ablation/{model}/s{seed}/atlas.parquet",
    **{f"{name}_mode": in_mode(RUN_TEMPLATES[name]) for name in MODE_STAGES},
    "ablation_modes": "ablation/modes.parquet",
    "table_md": "tables/{table}.md",
    "table_csv": "tables/{table}.csv",
    "table_tex": "tables/{table}.tex",
    "table_sources": "tables/{table}.sources.json",
    "figure_png": "figures/{figure}.png",
    "figure_svg": "figures/{figure}.svg",
    "figure_csv": "figures/{figure}.csv",
    "figure_sources": "figures/{figure}.sources.json",
    # the results catalog, and the explorer page drawn from the Parquets it lists (docs §19)
    "catalog": "catalog.parquet",
    "explorer": "explorer.html",
    # docs §5.7, §18: the basis family record and the study's checks table
    "basis_family": "geometry/basis_family.json",
    "checks": "checks.parquet",
}

#: The rule(s) that write each template: the rerun a refusal names. tests/unit/test_paths.py
#: checks it against the outputs of workflow/heads/*.smk.
PRODUCERS = {
    "corpus_train": "tokenize_corpus",
    "corpus_val": "tokenize_corpus",
    "corpus_vocab": "tokenize_corpus",
    "corpus_manifest": "tokenize_corpus",
    "task": "make_tasks",
    "checkpoint": ("train", "import_model", "train_timeline"),
    "train_log": ("train", "import_model", "train_timeline"),
    "manifest": ("hash_checkpoint", "import_model"),
    "hf": "export_hf",
    "pk": "geometry_stats",
    "geometry_summary": "geometry_stats",
    "geometry_heads": "geometry_stats",
    "eval": "evaluate_clean",
    "effects": "patch_heads",
    "kv_effects": "patch_kv_heads",
    "summary": "concentration",
    "heads": "concentration",
    "robustness": "concentration",
    "conditions": "concentration",
    "logo": "concentration",
    "leakage": "leakage",
    "lanes": "lanes",
    "clamp_pairs": "clamps",
    "clamp_paths": "clamps",
    "clamp_lumped": "clamps",
    "atp_agreement": "atp_agreement",
    "atp_heads": "atp_agreement",
    "atp_examples": "atp_agreement",
    "atp_figure": "atp_agreement",
    "param_counts": "param_counts",
    "paired": "compare_concentration",
    "paired_logo": "compare_concentration",
    "loss": "concentration_loss",
    "spearman": "concentration_loss",
    "edges": "edges",
    "edge_summary": "edges",
    "acdc": "acdc",
    "coordinates": "coordinates",
    "coordinate_directions": "coordinates",
    "exclusivity": "exclusivity",
    "exclusivity_pairs": "exclusivity",
    "exclusivity_heads": "exclusivity",
    "step_checkpoint": "train_timeline",
    "step_manifest": "train_timeline",
    "step_eval": "evaluate_step",
    "step_effects": "patch_step",
    "step_summary": "concentration_step",
    "step_heads": "concentration_step",
    "step_robustness": "concentration_step",
    "step_conditions": "concentration_step",
    "step_logo": "concentration_step",
    "step_lanes": "lanes_step",
    "step_pk": "geometry_step",
    "step_geometry_summary": "geometry_step",
    "step_geometry_heads": "geometry_step",
    "timeline": "dynamics",
    "tau": "dynamics",
    "value_gradients": "dynamics",
    "scalar_ablation": "scalar_ablation",
    "scalar_ablation_checkpoint": "scalar_ablation",
    "scalar_ablation_manifest": "scalar_ablation",
    "ablation_means": "ablation_atlas",
    "ablation_atlas": "ablation_atlas",
    "effects_mode": "patch_modes",
    "summary_mode": "concentration_mode",
    "heads_mode": "concentration_mode",
    "robustness_mode": "concentration_mode",
    "conditions_mode": "concentration_mode",
    "logo_mode": "concentration_mode",
    "lanes_mode": "lanes_mode",
    "ablation_modes": "compare_modes",
    "table_md": ("make_table", "make_document"),
    "table_csv": ("make_table", "make_document"),
    "table_tex": ("make_table", "make_document"),
    "table_sources": ("make_table", "make_document"),
    "figure_png": "make_figure",
    "figure_svg": "make_figure",
    "figure_csv": "make_figure",
    "figure_sources": "make_figure",
    "catalog": "catalog",
    "explorer": "explorer",
    "basis_family": "basis_family",
    "checks": "checks",
}

_WILDCARD = re.compile(r"\{(\w+)\}")


def _pattern(template: str) -> re.Pattern:
    """A template as a regex of a path's tail: numbers for {seed}/{step}, one path part for
    {model}, one dot-free name for the others (so sva.mean.parquet is no {task}.parquet)."""
    parts = _WILDCARD.split(template)
    wild = {"seed": r"\d+", "step": r"\d+", "model": r"[^/]+"}
    regex = "".join(
        re.escape(part) if i % 2 == 0 else wild.get(part, r"[^/.]+") for i, part in enumerate(parts)
    )
    return re.compile(rf"(?:^|/){regex}$")


_PATTERNS = {name: _pattern(TEMPLATES[name]) for name in PRODUCERS}


def template_key(path: str | os.PathLike) -> str | None:
    """The key of the path-table template ``path`` matches (its kind: checkpoint, effects,
    manifest, ...); None for a file no rule writes."""
    text = Path(path).as_posix()
    return next((name for name, pattern in _PATTERNS.items() if pattern.search(text)), None)


def producing_rules(path: str | os.PathLike) -> tuple[str, ...]:
    """The rule(s) whose output template ``path`` matches; () for a file no rule writes."""
    key = template_key(path)
    if key is None:
        return ()
    rules = PRODUCERS[key]
    return (rules,) if isinstance(rules, str) else rules


def rerun_hint(path: str | os.PathLike) -> str:
    """How to rebuild ``path``: its producing rule and the command that reruns it."""
    rules = producing_rules(path)
    if not rules:
        return f"rebuild {path} with the command that made it"
    return f"it is written by rule {' or '.join(rules)}: rerun `snakemake --forcerun {path}`"
