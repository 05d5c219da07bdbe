"""The concentration stage scripts on hand-made effects (docs §10.2–10.4, §12).

Effects Parquets are built here with known per-example drops, so every expected value
follows from the definitions (N_eff = exp H(|e|/E), e = mean drop) and not from the code.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headgeom import checks
from headgeom.heads.analysis.stats import concentration
from headgeom.heads.stages import compare_concentration, concentration_loss
from headgeom.heads.stages import concentration as concentration_stage
from headgeom.heads.stages import lanes as lanes_stage
from headgeom.io import read_parquet_metadata, write_manifest, write_parquet

#: What rule concentration passes from the config besides counts and seeds (schema defaults).
STUDY_FLAGS = ["--split", "evaluation", "--ci", "0.95", "--index-meaningful", "true"]

EFFECTS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
        ("example_id", pa.string()),
        ("condition", pa.string()),
        ("lexical_group", pa.string()),
        ("layer", pa.int32()),
        ("head", pa.int32()),
        ("clean_ld", pa.float64()),
        ("patched_ld", pa.float64()),
        ("effect", pa.float64()),
    ]
)


def write_effects(
    path,
    d,
    *,
    model="m",
    seed=1,
    task="sva",
    split="evaluation",
    ids=None,
    conditions=None,
    groups=None,
    dataset="ab" * 32,
    extra_splits=(),
):
    """An effects Parquet whose split ``split`` holds drops ``d`` (N, L, H)."""
    n, n_layers, n_heads = d.shape
    ids = [f"x{i:03d}" for i in range(n)] if ids is None else ids
    conditions = ["SS"] * n if conditions is None else conditions
    groups = ["g"] * n if groups is None else groups
    frames = []
    for name, drops in [(split, d), *extra_splits]:
        ex, layer, head = np.meshgrid(
            np.arange(len(drops)), np.arange(n_layers), np.arange(n_heads), indexing="ij"
        )
        ex, layer, head = ex.ravel(), layer.ravel(), head.ravel()
        effect = drops[ex, layer, head]
        frames.append(
            pd.DataFrame(
                {
                    "model": model,
                    "seed": seed,
                    "task": task,
                    "split": name,
                    "example_id": np.asarray(ids)[ex] if name == split else [f"o{i}" for i in ex],
                    "condition": np.asarray(conditions)[ex] if name == split else "SS",
                    "lexical_group": np.asarray(groups)[ex] if name == split else "g",
                    "layer": layer,
                    "head": head,
                    "clean_ld": 5.0,
                    "patched_ld": 5.0 - effect,
                    "effect": effect,
                }
            )
        )
    meta = {"n_layers": n_layers, "n_heads": n_heads, "task_dataset_sha256": dataset}
    write_parquet(path, pd.concat(frames, ignore_index=True), EFFECTS_SCHEMA, meta)
    return path


def run_concentration(tmp_path, effects, *extra):
    out = {
        k: tmp_path / f"{k}.parquet"
        for k in ("summary", "heads", "robustness", "conditions", "logo")
    }
    argv = [
        "--effects",
        str(effects),
        *STUDY_FLAGS,
        "--bootstrap-seed",
        "3",
        "--permutation-seed",
        "4",
        "--n-bootstrap",
        "300",
        "--n-permutations",
        "500",
        *extra,
    ]
    for k, p in out.items():
        argv += [f"--out-{k}", str(p)]
    assert concentration_stage.main(argv) == 0
    return {k: pq.read_table(p).to_pandas() for k, p in out.items()}, out


def entropy_n_eff(weights):
    p = np.abs(np.asarray(weights, dtype=float))
    p = p[p > 0] / p.sum()
    return math.exp(-float(np.sum(p * np.log(p))))


# ----------------------------------------------------------------------- per model
def test_per_model_outputs_by_hand(tmp_path):
    # 8 examples, 2 layers × 2 heads. Conditions A (x0-3) and B (x4-7); groups u, v, w.
    d = np.zeros((8, 2, 2))
    d[:4, 0, 0] = 2.0  # condition A: only head (0, 0)
    d[4:, 1, 1] = 1.0  # condition B: only head (1, 1)
    d[4:, 0, 1] = -1.0  #              and (0, 1), negative
    conditions = ["A"] * 4 + ["B"] * 4
    groups = ["u", "u", "v", "v", "w", "w", "w", "w"]
    effects = write_effects(
        tmp_path / "e.parquet",
        d,
        conditions=conditions,
        groups=groups,
        extra_splits=[("discovery", np.ones((3, 2, 2)))],
    )
    frames, paths = run_concentration(tmp_path, effects)

    # all examples: e = (1, −0.5; 0, 0.5), E = 2, p = (1/2, 1/4, 1/4) → N_eff = 2^1.5
    summary = frames["summary"].set_index("split")
    assert summary.loc["evaluation", "E"] == pytest.approx(2.0)
    assert summary.loc["evaluation", "N_eff"] == pytest.approx(2**1.5)
    assert summary.loc["discovery", "N_eff"] == pytest.approx(4.0)  # uniform over 4 heads
    robust = frames["robustness"].iloc[0]
    assert robust["split"] == "evaluation" and robust["n_examples"] == 8
    # q = (1/2, 1/2) → N_index = 2; index 0 all in layer 0, index 1 split 1/4 + 1/4
    assert robust["N_index"] == pytest.approx(2.0)
    assert robust["N_layer_given_index"] == pytest.approx(math.sqrt(2.0))
    # per-example absolute: E_x|d| = (1, 0.5; 0, 0.5), the same shares here
    assert robust["N_eff_abs"] == pytest.approx(2**1.5)
    assert robust["N_eff_abs_ratio"] == pytest.approx(1.0)
    assert robust["N_eff_ci_low"] <= robust["N_eff_boot_median"] <= robust["N_eff_ci_high"]
    assert 1.0 <= robust["N_eff_ci_low"] and robust["N_eff_ci_high"] <= 4.0
    assert robust["n_bootstrap"] == 300 and robust["bootstrap_seed"] == 3
    assert robust["n_permutations"] == 500 and robust["permutation_seed"] == 4
    assert 0 < robust["N_index_p_lower"] <= 1 and robust["index_meaningful"]
    for path in paths.values():  # C10 and C11 in every output's metadata (headgeom.checks)
        logged = checks.parse(read_parquet_metadata(path), path)
        assert logged["C10"].residual < 1e-12 and logged["C10"].tolerance == 1e-5
        assert logged["C11"].kind == "rel" and logged["C11"].residual < 1e-12

    conditions = frames["conditions"].set_index("condition")
    assert conditions.loc["A", "N_eff"] == pytest.approx(1.0)  # one head
    assert conditions.loc["B", "N_eff"] == pytest.approx(2.0)  # two equal heads
    assert conditions.loc["A", "E"] == pytest.approx(2.0)
    assert list(conditions["n_examples"]) == [4, 4]

    logo = frames["logo"].set_index("lexical_group")
    # without u (x0, x1): e = (2/6·2 …) → |e| ∝ (4, 4, 4)/6 over three heads → N_eff = 3
    # without w (x4-7): only head (0, 0) → 1
    assert logo.loc["u", "N_eff"] == pytest.approx(entropy_n_eff([4 / 6, 4 / 6, 4 / 6]))
    assert logo.loc["w", "N_eff"] == pytest.approx(1.0)
    assert logo.loc["w", "n_dropped"] == 4 and logo.loc["w", "n_kept"] == 4
    rel_w = (1.0 - 2**1.5) / 2**1.5
    assert logo.loc["w", "rel_change"] == pytest.approx(rel_w)
    assert robust["logo_max_rel_change"] == pytest.approx(abs(rel_w))
    assert robust["logo_max_rel_change_group"] == "w"

    meta = read_parquet_metadata(paths["robustness"])
    assert json.loads(meta["bootstrap_seed"]) == 3 and json.loads(meta["permutation_seed"]) == 4
    assert meta["analysis_split"] == "evaluation"
    schema = pq.read_schema(paths["robustness"])
    assert all(f.metadata and b"description" in f.metadata for f in schema)


def test_per_model_outputs_are_reproducible(tmp_path):
    d = np.random.default_rng(0).standard_normal((40, 3, 3))
    effects = write_effects(tmp_path / "e.parquet", d, groups=["a", "b"] * 20)
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    first, _ = run_concentration(tmp_path / "1", effects)
    second, _ = run_concentration(tmp_path / "2", effects)
    pd.testing.assert_frame_equal(first["robustness"], second["robustness"])


def test_all_zero_effects_give_nulls_not_numbers(tmp_path):
    effects = write_effects(tmp_path / "e.parquet", np.zeros((6, 2, 2)), groups=["a", "b"] * 3)
    frames, _ = run_concentration(tmp_path, effects)
    robust = frames["robustness"].iloc[0]
    for column in ("N_eff", "N_index", "N_index_p_lower", "N_eff_ci_low", "N_eff_abs"):
        assert pd.isna(robust[column]), column
    assert frames["logo"]["N_eff"].isna().all()


def test_missing_analysis_split_is_a_clear_error(tmp_path):
    effects = write_effects(tmp_path / "e.parquet", np.ones((4, 1, 2)), split="discovery")
    with pytest.raises(ValueError, match="analysis split 'evaluation'.*discovery"):
        run_concentration(tmp_path, effects)


def test_robustness_outputs_need_the_seeds(tmp_path, capsys):
    effects = write_effects(tmp_path / "e.parquet", np.ones((4, 1, 2)))
    argv = [
        "--effects",
        str(effects),
        *STUDY_FLAGS,
        "--n-bootstrap",
        "300",
        "--n-permutations",
        "500",
        "--out-summary",
        "s",
        "--out-heads",
        "h",
        "--out-robustness",
        "r",
        "--out-conditions",
        "c",
        "--out-logo",
        "g",
    ]
    with pytest.raises(SystemExit):
        concentration_stage.main(argv)
    assert "need --bootstrap-seed and --permutation-seed" in capsys.readouterr().err


# ----------------------------------------------------------------------- paired
def run_compare(tmp_path, effects, pairs, task="sva"):
    out = {"paired": tmp_path / "paired.parquet", "logo": tmp_path / "plogo.parquet"}
    argv = [
        "--task",
        task,
        "--pairs",
        json.dumps(pairs),
        "--effects",
        *map(str, effects),
        "--n-bootstrap",
        "400",
        "--bootstrap-seed",
        "9",
        "--split",
        "evaluation",
        "--ci",
        "0.95",
        "--out-paired",
        str(out["paired"]),
        "--out-logo",
        str(out["logo"]),
    ]
    assert compare_concentration.main(argv) == 0
    return {k: pq.read_table(p).to_pandas() for k, p in out.items()}


def pair(a, b, seed_a=1, seed_b=1):
    return {
        "model_a": a,
        "seed_a": seed_a,
        "model_b": b,
        "seed_b": seed_b,
        "pair_label": f"{a} s{seed_a} − {b} s{seed_b}",
    }


def test_paired_bootstrap_aligns_examples_by_id(tmp_path):
    gen = np.random.default_rng(1)
    d = gen.standard_normal((30, 2, 3)) + 0.5
    ids = [f"x{i}" for i in range(30)]
    groups = [f"g{i % 3}" for i in range(30)]
    order = gen.permutation(30)  # B stores the same examples in another order
    a = write_effects(tmp_path / "a.parquet", d, model="A", ids=ids, groups=groups)
    b = write_effects(
        tmp_path / "b.parquet",
        d[order],
        model="B",
        ids=[ids[i] for i in order],
        groups=[groups[i] for i in order],
    )
    frames = run_compare(tmp_path, [a, b], [pair("A", "B")])
    row = frames["paired"].iloc[0]
    assert row["diff"] == 0.0 and row["ci_low"] == 0.0 and row["ci_high"] == 0.0
    assert not row["resolved"] and row["logo_sign_reversals"] == 0 and row["logo_n_groups"] == 3
    assert (frames["logo"]["diff"] == 0.0).all()


def test_paired_bootstrap_refuses_different_example_sets(tmp_path):
    d = np.ones((4, 1, 2))
    a = write_effects(tmp_path / "a.parquet", d, model="A")
    b = write_effects(tmp_path / "b.parquet", d, model="B", ids=["x000", "x001", "x002", "y"])
    with pytest.raises(ValueError, match="same examples"):
        run_compare(tmp_path, [a, b], [pair("A", "B")])
    c = write_effects(tmp_path / "c.parquet", d, model="C", dataset="cd" * 32)
    with pytest.raises(ValueError, match="identical datasets"):
        run_compare(tmp_path, [a, c], [pair("A", "C")])


def test_paired_logo_sign_reversal_by_hand(tmp_path):
    # One layer, two heads, one example per group g1, g2, g3.
    # A: every example (1, 0.9) → N_eff_A = exp H(1/1.9, 0.9/1.9) in every subset.
    # B: g1 = g2 = (1, 1), g3 = (3, −1): all → e = (5/3, 1/3); without g3 → (1, 1), N_eff 2.
    d_a = np.array([[[1.0, 0.9]]] * 3)
    d_b = np.array([[[1.0, 1.0]], [[1.0, 1.0]], [[3.0, -1.0]]])
    groups = ["g1", "g2", "g3"]
    a = write_effects(tmp_path / "a.parquet", d_a, model="A", groups=groups)
    b = write_effects(tmp_path / "b.parquet", d_b, model="B", groups=groups)
    frames = run_compare(tmp_path, [a, b], [pair("A", "B")])
    n_a = entropy_n_eff([1.0, 0.9])
    row = frames["paired"].iloc[0]
    assert row["N_eff_a"] == pytest.approx(n_a)
    assert row["N_eff_b"] == pytest.approx(entropy_n_eff([5 / 3, 1 / 3]))
    assert row["diff"] == pytest.approx(n_a - entropy_n_eff([5, 1])) and row["diff"] > 0
    logo = frames["logo"].set_index("lexical_group")
    assert logo.loc["g3", "diff"] == pytest.approx(n_a - 2.0)  # < 0: reversed
    assert logo.loc["g1", "diff"] == pytest.approx(n_a - 1.0)  # B = (2, 0) → 1
    assert list(logo["sign_reversed"]) == [False, False, True]
    assert row["logo_sign_reversals"] == 1 and row["logo_reversal_groups"] == "g3"


# ----------------------------------------------------------------------- loss (§12.7)
ROBUSTNESS_FIELDS = ["model", "seed", "task", "split", "N_eff", "N_eff_abs"]


def test_c16_loss_versus_n_eff_from_the_paper_numbers(tmp_path):
    """C16: paper Table 6 N_eff and §6.1 losses through the loss script give −0.767/−0.943."""
    paper = {  # model: (val loss §6.1, n_head, reader, N_eff SVA/quote/plural Table 6)
        "learned": (3.508, 12, "free", (10.4, 12.0, 9.2)),
        "write-rotated": (3.563, 12, "free", (16.2, 22.2, 22.2)),
        "read-common": (3.610, 12, "block", (8.1, 11.0, 10.0)),
        "all-common-axis": (3.698, 12, "block", (8.1, 12.7, 3.9)),
        "all-rotated": (3.751, 12, "block", (9.1, 11.4, 3.6)),
        "all-rotated-self": (3.753, 12, "block", (8.8, 7.9, 3.9)),
        "write-routed-a": (3.542, 16, "free", (18.9, 31.6, 20.3)),
        "write-routed-b": (3.543, 16, "free", (29.1, 29.0, 21.6)),
        "write-routed-c": (3.553, 16, "free", (31.1, 39.7, 15.8)),
    }
    robustness, manifests, models = [], [], {}
    for m, (loss, n_head, reader, n_effs) in paper.items():
        manifest = tmp_path / f"{m}.json"
        write_manifest(manifest, {"model_name": m, "init_seed": 42, "val_loss_nats": loss})
        manifests.append(manifest)
        for task, n_eff in zip(("sva", "quote", "plural"), n_effs, strict=True):
            path = tmp_path / f"{m}-{task}.parquet"
            frame = pd.DataFrame(
                [[m, 42, task, "evaluation", n_eff, 2 * n_eff]], columns=ROBUSTNESS_FIELDS
            )
            frame.to_parquet(path)
            robustness.append(path)
        models[m] = {
            "display_name": m,
            "geometry": m if m != "learned" else "learned",
            "corpus": "S",
            "n_head": n_head,
            "reader_type": reader,
        }
    out_loss, out_rho = tmp_path / "loss.parquet", tmp_path / "rho.parquet"
    argv = [
        "--robustness",
        *map(str, robustness),
        "--manifests",
        *map(str, manifests),
        "--models",
        json.dumps(models),
        "--base-n-head",
        "12",
        "--split",
        "evaluation",
        "--loss-models",
        json.dumps(list(paper)),
        "--out-loss",
        str(out_loss),
        "--out-spearman",
        str(out_rho),
    ]
    assert concentration_loss.main(argv) == 0
    rho = pq.read_table(out_rho).to_pandas().set_index(["analysis", "subset", "task"], drop=False)
    loss_rows = rho[rho["analysis"] == "loss_vs_N_eff"].set_index("subset")
    assert round(loss_rows.loc["all", "rho"], 3) == -0.767 and loss_rows.loc["all", "n"] == 9
    assert round(loss_rows.loc["base_heads", "rho"], 3) == -0.943
    assert loss_rows.loc["base_heads", "n"] == 6
    # N_eff_abs = 2 N_eff preserves every order: ρ = 1 pooled and per task
    abs_rows = rho[rho["analysis"] == "N_eff_vs_N_eff_abs"]
    # paper_pairs (pooled), figure3 (per task) and every_run (pooled and per task)
    assert np.allclose(abs_rows["rho"], 1.0) and len(abs_rows) == 8
    loss = pq.read_table(out_loss).to_pandas().set_index("model")
    assert loss.loc["learned", "N_eff_geomean"] == pytest.approx((10.4 * 12.0 * 9.2) ** (1 / 3))
    assert not loss.loc["write-routed-a", "index_meaningful"]
    assert loss.loc["read-common", "reader_type"] == "block"


def test_loss_script_refuses_unmatched_manifests(tmp_path):
    write_manifest(tmp_path / "m.json", {"model_name": "x", "init_seed": 1, "val_loss_nats": 3.0})
    path = tmp_path / "r.parquet"
    pd.DataFrame(
        [["y", 1, t, "evaluation", 2.0, 3.0] for t in ("sva", "quote", "plural")],
        columns=ROBUSTNESS_FIELDS,
    ).to_parquet(path)
    argv = [
        "--robustness",
        str(path),
        "--manifests",
        str(tmp_path / "m.json"),
        "--models",
        "{}",
        "--base-n-head",
        "2",
        "--split",
        "evaluation",
        "--loss-models",
        "[]",
        "--out-loss",
        str(tmp_path / "l"),
        "--out-spearman",
        str(tmp_path / "s"),
    ]
    with pytest.raises(ValueError, match="different \\(model, seed\\)"):
        concentration_loss.main(argv)
    assert not (tmp_path / "l").exists()


def test_bootstrap_cost_at_paper_scale():
    # 2,000 resamples × 240 examples × 144 heads must be a matrix product, not a loop.
    import time

    from headgeom.heads.analysis.stats import bootstrap_n_eff

    d = np.random.default_rng(2).standard_normal((240, 12, 12))
    start = time.perf_counter()
    boot = bootstrap_n_eff(d, 2000, seed=0)
    assert time.perf_counter() - start < 5.0
    assert boot.shape == (2000,) and np.all((boot >= 1) & (boot <= 144))
    assert concentration(d.mean(axis=0))["N_eff"] > 1


# ----------------------------------------------------------------------- one job per run
def test_one_job_for_every_task_equals_one_job_per_task(tmp_path):
    """concentration.py and lanes.py take every task of a run in one job (the workflow's
    granularity); each file's outputs are those of a job given that file alone, and a
    missing output path per file is named."""
    rng = np.random.default_rng(0)
    labels = {"conditions": ["A"] * 4 + ["B"] * 4, "groups": list("uuvvwwww")}
    tasks = {t: write_effects(tmp_path / f"{t}.parquet", rng.normal(size=(8, 2, 2)), task=t,
                              extra_splits=[("discovery", rng.normal(size=(6, 2, 2)))], **labels)
             for t in ("sva", "quote")}  # fmt: skip
    kinds = ("summary", "heads", "robustness", "conditions", "logo")
    settings = ["--bootstrap-seed", "3", "--permutation-seed", "4", "--n-bootstrap", "200",
                "--n-permutations", "300", *STUDY_FLAGS]  # fmt: skip
    alone, together = tmp_path / "alone", tmp_path / "together"
    for folder in (alone, together):
        folder.mkdir()

    def outs(folder, task):
        return {k: folder / f"{task}.{k}.parquet" for k in kinds}

    concentration, lanes = concentration_stage, lanes_stage
    lane_args = ["--split", "discovery", "--n-permutations", "300", "--seed", "5"]
    for task, path in tasks.items():
        argv = ["--effects", str(path), *settings]
        for k, p in outs(alone, task).items():
            argv += [f"--out-{k}", str(p)]
        assert concentration.main(argv) == 0
        heads = outs(alone, task)["heads"]
        assert lanes.main(["--heads", str(heads), *lane_args,
                           "--out", str(alone / f"{task}.lanes.parquet")]) == 0  # fmt: skip
    argv = ["--effects", *map(str, tasks.values()), *settings]
    for k in kinds:
        argv += [f"--out-{k}", *(str(outs(together, t)[k]) for t in tasks)]
    assert concentration.main(argv) == 0
    heads = [str(outs(together, t)["heads"]) for t in tasks]
    lane_outs = [str(together / f"{t}.lanes.parquet") for t in tasks]
    assert lanes.main(["--heads", *heads, *lane_args, "--out", *lane_outs]) == 0
    for task in tasks:
        for name in [*(f"{task}.{k}" for k in kinds), f"{task}.lanes"]:
            a, b = (pq.read_table(f / f"{name}.parquet") for f in (alone, together))
            assert a.num_rows > 0 and a.equals(b), name
            assert a.to_pandas()["task"].eq(task).all(), name
            # the provenance names the file's own effects, not the first task's
            meta_a, meta_b = (read_parquet_metadata(f / f"{name}.parquet")
                              for f in (alone, together))  # fmt: skip
            assert meta_a["effects_sha256"] == meta_b["effects_sha256"], name
    # one --out-heads for two files: refused before anything runs, naming the option
    bad = ["--effects", *map(str, tasks.values()), *settings, "--out-summary", "a", "b",
           "--out-heads", "c"]  # fmt: skip
    with pytest.raises(SystemExit):
        concentration.main(bad)
    with pytest.raises(SystemExit):
        lanes.main(["--heads", *heads, *lane_args, "--out", lane_outs[0]])
