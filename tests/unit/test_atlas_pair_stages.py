"""The two-checkpoint stages in one process on our own tiny checkpoints (format
``checkpoint``), with the configs AtlasStudy gives them: a timeline pair (a write-common
checkpoint at a step against a later one) and a pair whose B is fine-tuned here from a learned
A. B's checkpoint is written verified and names A; the views' tables follow the results
contract, score their ends exactly, and the report says where the probes switch; a pair whose
tensors differ in shape is refused naming the tensor."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headgeom.atlas import model_source as ms
from headgeom.atlas import results as atlas_results
from headgeom.atlas.stages import (
    inputs,
    pair_blend,
    pair_drift,
    pair_fine_tune,
    pair_grafts,
    pair_lowrank,
    pair_report,
)
from headgeom.atlas.study import AtlasStudy
from headgeom.hashing import ManifestMismatchError, load_manifest, sha256_file
from headgeom.io import read_parquet_metadata, read_table
from tests.helpers import atlas_checkpoints as ours
from tests.helpers.models import perturbed

pytest.importorskip("transformers", reason="the atlas's model sources need transformers [dev]")
ALPHAS = [-0.5, 0.0, 0.5, 1.0]


def _study(root) -> AtlasStudy:
    learned = {"format": "checkpoint", "path": str(root / "learned")}
    steps = root / "wc" / "checkpoints"
    return AtlasStudy.from_config({
        "kind": "atlas", "study": "s", "model": learned,
        "corpora": [{"name": "demo", "source": "demo", "seed": ours.CORPUS_SEED}],
        "windows": {"n_ctx": 16, "n_mean": 1, "n_scored": 2},
        "skills": {"tasks": ["sva"], "n_items": ours.N_ITEMS, "seed": ours.TASK_SEED},
        "sweep": {"batch_size": 2, "kl_chunk": 7, "probe_rows": 3},
        "pairs": [
            {"name": "timeline", "alphas": ALPHAS,
             "a": {"format": "checkpoint", "path": str(steps / "step000002.safetensors")},
             "b": {"format": "checkpoint", "path": str(steps / "step000008.safetensors")},
             "lowrank": {"ks": [1, 16], "fractions": [0.5]}},
            {"name": "tuned", "a": learned, "alphas": ALPHAS,
             "fine_tune": {"task": "sva", "n_items": ours.N_ITEMS, "steps": 12, "lr": 1e-2,
                           "batch_size": 4},
             "grafts": {"layers": False}, "lowrank": {"ks": [2], "fractions": [],
                                                      "minus_top": False}},
        ],
    })  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    ours.write_run(root / "learned", ours.tiny_gpt("learned", 0))
    early = ours.tiny_gpt("write-common", 1)
    late = perturbed(ours.tiny_gpt("write-common", 1), 9)  # the frozen basis is the same
    ours.write_checkpoint(root / "wc" / "checkpoints" / "step000002.safetensors", early, 2)
    ours.write_checkpoint(root / "wc" / "checkpoints" / "step000008.safetensors", late, 8)
    study = _study(root)
    study.results_dir = str(root / "results" / "s")  # B made here is written below it
    out = {}
    for pair in study.pairs:
        d = root / "out" / pair
        names = ("windows", "items", "blend", "probes", "grafts", "drift", "lowrank")
        out[pair] = {k: str(d / f"{k}.parquet") for k in names}
        out[pair]["report"] = str(d / "pair.md")
        assert inputs.main(["--config-json", json.dumps(study.pair_inputs_config(pair)),
                            "--out-windows", out[pair]["windows"],
                            "--out-probes", out[pair]["items"]]) == 0  # fmt: skip
    tuned = study.pair_files("tuned", "b")
    cfg = json.dumps(study.pair_fine_tune_config("tuned"))
    assert pair_fine_tune.main(["--config-json", cfg, "--out-checkpoint", tuned[0],
                                "--out-manifest", tuned[1]]) == 0  # fmt: skip
    for pair in study.pairs:
        o, cfg = out[pair], json.dumps(study.pair_config(pair))
        common = ["--config-json", cfg, "--windows", o["windows"], "--probes", o["items"]]
        assert (
            pair_blend.main([*common, "--out-blend", o["blend"], "--out-probes", o["probes"]]) == 0
        )
        assert pair_grafts.main([*common, "--out", o["grafts"]]) == 0
        assert pair_lowrank.main([*common, "--out", o["lowrank"]]) == 0
        drift = json.dumps(study.pair_drift_config(pair))
        assert pair_drift.main(["--config-json", drift, "--out", o["drift"]]) == 0
        assert pair_report.main(["--name", pair, *[f"--{t}={o[t]}" for t in
                                 ("blend", "probes", "drift", "grafts", "lowrank")],
                                 "--out", o["report"]]) == 0  # fmt: skip
    return root, study, out


def _read(out, pair, table):
    return read_table(out[pair][table]).to_pandas()


def test_b_is_fine_tuned_from_a_and_written_verified(run):
    root, study, _ = run
    checkpoint, manifest = study.pair_files("tuned", "b")
    record = load_manifest(manifest)
    a = load_manifest(root / "learned" / "manifest.json")
    assert record["checkpoint_file_sha256"] == sha256_file(checkpoint)
    assert record["parent"]["checkpoint_file_sha256"] == a["checkpoint_file_sha256"]
    edit = record["edit"]
    assert (
        edit["kind"] == "fine_tune"
        and edit["answer"] == "incorrect"
        and edit["split"] == "discovery"
    )
    assert len(edit["losses"]) == 12 and np.mean(edit["losses"][-3:]) < np.mean(edit["losses"][:3])
    model, vocab, _ = ms.read_checkpoint(study.pair_source("tuned", "b"))
    assert np.array_equal(vocab, ours.demo_vocab()) and model.cfg.geometry == "learned"


def test_the_tables_follow_the_contract_and_score_their_ends_exactly(run):
    _, study, out = run
    for pair in study.pairs:
        for table, contract in atlas_results.PAIR_TABLES.items():
            frame = _read(out, pair, table)
            assert list(frame.columns) == contract.names and (frame["pair"] == pair).all()
        blend = _read(out, pair, "blend").set_index(["alpha", "corpus"])
        assert sorted(set(blend.index.get_level_values(0))) == ALPHAS
        assert (
            blend.loc[(0.0, "demo"), "kl_to_a"] == 0.0
            and blend.loc[(1.0, "demo"), "kl_to_b"] == 0.0
        )
        assert blend.loc[(1.0, "mean"), "kl_to_a"] == blend.loc[(1.0, "demo"), "kl_to_a"] > 0
        kept = blend.loc[(0.0, "demo"), "retention"]
        assert kept == 1.0 or np.isnan(kept)  # A keeps its own right items
        probes = _read(out, pair, "probes")
        assert len(probes) == len(ALPHAS) * ours.N_ITEMS
        assert (probes["correct"] == (probes["answer"] == probes["expected"])).all()
        assert (probes["correct"] == (probes["lead"] > 0)).all()
        meta = json.loads(read_parquet_metadata(out[pair]["blend"])["sources"])
        assert (
            meta["a"]["format"] == "checkpoint" and len(meta["b"]["checkpoint_file_sha256"]) == 64
        )


def test_the_views_of_each_pair(run):
    _, _, out = run
    grafts = _read(out, "timeline", "grafts")
    assert {"b_into_a", "a_into_b"} == set(grafts["direction"])
    assert set(grafts.loc[grafts["part"] != "group", "part"]) == {"norms", "linear"}
    assert set(_read(out, "tuned", "grafts")["part"]) == {"group"}  # layers: false
    lowrank = _read(out, "timeline", "lowrank")
    assert set(lowrank["mode"]) == {"top", "random", "fraction", "minus_top"}
    full = lowrank[
        (lowrank["mode"] == "top") & (lowrank["k"] == 16) & (lowrank["corpus"] == "mean")
    ]
    assert full["delta_share"].iloc[0] == pytest.approx(1.0, rel=1e-5)  # 16 = the layers' rank
    assert lowrank.loc[lowrank["mode"] == "fraction", "k"].isna().all()
    drift = _read(out, "timeline", "drift")
    frozen = drift[drift["kind"] == "frozen"]
    assert len(frozen) and (frozen["drift"] == 0).all()  # write-common's basis never moves
    tuned = _read(out, "tuned", "drift")
    assert (tuned.loc[tuned["kind"] == "linear", "drift"] > 0).all()


def test_the_report_says_where_the_probes_switch(run):
    _, _, out = run
    text = open(out["timeline"]["report"], encoding="utf-8").read()
    headings = ("# Two checkpoints: timeline", "## The blend dial", "## Where the probes switch",
                "## Drift", "## Grafts", "## Is it a low-rank change?",
                "## The article's two-checkpoint numbers")  # fmt: skip
    for heading in headings:
        assert heading in text
    assert "near α ≈ 0.4" in text and "36.2%" in text  # the article's switch and drift, quoted
    assert "4.70 → 1.32 GB" not in text  # compression's records stay in the compression report


def test_a_changed_byte_of_b_is_refused_naming_the_file(run, tmp_path):
    _, study, out = run
    checkpoint, _ = study.pair_files("tuned", "b")
    original = open(checkpoint, "rb").read()
    broken = bytearray(original)
    broken[-3] ^= 0x01
    try:
        open(checkpoint, "wb").write(bytes(broken))
        with pytest.raises(ManifestMismatchError, match=rf"{checkpoint}: SHA-256 is"):
            pair_drift.main(["--config-json", json.dumps(study.pair_drift_config("tuned")),
                             "--out", str(tmp_path / "d.parquet")])  # fmt: skip
    finally:
        open(checkpoint, "wb").write(original)


def test_a_pair_of_other_shapes_is_refused_naming_the_tensor(tmp_path):
    ours.write_run(tmp_path / "a", ours.tiny_gpt("learned", 0))
    ours.write_run(tmp_path / "b", ours.tiny_gpt("learned", 0, d_mlp=32))
    cfg = {"name": "odd", "a": {"format": "checkpoint", "path": str(tmp_path / "a")},
           "b": {"format": "checkpoint", "path": str(tmp_path / "b")}}  # fmt: skip
    with pytest.raises(SystemExit, match=r"pair odd: A and B differ.*blocks\.0\.mlp\.c_fc\.weight"):
        pair_drift.main(["--config-json", json.dumps(cfg), "--out", str(tmp_path / "d.parquet")])
