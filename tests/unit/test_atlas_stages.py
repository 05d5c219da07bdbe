"""The edit atlas's stage scripts in one process, on a random tiny Llama written with its own
tokenizer (nothing downloaded): inputs (windows cut with the model's tokenizer, the skills'
items), the profile, two shards of the sweep and the merged report. The shards deal the
model's edit list between them; the merged tables hold every edit once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import artifacts, corpora, edits  # noqa: E402
from headgeom.atlas.blocks import AtlasModel  # noqa: E402
from headgeom.atlas.stages import inputs, profile, report, sweep  # noqa: E402
from headgeom.atlas.study import AtlasStudy  # noqa: E402
from headgeom.io import read_parquet_metadata, read_table  # noqa: E402
from headgeom.model.causal_import import source_of  # noqa: E402
from headgeom.model.families import UnsupportedFamilyError  # noqa: E402
from headgeom.model.sources import load_source  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402
from tests.helpers.hf import save_tiny_llama  # noqa: E402

CORPORA = [{"name": "demo", "source": "demo", "seed": 3},
           {"name": "math", "source": "domain", "domain": "math", "seed": 3}]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas")
    save_tiny_llama(root / "llama", seed=0)
    model = {"format": "hf-causal-lm", "path": str(root / "llama")}
    study = AtlasStudy.from_config({
        "kind": "atlas", "study": "t", "model": model,
        "corpora": CORPORA, "windows": {"n_ctx": 16, "n_mean": 2, "n_scored": 3},
        "skills": {"tasks": ["sva"], "n_items": 8},
        "edits": {"kinds": ["zero", "average", "rows_mean", "skip"]},
        "sweep": {"shards": 2, "batch_size": 2, "kl_chunk": 7, "probe_rows": 3},
    })  # fmt: skip
    out = {k: str(root / f"{k}.parquet") for k in
           ("windows", "probes", "profile", "effects", "retention", "summary")}  # fmt: skip
    assert (
        inputs.main(
            [
                "--config-json",
                json.dumps(study.inputs_config()),
                "--out-windows",
                out["windows"],
                "--out-probes",
                out["probes"],
            ]
        )
        == 0
    )
    cfg = json.dumps(study.sweep_config())
    profile_cfg = json.dumps(study.profile_config())
    assert profile.main(
        ["--config-json", profile_cfg, "--windows", out["windows"], "--out", out["profile"]]
    ) == 0  # fmt: skip
    for shard in (0, 1):
        assert (
            sweep.main(
                [
                    "--config-json",
                    cfg,
                    "--windows",
                    out["windows"],
                    "--probes",
                    out["probes"],
                    "--shard",
                    str(shard),
                    "--out-effects",
                    str(root / f"e{shard}.parquet"),
                    "--out-retention",
                    str(root / f"r{shard}.parquet"),
                ]
            )
            == 0
        )
    assert report.main(["--effects", str(root / "e0.parquet"), str(root / "e1.parquet"),
                        "--retention", str(root / "r0.parquet"), str(root / "r1.parquet"),
                        "--profile", out["profile"], "--top", "5",
                        "--out-effects", out["effects"], "--out-retention", out["retention"],
                        "--out-summary", out["summary"],
                        "--out-report", str(root / "atlas.md")]) == 0  # fmt: skip
    return root, study, out


def test_inputs_are_the_corpora_cut_with_the_models_tokenizer(run):
    root, study, out = run
    windows = read_table(out["windows"]).to_pandas()
    tok = transformers.AutoTokenizer.from_pretrained(root / "llama")
    for spec in corpora.specs_from_config(study.config["corpora"]):
        cut = corpora.tokenize_windows(spec, corpora.hf_encoder(tok), 16, 5, tok.bos_token_id,
                                       tok.eos_token_id, "t")  # fmt: skip
        mine = windows[windows["corpus"] == spec.name].sort_values("window")
        assert mine["role"].tolist() == ["means"] * 2 + ["scored"] * 3
        assert np.array_equal(np.stack(mine["ids"].to_numpy()), cut.ids)
    meta = json.loads(read_parquet_metadata(out["windows"])["corpora"])
    assert set(meta) == {"demo", "math"} and len(meta["demo"]["scored_sha256"]) == 64
    skills = artifacts.read_skills(out["probes"])
    assert [s.name for s in skills] == ["sva"] and len(skills[0]) == 8
    assert (skills[0].answer == 0).all() and skills[0].candidates.shape == (8, 2)


def test_the_shards_share_out_every_edit_once(run):
    root, study, out = run
    model, _ = artifacts.load_model(study.model_spec, torch.device("cpu"))
    labels = [e.label for e in edits.atlas_edits(model, ["zero", "average", "rows_mean", "skip"])]
    shard_edits = [json.loads(read_parquet_metadata(root / f"e{s}.parquet")["edits"])
                   for s in (0, 1)]  # fmt: skip
    assert shard_edits[0] == labels[0::2] and shard_edits[1] == labels[1::2]
    effects = read_table(out["effects"]).to_pandas()
    assert sorted(effects["edit"].unique()) == sorted(labels)
    assert len(effects) == 2 * len(labels) and (effects["n_positions"] == 3 * 15).all()
    summary = read_table(out["summary"]).to_pandas().set_index("edit")
    mean_kl = effects.groupby("edit")["kl"].mean()
    assert np.allclose(summary.loc[mean_kl.index, "kl"], mean_kl)
    kept = read_table(out["retention"]).to_pandas()
    assert len(kept) == len(labels) and (kept["n_items"] == 8).all()
    prof = read_table(out["profile"]).to_pandas()
    assert len(prof) == 2 * model.n_layer and np.isfinite(prof["write_size"]).all()
    text = (root / "atlas.md").read_text()
    assert "## The 5 edits that move predictions most" in text
    assert "## Size is not importance: Zero against Average" in text


def test_a_shard_outside_the_sweep_is_refused(run):
    root, study, out = run
    with pytest.raises(SystemExit):
        sweep.main(["--config-json", json.dumps(study.sweep_config()), "--windows",
                    out["windows"], "--probes", out["probes"], "--shard", "2",
                    "--out-effects", str(root / "x.parquet"),
                    "--out-retention", str(root / "y.parquet")])  # fmt: skip


@pytest.mark.parametrize("name", ["gemma4", "gemma3n"])
def test_a_ple_model_loads_from_a_directory(tmp_path, name):
    """Gemma 4 / 3n directories load as atlas models (the head-site families refuse them
    before reading a weight) and give the saved model's logits."""
    hf = tiny.BUILDERS[name]()
    hf.save_pretrained(tmp_path / name, safe_serialization=True)
    spec = {"format": "hf-causal-lm", "path": str(tmp_path / name)}
    model, record = artifacts.load_model(spec, torch.device("cpu"))
    assert model.ple is not None and record["family"] == name
    assert record["files_sha256"]["config.json"]
    ids = tiny.ids()
    torch.testing.assert_close(model.logits(ids), AtlasModel(hf).logits(ids), rtol=0, atol=0)
    with pytest.raises(UnsupportedFamilyError, match=f"{name}_text"):
        load_source(source_of(spec))
