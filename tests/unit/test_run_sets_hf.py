"""Which analyses a study runs on an imported transformers causal LM (headgeom.heads.run_sets with
the registry's analysis_refusal): leakage and clamps where defined, edges and coordinate
concentration left out with the reason recorded, Gemma's leakage refused, and a config entry
naming a refused model an error that says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers")

from headgeom.heads.study import Study, StudyConfigError  # noqa: E402
from headgeom.model import facts, registry  # noqa: E402
from tests.helpers.hf_models import save_tiny_family  # noqa: E402

E2E = Path(__file__).resolve().parents[1] / "e2e"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: (save_tiny_family(root / f, f), root / f)[1] for f in ("llama", "gemma2")}


def study_of(folder, **blocks) -> Study:
    cfg = yaml.safe_load((E2E / "import_llama.yaml").read_text())
    cfg["models"]["llama-tiny"]["import"]["path"] = str(folder)
    cfg.update(blocks)
    return Study.from_config(cfg)


def test_a_llama_gets_leakage_and_clamps_and_no_edges_with_the_reason(folders):
    study = study_of(folders["llama"])
    run = [("llama-tiny", 0)]
    assert study.run_set("leakage") == run
    assert study.run_set("clamp_pairs") == run and study.run_set("clamp_both_orders") == run
    assert study.run_set("edges") == [] and study.run_set("coordinates") == []
    skipped = {s["run_set"]: s for s in study.skipped_analyses}
    assert set(skipped) == {"edges", "coordinates"}
    assert "lacks the Q/K/V readers the edge engine re-evaluates" in skipped["edges"]["reason"]
    assert skipped["edges"]["model"] == "llama-tiny"
    # the run logs' tables count it as the study does: an imported model, geometry learned
    assert facts.study_geometry(study.model_config("llama-tiny")) == facts.IMPORTED_GEOMETRY
    assert study.models["llama-tiny"]["geometry"] == facts.IMPORTED_GEOMETRY


def test_a_gemma_gets_no_leakage_and_says_why(folders):
    study = study_of(folders["gemma2"])
    assert study.run_set("leakage") == []
    assert study.run_set("clamp_pairs") == [("llama-tiny", 0)]  # clamps are defined on it
    reason = {s["run_set"]: s["reason"] for s in study.skipped_analyses}["leakage"]
    assert "post_attention_layernorm" in reason and "C8/C9" in reason


def test_naming_a_refused_model_in_the_config_is_an_error_with_the_reason(folders):
    with pytest.raises(StudyConfigError, match="cannot run leakage: .*post_attention_layernorm"):
        study_of(folders["gemma2"], leakage={"models": ["llama-tiny"]})
    with pytest.raises(StudyConfigError, match="cannot run edges: .*edge engine"):
        study_of(folders["llama"], edges={"models": ["llama-tiny"], "n_examples": 8})


def test_the_registry_answers_for_our_geometries_as_the_geometry_facts_do():
    from headgeom.model import zoo  # builds geometry configs: torch, as the registry

    # every geometry exists at this size (routed and multiscreen controls need 3 | n_head)
    arch = {"n_layer": 4, "n_head": 3, "d_model": 48, "d_head": 16, "d_mlp": 96, "n_ctx": 16}
    answers = {}
    for name in registry.geometry_names():
        cfg = zoo.derive_model_config(name, arch, None)
        answers[name] = registry.analysis_refusal(cfg, "leakage") is None
        assert answers[name] == facts.has_shared_ln1(name), name
        edges = registry.analysis_refusal(cfg, "edges") is None
        assert edges == (facts.facts(name).architecture == "gpt"), name
    assert True in answers.values() and False in answers.values()
    with pytest.raises(ValueError, match="no engine needs recorded for analysis 'lanes'"):
        registry.analysis_refusal(cfg, "lanes")
