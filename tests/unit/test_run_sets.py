"""The run-set table (headgeom.heads.run_sets): each set's config key is a key of the schema, the
defaults are the paper's, and the one resolver refuses what it cannot resolve."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from headgeom.heads import run_sets
from headgeom.heads.study import SCHEMA, Study, StudyConfigError

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())


def test_every_config_key_of_a_run_set_is_in_the_schema():
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    for spec in run_sets.RUN_SETS.values():
        for key in filter(
            None, (spec.config, None if spec.seeds in ("all", "first") else spec.seeds)
        ):
            block, name = key.split(".")
            assert name in schema[block]["properties"], f"{spec.name}: {key}"
        assert all(part in run_sets.RUN_SETS for part in spec.union), spec.name


def test_an_unknown_run_set_names_the_known():
    study = Study.from_config(load("config"))
    with pytest.raises(KeyError, match="no run set 'edge'; known: .*'edges'"):
        study.run_set("edge")


def test_acdc_is_the_first_seed_of_the_edge_runs_of_its_geometries():
    paper = Study.from_config(load("paper"))
    edges = paper.run_set("edges")
    assert paper.run_set("acdc") == [("all-rotated", 42)]
    assert set(paper.run_set("acdc")) <= set(edges)
    # multiscreen models have no Q/K/V readers for the edge engine: never edge runs
    assert not [m for m, _ in edges if m.startswith("multiscreen")]


def test_switches_and_seeds_come_from_the_config():
    config = load("config")
    demo = Study.from_config(config)
    off = copy.deepcopy(config)
    off["ablation"]["atlas"] = False
    assert demo.run_set("ablation_atlas") and Study.from_config(off).run_set("ablation_atlas") == []
    every = copy.deepcopy(config)
    every.setdefault("coordinates", {})["first_seeds"] = False
    firsts = copy.deepcopy(config)
    firsts.setdefault("coordinates", {})["first_seeds"] = True
    all_seeds = Study.from_config(every).run_set("coordinates")
    first = Study.from_config(firsts).run_set("coordinates")
    assert set(first) < set(all_seeds) and {m for m, _ in first} == {m for m, _ in all_seeds}
    assert len({m for m, _ in first}) == len(first)


def test_a_named_run_set_is_checked_model_and_seed():
    config = load("config")
    config["edges"] = {**config.get("edges", {}), "models": ["all-rotatd"]}
    with pytest.raises(StudyConfigError, match=r"config edges.models\[0\]: unknown model "
                       r"'all-rotatd' \(did you mean 'all-rotated'\?\)"):  # fmt: skip
        Study.from_config(config)


def test_a_pretrained_causal_lm_gets_only_the_analyses_its_architecture_has(tmp_path):
    """A tiny Llama imported as itself (hf-causal-lm): the registry refuses edges and
    coordinates on its architecture, so their defaults leave it out (the paper outputs that
    read them are then not made) and naming it is an error; clamps take it."""
    pytest.importorskip("transformers")
    from headgeom.heads.paper.plan import PaperPlan
    from tests.helpers.hf import save_tiny_llama

    save_tiny_llama(tmp_path / "llama", seed=0)
    config = yaml.safe_load((REPO / "tests" / "e2e" / "import_llama.yaml").read_text())
    spec = {"format": "hf-causal-lm", "path": str(tmp_path / "llama")}
    config["models"] = {"llama": {"import": spec, "seeds": [0]}}
    study = Study.from_config(config)
    assert study.run_set("runs") == [("llama", 0)]
    for name in ("edges", "coordinates"):
        assert study.run_set(name) == [], name
    assert study.run_set("clamp_figure8") == [("llama", 0)]  # clamps run on it
    plan = PaperPlan(study)
    assert not {"table7", "coordinates"} & set(plan.tables)
    assert "coordinate_shares" not in plan.figures and "table3" in plan.tables
    config["edges"] = {**config["edges"], "models": ["llama"]}
    lacks = r"model 'llama' cannot run edges: architecture 'hf-causal-lm' lacks"
    with pytest.raises(StudyConfigError, match=rf"edges.models\[0\]: {lacks}"):
        Study.from_config(config)
