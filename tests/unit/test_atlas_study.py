"""The edit atlas's study kind (headgeom.atlas.study): the shipped config checks and fills its
defaults; a config the atlas cannot run is refused with one line naming the key."""

from __future__ import annotations

import copy

import pytest
import yaml

from headgeom import studies
from headgeom.atlas.study import AtlasStudy
from headgeom.validation import StudyConfigError

CONFIG = yaml.safe_load((studies.ROOT / "config" / "atlas-smollm2.yaml").read_text())


def test_the_shipped_config():
    study = studies.from_config(CONFIG)
    assert isinstance(study, AtlasStudy) and study.kind == "atlas"
    assert study.name == "atlas-smollm2" and study.shards == [0, 1]
    assert study.model_spec["format"] == "gguf"
    assert set(study.inputs_config()) == {"model", "corpora", "windows", "skills"}
    assert set(study.sweep_config()) == {"model", "edits", "sweep"}
    assert study.device == "cpu"


def test_defaults_are_filled():
    config = {"kind": "atlas", "study": "s", "model": {"format": "hf-causal-lm", "path": "m"},
              "corpora": [{"name": "code", "source": "stdlib"}]}  # fmt: skip
    study = AtlasStudy.from_config(config)
    assert study.config["windows"] == {"n_ctx": 128, "n_mean": 2, "n_scored": 2}
    assert study.config["edits"]["kinds"] == ["zero", "average", "rows_mean", "skip",
                                              "flatten_keys"]  # fmt: skip
    assert study.config["skills"]["tasks"] == ["sva", "quote", "plural"]
    assert study.shards == [0, 1] and study.config["corpora"][0]["seed"] == 0


def _with(change) -> dict:
    config = copy.deepcopy(CONFIG)
    change(config)
    return config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["model"].pop("path"), "format gguf needs path.*missing \\['path'\\]"),
        (lambda c: c["model"].update(repo_id="x/y"), "not taken \\['repo_id'\\]"),
        (lambda c: c["corpora"].append({"name": "code", "source": "pydoc"}),
         "names \\['code'\\] occur more than once"),
        (lambda c: c["corpora"].append({"name": "notes", "source": "file"}),
         "a file corpus needs a path"),
        (lambda c: c["corpora"].append({"name": "m2", "source": "domain"}),
         "a domain corpus needs a domain"),
        (lambda c: c["corpora"].append({"name": "c2", "source": "stdlib", "path": "x"}),
         "source stdlib takes no \\['path'\\]"),
        (lambda c: c["edits"].update(kinds=["erase"]), "erase"),
        (lambda c: c["windows"].update(n_ctx=4), "n_ctx"),
        (lambda c: c["skills"].update(n_items=6), "n_items"),
        (lambda c: c.update(sweeps={}), "sweeps"),
        (lambda c: c["resources"].update(atlas_swep={"mem_mb": 1000}), "atlas_swep"),
    ],
)  # fmt: skip
def test_refusals(change, message):
    with pytest.raises(StudyConfigError, match=message):
        study = studies.from_config(_with(change))
        study.check_rules(["atlas_inputs", "atlas_profile", "atlas_sweep", "atlas_report"])


def test_the_page_names_the_model_by_its_file():
    # the shipped GGUF file's name less .gguf; a Hub model by its repository
    assert AtlasStudy.from_config(CONFIG).model_name == "SmolLM2-135M-Instruct.Q4_1"
    hub = {**CONFIG, "model": {"format": "hub", "repo_id": "org/lm", "revision": "a" * 40}}
    assert AtlasStudy.from_config(hub).model_name == "org/lm"
    assert AtlasStudy.from_config(CONFIG).page_optional() == ["compression"]
    off = {**CONFIG, "compression": {**CONFIG.get("compression", {}), "enabled": False}}
    assert AtlasStudy.from_config(off).page_optional() == []


# ------------------------------------------------------------------ two checkpoints
DEMO = yaml.safe_load((studies.ROOT / "config" / "atlas-demo.yaml").read_text())
RUN = {"format": "checkpoint", "path": "results/demo/models/learned/s42"}


def test_the_demo_config_reads_our_checkpoints():
    study = studies.from_config(DEMO)
    assert study.model_spec["format"] == "checkpoint" and study.model_name == "learned/s42"
    assert study.model_files() == ["results/demo/models/learned/s42/model.safetensors",
                                   "results/demo/models/learned/s42/manifest.json"]  # fmt: skip
    assert study.pairs == ["timeline", "flip-sva"] and study.fine_tuned_pairs == ["flip-sva"]
    # the timeline's A is a step checkpoint, its manifest beside it
    assert study.pair_files("timeline", "a")[1].endswith("checkpoints/step000128.manifest.json")
    # the fine-tuned B is the run folder rule atlas_pair_fine_tune writes
    assert study.pair_files("flip-sva", "b") == [
        "results/atlas-demo/atlas/pairs/flip-sva/tuned/model.safetensors",
        "results/atlas-demo/atlas/pairs/flip-sva/tuned/manifest.json"]  # fmt: skip
    # flip-sva's A is the study's model: it scores on the study's windows and probes
    assert study.pair_shares_inputs("flip-sva") and not study.pair_shares_inputs("timeline")
    cfg = study.pair_config("flip-sva")
    assert cfg["alphas"][0] == -0.25 and cfg["alphas"][-1] == 1.5 and {0, 1} <= set(cfg["alphas"])
    assert study.pair_fine_tune_config("flip-sva")["task_seed"] == 101  # sva: skills.seed + 0
    assert study.pair_inputs_config("timeline")["model"] == DEMO["pairs"][0]["a"] | {
        "allow_pickle": False}  # fmt: skip


def test_missing_demo_checkpoints_say_run_the_demo_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/demo here
    study = studies.from_config(DEMO)
    missing = study.missing_checkpoints()
    assert "results/demo/models/learned/s42/model.safetensors" in missing
    assert not any("atlas-demo" in f for f in missing)  # B made here is not missing
    assert "run the default demo first: snakemake --cores all" in study.missing_note()
    for f in missing:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("x")
    assert study.missing_checkpoints() == [] and study.missing_note() is None


def _pair(**pair) -> dict:
    return {**copy.deepcopy(DEMO), "pairs": [{"name": "p", "a": dict(RUN), **pair}]}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_pair(), "give checkpoint B as b .* or have it made here"),
        (_pair(b=RUN, fine_tune={}), "exactly one of them"),
        (_pair(b=RUN, alphas=[0.0, 0.5]), "alphas: must include 0 \\(A\\) and 1 \\(B\\)"),
        (_pair(b={"format": "checkpoint", "path": "m.bin"}), "pairs\\[0\\] \\(p\\).b.path"),
        (_pair(b={"format": "gguf"}), "pairs\\[0\\] \\(p\\).b: format gguf needs path"),
        ({**_pair(), "pairs": [{"name": "p", "a": {"format": "hf-causal-lm", "path": "d"},
                                "fine_tune": {}}]}, "fine-tunes one of our own checkpoints"),
        (_pair(fine_tune={"task": "sva"}) | {"skills": {"tasks": ["quote"]}},
         "fine_tune.task: 'sva' is not among skills.tasks"),
        ({**_pair(b=RUN), "pairs": [{"name": "p", "a": RUN, "b": RUN}] * 2},
         "names \\['p'\\] occur more than once"),
        (_pair(b=RUN, alphas=[0, 1, 1]), "alphas"),
        (_pair(b=RUN, lowrank={"fractions": [1.5]}), "fractions"),
    ],
)  # fmt: skip
def test_pair_refusals(config, message):
    with pytest.raises(StudyConfigError, match=message):
        studies.from_config(config)
