"""The rehearsal study: config/paper.yaml with counts reduced (headgeom.config_layers), and
a DAG with every rule of the paper's."""

from __future__ import annotations

import re

import pytest
import yaml

from headgeom import config_layers
from headgeom.heads.study import Study
from headgeom.model import registry, zoo
from tests.e2e.conftest import REPO, make_workdir, planned_jobs, snakemake

PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
REHEARSAL_TEXT = (REPO / "config" / "rehearsal.yaml").read_text()
REHEARSAL = config_layers.resolve(yaml.safe_load(REHEARSAL_TEXT), REPO)

# What the rehearsal may change: counts, its name, its local corpus and its node's resources.
COUNTS = {
    ("training", k)
    for k in ("steps", "batch_size", "warmup_steps", "eval_every", "eval_batch_size",
              "checkpoint_steps", "resume_every")
} | {
    ("lanes", "n_permutations"), ("concentration", "n_bootstrap"),
    ("concentration", "n_permutations"), ("dynamics", "value_gradient_steps"),
    ("dynamics", "value_gradient_sequences"), ("dynamics", "ablation_draws"),
    ("edges", "n_examples"), ("coordinates", "n_random_sets"),
    ("corpus", "n_val_tokens"), ("corpus", "corpora", "R", "n_train_tokens"),
    ("corpus", "corpora", "S", "n_train_tokens"),
} | {("tasks", t, "splits") for t in ("sva", "quote", "plural")}  # fmt: skip
OTHER = {("study",), ("resources",), ("corpus", "source"), ("corpus", "dataset"),
         ("corpus", "dataset_config"), ("corpus", "revision")}  # fmt: skip
# Run sets the rehearsal may shrink, to one run of each architecture family the paper's set
# serves (test_rehearsal_analyses_cover_every_family_of_the_papers).
RUN_SETS = {
    ("leakage", "models"): lambda s: s.run_set("leakage"),
    ("clamps", "pairs_models"): lambda s: s.run_set("clamp_pairs"),
    ("clamps", "figure8_models"): lambda s: s.run_set("clamp_figure8"),
    ("clamps", "both_orders_models"): lambda s: s.run_set("clamp_both_orders"),
    ("clamps", "lumped_models"): lambda s: s.run_set("clamp_lumped"),
    ("dynamics", "ablation_models"): lambda s: s.run_set("dynamics_ablation"),
    ("edges", "models"): lambda s: s.run_set("edges"),
    ("coordinates", "models"): lambda s: s.run_set("coordinates"),
    ("coordinates", "first_seeds"): lambda s: s.run_set("coordinates"),
}


def leaves(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict) and v and (prefix + (k,)) not in COUNTS:
            yield from leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def lookup(d, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return KeyError
        d = d[k]
    return d


# ----------------------------------------------------------------------------- overlay
def test_overlay_merges_mappings_replaces_values_and_null_removes():
    base = {"a": {"x": 1, "y": [1, 2], "z": {"deep": 1}}, "b": 2, "c": 3}
    top = {"a": {"y": [9], "z": {"new": 2}}, "b": None, "d": 4}
    assert config_layers.overlay(base, top) == {
        "a": {"x": 1, "y": [9], "z": {"deep": 1, "new": 2}}, "c": 3, "d": 4,
    }  # fmt: skip
    assert base == {"a": {"x": 1, "y": [1, 2], "z": {"deep": 1}}, "b": 2, "c": 3}  # untouched


def test_extends_chains_and_refuses_cycles_and_missing_files(tmp_path):
    (tmp_path / "a.yaml").write_text("study: a\nx: {p: 1, q: 2}\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nstudy: b\nx: {q: 3}\n")
    assert config_layers.resolve({"extends": "b.yaml", "y": 1}, tmp_path) == {
        "study": "b", "x": {"p": 1, "q": 3}, "y": 1,
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text("extends: d.yaml\n")
    (tmp_path / "d.yaml").write_text("extends: c.yaml\n")
    with pytest.raises(ValueError, match="a cycle"):
        config_layers.resolve({"extends": "c.yaml"}, tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.yaml: no such file"):
        config_layers.resolve({"extends": "nope.yaml"}, tmp_path)


def test_replaces_takes_a_mapping_whole(tmp_path):
    (tmp_path / "a.yaml").write_text("r: {train: {gpu: 1, mem: 9}, other: {mem: 2}}\nk: {p: 1}\n")
    top = {"extends": "a.yaml", "replaces": ["r"], "r": {"train": {"mem": 3}}, "k": {"q": 2}}
    assert config_layers.resolve(top, tmp_path) == {
        "r": {"train": {"mem": 3}}, "k": {"p": 1, "q": 2},  # r replaced, k merged
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"\['s'\] named but not set"):
        config_layers.resolve({"extends": "a.yaml", "replaces": ["s"]}, tmp_path)
    with pytest.raises(ValueError, match="only a config that extends"):
        config_layers.resolve({"replaces": ["r"], "r": {}}, tmp_path)


# ----------------------------------------------------------------------------- rehearsal
def test_rehearsal_changes_counts_only_never_shapes():
    assert REHEARSAL["architecture"] == PAPER["architecture"]
    assert REHEARSAL["models"] == PAPER["models"]  # all 21 configurations
    assert REHEARSAL["corpus"]["compact_vocab"] is False  # the full 50,257 vocabulary
    changed = {
        path
        for tree, other in ((REHEARSAL, PAPER), (PAPER, REHEARSAL))
        for path, value in leaves(tree)
        if lookup(other, path) != value
    }
    assert changed, "the rehearsal must reduce something"
    outside = {
        p for p in changed if p not in COUNTS | OTHER | set(RUN_SETS) and p[0] != "resources"
    }
    assert not outside, sorted(outside)
    for path in COUNTS & changed:
        assert lookup(REHEARSAL, path) != lookup(PAPER, path)


def test_every_reduced_count_names_the_papers_value():
    # each count line of config/rehearsal.yaml carries "paper: <value>" (or its block does)
    for path in COUNTS:
        key = path[-1]
        lines = [ln for ln in REHEARSAL_TEXT.splitlines() if re.match(rf"\s*{key}:", ln)]
        assert lines, key
        assert all("paper" in ln or key == "splits" for ln in lines), lines
    assert "(paper: discovery 300, validation 240, evaluation 240, holdout 32)" in REHEARSAL_TEXT


def family(geometry: str) -> str:
    """The architecture family a run stands for: what its engines see (width, heads, reader
    kind, value adapter, the multiscreen architecture)."""
    config = zoo.paper_model_config(geometry)
    if registry.geometry(geometry).architecture == "multiscreen":
        return "multiscreen"
    if config["n_head"] != PAPER["architecture"]["n_head"]:
        return f"{config['n_head']}-head"
    if registry.reader_kind(geometry) == "block":
        return "block readers"
    if "value_adapter_width" in config["geometry_params"]:
        return "value adapter"
    return "GPT"


def test_rehearsal_analyses_cover_every_family_of_the_papers():
    paper, rehearsal = Study.from_config(PAPER), Study.from_config(REHEARSAL)

    def families(study, runs):
        return {family(study.config["models"][m]["geometry"]) for m, _ in runs}

    for path, runs_of in RUN_SETS.items():
        ours, theirs = runs_of(rehearsal), runs_of(paper)
        assert set(ours) <= set(theirs), path  # a subset of the paper's runs
        assert families(rehearsal, ours) == families(paper, theirs), path
    assert families(paper, paper.run_set("edges")) == {
        "GPT", "block readers", "16-head", "value adapter"
    }  # fmt: skip


@pytest.mark.e2e  # a Snakemake subprocess
def test_rehearsal_dag_has_every_rule_of_the_papers(tmp_path):
    def jobs(name, config):
        work = make_workdir(tmp_path / name, config)
        (work / "config").symlink_to(REPO / "config")
        return planned_jobs(snakemake(work, "-n", "--cores", "1"))

    paper = jobs("paper", PAPER)
    rehearsal = jobs("rehearsal", yaml.safe_load(REHEARSAL_TEXT))
    assert set(paper) <= set(rehearsal), sorted(set(paper) - set(rehearsal))
    # per-run rules outside the analyses' run sets: the paper's job counts
    for rule in ("train", "train_timeline", "hash_checkpoint", "patch_heads", "acdc", "dynamics"):
        assert rehearsal[rule] == paper[rule], rule
    assert rehearsal["train"] + rehearsal["train_timeline"] == 21
