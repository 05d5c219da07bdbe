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
