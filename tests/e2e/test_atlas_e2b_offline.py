"""The real Gemma 4 E2B config (config/atlas-e2b.yaml), offline: Snakemake plans every rule
and says the Hub weights need network; the inputs stage then stops with the model source's
clear message; and the Hub checkpoint's multimodal model_type is refused by name."""

from __future__ import annotations

import json

import pytest
import yaml

from headgeom.atlas.blocks import anatomy_of
from headgeom.atlas.stages import inputs
from headgeom.atlas.study import AtlasStudy
from headgeom.model.families import UnsupportedFamilyError
from headgeom.model.sources import SourceError
from tests.e2e.conftest import REPO, make_workdir, planned_jobs, snakemake

pytestmark = pytest.mark.e2e
CONFIG = yaml.safe_load((REPO / "config" / "atlas-e2b.yaml").read_text())


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network call, whatever the machine has
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hub cache


def test_planning_offline_says_the_weights_need_network(offline, tmp_path):
    work = make_workdir(tmp_path / "w", CONFIG)
    proc = snakemake(work, "-n")
    assert "google/gemma-4-E2B" in proc.stderr and "need network access" in proc.stderr
    jobs = planned_jobs(proc)
    assert jobs["atlas_inputs"] == 1 and jobs["atlas_compression"] == 1
    assert jobs["atlas_sweep"] == CONFIG["sweep"]["shards"]


def test_running_offline_stops_at_the_model_with_a_clear_message(offline, tmp_path):
    study = AtlasStudy.from_config(CONFIG)
    with pytest.raises(SourceError, match="needs network access to the Hugging Face Hub"):
        inputs.main(["--config-json", json.dumps(study.inputs_config()),
                     "--out-windows", str(tmp_path / "w.parquet"),
                     "--out-probes", str(tmp_path / "p.parquet")])  # fmt: skip


def test_the_hubs_multimodal_gemma4_is_refused_by_name():
    with pytest.raises(UnsupportedFamilyError, match="'gemma4'.*multimodal"):
        anatomy_of("gemma4")  # Gemma4ForConditionalGeneration's config model_type
    assert anatomy_of("gemma4_text").ple is not None  # its text model, Gemma4ForCausalLM
