"""The numerical acceptance checks (docs §18, headgeom.checks): the logged format, the
checks table of rule checks, and for every check logged by this module's stages a case that
passes and one that fails. Expected values are hand-computed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom import checks, results
from headgeom.data import tasks
from headgeom.data.tokenizer import load_gpt2_tokenizer
from headgeom.heads.analysis import concentration as conc
from headgeom.heads.analysis.geometry_summary import (
    designed_pk_metadata,
    designed_pk_tolerance,
    geometry_tables,
)
from headgeom.heads.analysis.param_counts import c1_metadata
from headgeom.heads.paper import cross_run_checks
from headgeom.heads.paper.outputs import TABLES
from headgeom.heads.stages import basis_family as basis_family_stage
from headgeom.heads.stages import checks as checks_stage
from headgeom.heads.stages import make_tasks
from headgeom.heads.study import Study
from headgeom.io import read_json, read_parquet_metadata, write_manifest, write_parquet
from headgeom.model import registry, zoo
from headgeom.run_config import parse_run_config
from headgeom.training.job import step0_regeneration

DEMO = {"n_layer": 4, "n_head": 4, "d_model": 64, "d_head": 16, "d_mlp": 256, "n_ctx": 64}
DEMO_BASIS = {"basis_m": 4, "basis_r": 4}  # config/config.yaml: D = 64 = 2^4 · 4


def parquet_with(path, metadata) -> str:
    """A one-row Parquet whose file metadata is ``metadata`` (as every stage writes it)."""
    write_parquet(path, pd.DataFrame({"x": [1]}), pa.schema([("x", pa.int64())]), metadata)
    return str(path)


# ----------------------------------------------------------------------------- the format
def test_record_and_parse_round_trip_through_parquet_metadata(tmp_path):
    meta = {
        **checks.record("C8", 3e-7, 1e-5),
        **checks.record("C11", 2e-10, 1e-9, "rel"),
        **checks.record("C7", 0, 0, "count", note="examples violating §8.1"),
        **checks.record("designed-pk", 12.0, 1e-12, enforced=False),
        **checks.record("C14", None, 1e-8),
    }
    assert meta["check_C8_max_abs_residual"] == 3e-7 and meta["check_C8_tolerance"] == 1e-5
    assert meta["check_C11_max_rel_residual"] == 2e-10 and meta["check_C7_mismatches"] == 0
    assert meta["check_designed-pk_enforced"] is False
    path = parquet_with(tmp_path / "f.parquet", meta)
    logged = checks.parse(read_parquet_metadata(path), path)  # values come back as JSON text
    assert logged["C8"].passed is True and logged["C8"].kind == "abs"
    assert logged["C11"].kind == "rel" and logged["C11"].passed is True
    assert logged["C7"].kind == "count" and logged["C7"].note == "examples violating §8.1"
    assert logged["designed-pk"].passed is False and logged["designed-pk"].enforced is False
    assert logged["C14"].residual is None and logged["C14"].passed is None


def test_residual_equal_to_the_tolerance_passes_and_nan_fails():
    assert checks.passes(1e-5, 1e-5) is True
    assert checks.passes(1.0000001e-5, 1e-5) is False
    assert checks.passes(float("nan"), 1.0) is False
    assert checks.passes(None, 1.0) is None


def test_enforce_raises_naming_the_file_and_reported_checks_do_not(tmp_path):
    where = tmp_path / "leakage.parquet"
    with pytest.raises(checks.CheckFailed, match=r"leakage\.parquet: check C8 failed.*2e-05"):
        checks.enforce("C8", 2e-5, 1e-5, where=where)
    out = checks.enforce("designed-pk", 12.0, 1e-12, enforced=False)
    assert out["check_designed-pk_enforced"] is False
    with pytest.raises(ValueError, match="unknown check 'C99'"):
        checks.record("C99", 0.0, 1.0)


def test_legacy_key_spellings_read_as_their_kind():
    logged = checks.parse(
        {
            "check_C12_max_abs_logit_residual": "1.9e-06",
            "check_C12_tolerance": "1e-06",
            "check_C10_max_abs_diff": "0.0",
            "check_C10_tolerance": "1e-05",
            "check_effects_max_abs_residual": "0.1",  # not a §18 check: ignored
        }
    )
    assert set(logged) == {"C10", "C12"}
    assert logged["C12"].passed is False and logged["C10"].passed is True


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"check_C8_max_abs_residual": "1e-7"}, "no 'check_C8_tolerance'"),
        ({"check_C8_tolerance": "1e-5"}, "no residual key"),
        ({"check_C8_max_abs_residual": '"small"', "check_C8_tolerance": "1e-5"}, "not a number"),
    ],
)
def test_incomplete_or_bad_keys_name_the_file_and_key(tmp_path, meta, match):
    path = parquet_with(tmp_path / "bad.parquet", meta)
    with pytest.raises((KeyError, ValueError), match=match) as err:
        checks.collect([{"kind": "leakage", "path": path}])
    assert "bad.parquet" in str(err.value)


# ----------------------------------------------------------------------------- collecting
def leakage_file(tmp_path, name, c8, c9=1e-7) -> str:
    meta = {**checks.record("C8", c8, 1e-5), **checks.record("C9", c9, 1e-5)}
    return parquet_with(tmp_path / name, meta)


def test_collect_passing_failing_and_missing(tmp_path):
    good = leakage_file(tmp_path, "good.parquet", 3e-7)
    bad = leakage_file(tmp_path, "bad.parquet", 2e-5)
    files = [
        {"kind": "leakage", "path": good, "model": "learned", "seed": 42, "task": "sva"},
        {"kind": "leakage", "path": bad, "model": "learned", "seed": 43, "task": "sva"},
    ]
    frame = checks.table(checks.collect(files))
    assert list(frame.columns) == results.CHECKS.names
    assert frame[["check", "seed", "passed"]].values.tolist() == [
        ["C8", 42, True],
        ["C8", 43, False],
        ["C9", 42, True],
        ["C9", 43, True],
    ]
    assert set(frame["rule"]) == {"leakage"} and frame.loc[1, "residual"] == 2e-5
    assert checks.failures(frame)["path"].tolist() == [bad]  # enforced and failed

    only_c8 = parquet_with(tmp_path / "c8.parquet", checks.record("C8", 1e-7, 1e-5))
    with pytest.raises(KeyError, match=r"c8\.parquet: no logged check C9.*rule leakage"):
        checks.collect([{"kind": "leakage", "path": only_c8}])


def test_reported_failures_do_not_stop_the_table(tmp_path):
    meta = {
        **checks.record("C14", None, 1e-8, note="writes do not decompose R^D orthogonally"),
        **checks.record("designed-pk", 12.0, 1e-12, enforced=False),
    }
    path = parquet_with(tmp_path / "geo.parquet", meta)
    frame = checks.table(checks.collect([{"kind": "geometry_summary", "path": path}]))
    assert frame["check"].tolist() == ["C14", "designed-pk"]
    assert frame["passed"].isna().tolist() == [True, False] and not frame.loc[1, "passed"]
    assert frame.loc[0, "note"] == "writes do not decompose R^D orthogonally"
    assert checks.failures(frame).empty


def test_json_artifacts_log_under_checks(tmp_path):
    manifest = tmp_path / "manifest.json"
    write_manifest(manifest, {"record_type": "checkpoint_manifest",
                          "checks": checks.record("C6", 0, 0, "count")})  # fmt: skip
    rows = checks.collect([{"kind": "manifest", "path": str(manifest), "model": "m", "seed": 1}])
    assert [(r["check"], r["rule"], r["passed"]) for r in rows] == [("C6", "hash_checkpoint", True)]


# ----------------------------------------------------------------------------- the script
def test_checks_script_writes_the_table_and_refuses_an_enforced_failure(tmp_path):
    good = leakage_file(tmp_path, "good.parquet", 3e-7)
    files = [{"kind": "leakage", "path": good, "model": "learned", "seed": 42, "task": "sva"}]
    runs = [{"model": "learned", "seed": 42, "geometry": "learned", "corpus": None}]
    out = tmp_path / "checks.parquet"
    script = checks_stage
    argv = ["--files-json", json.dumps(files), "--runs-json", json.dumps(runs), "--out", str(out)]
    assert script.main(argv) == 0
    frame = pq.read_table(out).to_pandas()
    assert pq.read_schema(out).names == results.CHECKS.names
    # C8, C9 from the file; C16 (two parts) computed; no loss order with one class
    assert frame["check"].tolist() == ["C8", "C9", "C16", "C16"]
    assert frame.loc[frame["check"] == "C16", "path"].isna().all()

    bad = leakage_file(tmp_path, "bad.parquet", 2e-5)
    files[0]["path"] = bad
    out.unlink()
    argv[1] = json.dumps(files)
    with pytest.raises(SystemExit, match=r"C8 .*bad\.parquet: residual 2e-05 > 1e-05"):
        script.main(argv)
    assert not out.exists()


# ----------------------------------------------------------------------------- C16, §7.3
def test_c16_from_the_paper_numbers():
    models = cross_run_checks.paper_figure4()
    assert models["write-routed-a"] == (3.542, (18.9, 31.6, 20.3), 16)  # §6.1, Table 6
    assert models["learned"][0] == 3.508 and models["all-rotated-self"][0] == 3.753
    rows = {(r["check"], r["part"]): r for r in cross_run_checks.c16()}
    assert all(r["passed"] for r in rows.values())
    # by hand for the six 12-head models: loss ranks 1..6, N_eff ranks 5, 6, 4, 3, 2, 1,
    # Σd² = 68, ρ = 1 − 6·68/(6·35) = −0.94286
    rho_12 = 1 - 6 * 68 / (6 * 35)
    assert rows[("C16", "twelve-head")]["residual"] == pytest.approx(abs(rho_12 + 0.943))


def test_c16_fails_when_the_reference_numbers_change(monkeypatch):
    swapped = dict(cross_run_checks.paper_figure4_n_eff())
    # exchange the N_eff of learned and all-rotated-self: the 12-head ranks become 1, 6, 4,
    # 3, 2, 5 against losses 1..6, Σd² = 0+16+1+1+9+1 = 28, ρ = 1 − 6·28/210 = 0.2
    swapped["learned"], swapped["all-rotated-self"] = (
        swapped["all-rotated-self"],
        swapped["learned"],
    )
    monkeypatch.setattr(cross_run_checks, "paper_figure4_n_eff", lambda: swapped)
    rows = {r["part"]: r for r in cross_run_checks.c16()}
    assert rows["twelve-head"]["passed"] is False
    assert rows["twelve-head"]["residual"] == pytest.approx(abs(0.2 + 0.943))


def loss_run(model, geometry, loss, corpus="S", paper_size=True, seed=42, trained=True):
    return {"model": model, "seed": seed, "geometry": geometry, "corpus": corpus,
            "val_loss": loss, "paper_size": paper_size, "paper_training": trained}  # fmt: skip


def test_loss_order_by_corpus():
    runs = [
        loss_run("learned", "learned", 3.508),
        loss_run("rot", "write-rotated", 3.563),
        loss_run("hb", "read-common", 3.610),
        loss_run("all", "all-rotated", 3.751),
        loss_run("routed", "write-routed-a", 3.542),  # no class of §7.3: not compared
        loss_run("learned-r", "learned", 3.604, corpus="R"),
        loss_run("wca-r", "write-common-axis", 3.643, corpus="R"),
    ]
    rows = {r["scope"]: r for r in cross_run_checks.loss_order(runs)}
    assert rows["corpus S"]["residual"] == 0 and rows["corpus S"]["passed"] is True
    assert rows["corpus S"]["enforced"] is True and rows["corpus R"]["passed"] is True
    assert rows["corpus S"]["note"].startswith("4 runs")

    # read-common below write-rotated: one out-of-order pair (write-* ≥ read-common)
    runs[2] = loss_run("hb", "read-common", 3.55)
    rows = {r["scope"]: r for r in cross_run_checks.loss_order(runs)}
    assert rows["corpus S"]["residual"] == 1 and rows["corpus S"]["passed"] is False
    assert "rot s42 3.5630 ≥ hb s42 3.5500" in rows["corpus S"]["note"]
    # a toy-sized run in the comparison: reported, not enforced
    runs[0] = loss_run("learned", "learned", 3.508, paper_size=False)
    rows = {r["scope"]: r for r in cross_run_checks.loss_order(runs)}
    assert rows["corpus S"]["enforced"] is False
    # paper size but a rehearsal's few steps: reported, not enforced
    runs[0] = loss_run("learned", "learned", 3.508, trained=False)
    rows = {r["scope"]: r for r in cross_run_checks.loss_order(runs)}
    assert rows["corpus S"]["enforced"] is False and rows["corpus R"]["enforced"] is True


def test_loss_runs_read_the_run_logs_and_the_paper_size(tmp_path):
    paper = {"steps": 65_536, "batch_size": 32}  # docs §7
    log = parquet_with(tmp_path / "log.parquet", {"val_loss_nats": 3.5,
                                                  "config": {"training": paper}})  # fmt: skip
    rehearsal = {"steps": 4, "batch_size": 1}
    short_meta = {"val_loss_nats": 8.5, "config": {"training": rehearsal}}
    short = parquet_with(tmp_path / "short.parquet", short_meta)
    counts = tmp_path / "param_counts.parquet"
    frame = pd.DataFrame({c: [None] for c in results.PARAM_COUNTS.names})
    frame = frame.assign(model="m", seed=1, expected_n_params=124_046_592)
    for column in ("n_params", "expected_n_params", "n_frozen", "n_vocab"):
        frame[column] = frame[column].astype("Int64")
    results.PARAM_COUNTS.write(counts, frame, checks.record("C1", 0, 0))
    files = [
        {"kind": "train_log", "path": log, "model": "m", "seed": 1},
        {"kind": "train_log", "path": short, "model": "k", "seed": 1},
        {"kind": "param_counts", "path": str(counts)},
    ]
    runs = [{"model": "m", "seed": 1, "geometry": "learned", "corpus": None},
            {"model": "n", "seed": 1, "geometry": "learned", "corpus": None},
            {"model": "k", "seed": 1, "geometry": "learned", "corpus": None}]  # fmt: skip
    got = cross_run_checks.loss_runs(files, runs)
    assert [(r["val_loss"], r["paper_size"], r["paper_training"]) for r in got] == [
        (3.5, True, True), (None, False, False), (8.5, False, False)]  # fmt: skip


# ----------------------------------------------------------------------------- C1
def test_c1_residual_is_the_largest_count_difference():
    frame = pd.DataFrame(
        {"n_params": [100, 200, 300], "expected_n_params": [100, 190, None]}
    ).astype("Int64")
    logged = checks.parse(c1_metadata(frame))["C1"]
    assert logged.residual == 10 and logged.passed is False and logged.tolerance == 0
    assert logged.note.startswith("2 of 3 runs")
    none = frame.assign(expected_n_params=pd.array([None] * 3, dtype="Int64"))
    assert checks.parse(c1_metadata(none))["C1"].passed is None  # away from the paper's size


# ----------------------------------------------------------------------------- C7
@pytest.fixture(scope="module")
def sva():
    tok = load_gpt2_tokenizer()
    cfg = {"seed": 7, "splits": {"discovery": 8, "validation": 8, "evaluation": 8, "holdout": 4}}
    frame, _ = tasks.generate_task("sva", tok, cfg)
    return tok, frame


def test_c7_counts_examples_that_violate_the_prompt_rules(sva):
    tok, frame = sva
    assert tasks.c7_mismatches(frame, tok) == 0
    bad = frame.copy()
    bad.at[0, "diff_position"] = bad.at[0, "diff_position"] + 1  # not where they differ
    ids = list(bad.at[1, "ref_ids"])
    bad.at[1, "ref_ids"] = ids[:-1]  # one token shorter
    bad.at[2, "correct_text"] = bad.at[2, "correct_text"] + " and"  # two tokens
    assert tasks.c7_mismatches(bad, tok) == 3


def test_make_tasks_logs_c7(tmp_path):
    out = tmp_path / "sva.parquet"
    config = {"seed": 7, "splits": {"discovery": 8, "validation": 8, "evaluation": 8,
                                    "holdout": 4}}  # fmt: skip
    assert make_tasks.main(["--task", "sva", "--config-json",
                                           json.dumps(config), "--out", str(out)]) == 0  # fmt: skip
    rows = checks.collect([{"kind": "task", "path": str(out), "task": "sva"}])
    assert [(r["check"], r["residual"], r["passed"]) for r in rows] == [("C7", 0.0, True)]


# ----------------------------------------------------------------------------- C10
def test_c10_compares_the_effects_file_with_what_is_written(tmp_path):
    # 2 examples × 1 layer × 2 heads: drops (1, 3) and (3, −1): e = (2, 1), E = 3,
    # p = (2/3, 1/3), N_eff = exp(H(p)) = 3 / 2^(2/3)
    rows = [
        {"model": "m", "seed": 1, "task": "sva", "split": "evaluation", "example_id": x,
         "condition": "A", "lexical_group": "g", "layer": 0, "head": h, "clean_ld": 0.0,
         "patched_ld": -v, "effect": v}
        for x, drops in enumerate([(1.0, 3.0), (3.0, -1.0)])
        for h, v in enumerate(drops)
    ]  # fmt: skip
    path = tmp_path / "effects.parquet"
    results.EFFECTS.write(path, pd.DataFrame(rows))
    out = conc.concentration_tables(pd.DataFrame(rows), 1, 2, "evaluation", None, str(path))
    assert out.heads["e"].tolist() == [2.0, 1.0]
    assert out.summary.loc[0, "N_eff"] == pytest.approx(3 / 2 ** (2 / 3))
    assert conc.check_c10(path, out.heads, out.summary, 1, 2) < 1e-12
    tampered = out.heads.assign(e=[2.0, 1.25])  # a per-head mean that is not the mean
    assert conc.check_c10(path, tampered, out.summary, 1, 2) == pytest.approx(0.25)
    summary = out.summary.assign(N_eff=out.summary["N_eff"] + 1e-4)
    residual = conc.check_c10(path, out.heads, summary, 1, 2)
    assert residual == pytest.approx(1e-4, rel=1e-6)
    with pytest.raises(checks.CheckFailed, match="check C10 failed"):
        checks.enforce("C10", residual, conc.C10_TOLERANCE, where=path)


# ----------------------------------------------------------------------------- C15
def run_config(geometry="write-rotated"):
    params = DEMO_BASIS if geometry in ("write-rotated", "all-rotated-self") else None
    model = zoo.derive_model_config(geometry, DEMO, params)
    training = {
        "steps": 2,
        "batch_size": 2,
        "lr_max": 1e-3,
        "lr_min": 1e-4,
        "warmup_steps": 1,
        "checkpoint_steps": [],
        "eval_every": 1,
        "eval_batch_size": 2,
    }
    return parse_run_config({"model_name": geometry, "seed": 3, "data_seed": 1729,
                             "model": model, "training": training})  # fmt: skip


def test_c15_step0_regeneration_is_byte_identical_and_a_change_fails():
    from headgeom.training.loop import initial_model

    run = run_config()
    vocab = np.arange(50, dtype=np.int64)
    model = initial_model(run, n_vocab=50)
    logged = checks.parse(step0_regeneration(run, model, vocab))["C15"]
    assert logged.residual == 0 and logged.kind == "count"
    after = torch.get_rng_state()
    torch.manual_seed(run.seed)
    registry.build_model(run.model_config(50))
    assert torch.equal(after, torch.get_rng_state())  # training continues unchanged
    with torch.no_grad():
        model.blocks[0].mlp.c_fc.weight[0, 0] += 1e-7  # one parameter, one ulp-scale change
    with pytest.raises(checks.CheckFailed, match="check C15 failed"):
        step0_regeneration(run, model, vocab)


# ----------------------------------------------------------------------------- designed PK
def demo_model(geometry):
    params = DEMO_BASIS if geometry in ("write-rotated", "all-rotated-self", "all-rotated",
                                        "write-common") else None  # fmt: skip
    torch.manual_seed(0)
    return registry.build_model(zoo.derive_model_config(geometry, DEMO, params), 50)


@pytest.mark.parametrize(
    "geometry, pairs",
    [
        ("write-common-axis", 6 * 16),  # C(4, 2) layer pairs × 4² head pairs
        ("write-rotated", 6 * 16),
        ("all-rotated-self", 6 * 16 + 10 * 16),  # + write l vs reader l' ≥ l
        ("learned", 0),
    ],
)
def test_designed_pk_holds_on_the_designed_models(geometry, pairs):
    geo = geometry_tables(demo_model(geometry), geometry, 0, "ckpt")
    assert geo.designed_pk_pairs == pairs
    if pairs == 0:
        assert geo.designed_pk_residual is None
    else:
        assert geo.designed_pk_residual <= designed_pk_tolerance(64, 16)


def test_designed_pk_fails_on_a_wrong_member_and_is_enforced_at_paper_size_only():
    model = demo_model("write-rotated")
    with torch.no_grad():  # layer 1 writes member 2 (layer 2's) instead of member 1
        model.blocks[1].attn.writer.basis.copy_(model.blocks[2].attn.writer.basis)
    geo = geometry_tables(model, "write-rotated", 0, "ckpt")
    # layers 1 and 2 now share one member: same-index PK d = 16 where the design has the
    # demo family's uniform cross-member PK d²/D = 4 (m = 4, r = 4: d/r columns per class)
    assert geo.designed_pk_residual == pytest.approx(16 - 4, abs=1e-9)
    reported = checks.parse(designed_pk_metadata(geo, 64, 16, paper_size=False))["designed-pk"]
    assert reported.passed is False and reported.enforced is False
    with pytest.raises(checks.CheckFailed, match="check designed-pk failed"):
        designed_pk_metadata(geo, 64, 16, paper_size=True)


def test_designed_pk_tolerance_is_derived_from_float64():
    eps = np.finfo(np.float64).eps
    assert designed_pk_tolerance(768, 64) == pytest.approx(4 * 64 * 768 * eps)
    assert designed_pk_tolerance(768, 64) < 1e-9 < 1 / 256  # far below the designed gaps


# ----------------------------------------------------------------------------- basis family
def test_basis_family_file_and_its_checks(tmp_path):
    study = Study.from_config(_demo_config())
    runs = study.basis_family_models()
    assert [r["model"] for r in runs] == ["write-rotated", "all-rotated", "all-rotated-self",
                                          "write-common"]  # fmt: skip
    out = tmp_path / "basis_family.json"
    assert basis_family_stage.main(["--runs-json", json.dumps(runs),
                                             "--out", str(out)]) == 0  # fmt: skip
    record = read_json(out)
    (family,) = record["families"]  # every demo model uses members 0..7 of D = 64
    cfg = registry.config_from_dict({**runs[0]["model_config"], "n_vocab": 1})
    assert family["basis_family_hash"] == registry.basis_family(cfg).family_hash
    assert {m["model"] for m in family["models"]} == {r["model"] for r in runs}
    rows = checks.collect([{"kind": "basis_family", "path": str(out)}])
    got = {(r["check"], r["part"]): r["passed"] for r in rows}
    assert list(got) == [("C2", None), ("C3", None), ("C3", "rejection"), ("C3", "range"),
                         ("C4", None), ("C5", None)]  # fmt: skip
    # C3.range and C5 apply at the paper's shape only
    assert got == {("C2", None): True, ("C3", None): True, ("C3", "rejection"): True,
                   ("C3", "range"): None, ("C4", None): True, ("C5", None): None}  # fmt: skip
    assert all(r["scope"].startswith("basis family D=64 d=16 8 members") for r in rows)
    by_model = {m["model"]: m for m in family["models"]}
    assert by_model["all-rotated"]["bases"] == {"write": [0, 1, 2, 3], "read": [4, 5, 6, 7]}


def _demo_config():
    import yaml

    return yaml.safe_load((Path(__file__).resolve().parents[2] / "config/config.yaml").read_text())


def test_study_lists_every_logged_artifact():
    study = Study.from_config(_demo_config())
    items = study.checks_inputs()
    kinds = {i["kind"] for i in items}
    assert kinds == set(checks.EXPECTED) - {"run_log"}
    n_runs = len(study.runs)
    count = {k: sum(i["kind"] == k for i in items) for k in kinds}
    assert count["summary"] == 3 * n_runs and count["manifest"] == n_runs
    assert count["leakage"] == 3 * len(study.run_set("leakage"))
    assert count["clamps"] == len(study.run_set("clamps"))


# ----------------------------------------------------------------------------- the document
def test_document_table_summarises_each_check(tmp_path):
    rows = checks.collect(
        [
            {"kind": "leakage", "path": leakage_file(tmp_path, "a.parquet", 3e-7), "seed": 1},
            {"kind": "leakage", "path": leakage_file(tmp_path, "b.parquet", 5e-6), "seed": 2},
        ]
    )
    meta = {**checks.record("C14", None, 1e-8),
            **checks.record("designed-pk", 12.0, 1e-12, enforced=False)}  # fmt: skip
    rows += checks.collect([{"kind": "geometry_summary",
                             "path": parquet_with(tmp_path / "g.parquet", meta)}])  # fmt: skip
    path = tmp_path / "checks.parquet"
    results.CHECKS.write(path, checks.table(rows))
    table = TABLES["checks"].function()({"checks": [str(path)]}, None)
    cells = table.blocks[0].cells.set_index("Check")
    assert cells.loc["C8", "Artifacts"] == "2" and cells.loc["C8", "Passed"] == "2/2"
    assert cells.loc["C8", "Largest residual"] == "5.00e-06"
    assert cells.loc["C14", "Passed"] == "—; 1 n/a"
    assert cells.loc["designed-pk", "Passed"] == "0/1 (1 failed, reported only)"
    assert "1 reported check(s) failed" in table.caption
    assert len(table.frame) == 6 and math.isnan(table.frame.loc[4, "residual"])  # C14 n/a
