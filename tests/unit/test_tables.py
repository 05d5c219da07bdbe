"""Paper tables from hand-made Parquets: derived values computed by hand."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from headgeom.io import write_parquet
from headgeom.tables import lanes, leakage, table2, table5, table6
from make_table import main as make_table_main


def train_log(path, model, geometry, seed, n_params, val_loss):
    cfg = {"model_name": model, "seed": seed, "model": {"geometry": geometry}}
    frame = pd.DataFrame({"step": [1], "loss": [1.0]})
    schema = pa.schema([("step", pa.int64()), ("loss", pa.float64())])
    meta = {"config": cfg, "n_params": n_params, "val_loss_nats": val_loss}
    write_parquet(path, frame, schema, meta)
    return str(path)


def test_table2_delta_is_against_learned_of_the_same_seed(tmp_path):
    paths = [
        train_log(tmp_path / "a.parquet", "learned", "learned", 42, 1000, 3.50),
        train_log(tmp_path / "b.parquet", "learned", "learned", 43, 1000, 3.60),
        train_log(tmp_path / "c.parquet", "write-common-axis", "write-common-axis", 42, 900, 3.54),
        train_log(tmp_path / "d.parquet", "write-common-axis", "write-common-axis", 43, 900, 3.61),
    ]
    frame, md = table2(paths)
    delta = frame.set_index(["model", "seed"])["delta_vs_learned"]
    assert delta[("learned", 42)] == 0.0
    assert delta[("write-common-axis", 42)] == pytest.approx(0.04)
    assert delta[("write-common-axis", 43)] == pytest.approx(0.01)
    assert "+0.040" in md and "1,000" in md


def summary(path, model, seed, task, split, **values):
    frame = pd.DataFrame([{"model": model, "seed": seed, "task": task, "split": split, **values}])
    fields = [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
    ] + [(k, pa.float64()) for k in values]
    write_parquet(path, frame, pa.schema(fields))
    return str(path)


def test_table5_uses_the_evaluation_split_only(tmp_path):
    paths = [
        summary(tmp_path / f"{t}{s}.parquet", "learned", 42, t, s, n=8.0, accuracy=acc, margin=m)
        for t, s, acc, m in [
            ("sva", "evaluation", 0.875, 2.5),
            ("sva", "discovery", 0.1, -1.0),
            ("quote", "evaluation", 1.0, 4.25),
            ("plural", "evaluation", 0.5, 0.125),
        ]
    ]
    frame, md = table5(paths)
    assert set(frame["task"]) == {"sva", "quote", "plural"}
    assert "87.5 / 2.50" in md and "100.0 / 4.25" in md and "50.0 / 0.12" in md
    assert "10.0" not in md


def test_table6_pivots_n_eff_and_e(tmp_path):
    paths = [
        summary(
            tmp_path / f"{t}.parquet",
            "learned",
            42,
            t,
            "evaluation",
            N_eff=n,
            E=e,
            top_head_share=0.5,
        )
        for t, n, e in [("sva", 3.0, 1.5), ("quote", 7.25, 2.0), ("plural", 1.0, 0.5)]
    ]
    _, md = table6(paths)
    for text in ("3.0", "7.2", "1.50", "2.00", "0.50"):
        assert text in md


def test_lane_table_applies_bonferroni_within_model(tmp_path):
    paths = [
        summary(
            tmp_path / f"{t}.parquet",
            "learned",
            42,
            t,
            "discovery",
            lambda_score=lam,
            chance=0.25,
            p_value=p,
            n_permutations=5000.0,
        )
        for t, lam, p in [("sva", 0.5, 0.0002), ("quote", 0.3, 0.4), ("plural", 0.2, 0.9)]
    ]
    frame, _ = lanes(paths)
    corrected = frame.set_index("task")["p_bonferroni"]
    assert corrected["sva"] == pytest.approx(0.0006)
    assert corrected["quote"] == 1.0  # 3 × 0.4 capped at 1
    assert corrected["plural"] == 1.0


def test_make_table_writes_md_csv_and_sources(tmp_path):
    paths = [train_log(tmp_path / "a.parquet", "learned", "learned", 1, 10, 2.0)]
    out = tmp_path / "out"
    make_table_main(
        [
            "--table",
            "table2",
            "--inputs",
            *paths,
            "--out-md",
            str(out / "t.md"),
            "--out-csv",
            str(out / "t.csv"),
            "--out-sources",
            str(out / "t.json"),
        ]
    )
    assert (out / "t.md").read_text().startswith("|")
    assert pd.read_csv(out / "t.csv")["n_params"].tolist() == [10]
    assert paths[0] in (out / "t.json").read_text()


def test_leakage_table_medians_and_spearman(tmp_path):
    # Three pairs per read type with L = 2ρ except one outlier: median L/ρ = 2, and the
    # rank correlation is perfect because L is monotone in ρ.
    rows = [
        {
            "model": "learned",
            "seed": 1,
            "task": "sva",
            "read_type": x,
            "leakage": lk,
            "rho": r,
            "leakage_over_rho": lk / r,
        }
        for x in ("Q", "V")
        for lk, r in [(0.2, 0.1), (0.4, 0.2), (0.9, 0.3)]
    ]
    frame = pd.DataFrame(rows)
    schema = pa.schema(
        [
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("read_type", pa.string()),
            ("leakage", pa.float64()),
            ("rho", pa.float64()),
            ("leakage_over_rho", pa.float64()),
        ]
    )
    write_parquet(tmp_path / "l.parquet", frame, schema)
    out, md = leakage([str(tmp_path / "l.parquet")])
    q = out.set_index("read_type").loc["Q"]
    assert q["median_leakage"] == pytest.approx(0.4)
    assert q["median_leakage_over_rho"] == pytest.approx(2.0)
    assert q["spearman_leakage_rho"] == pytest.approx(1.0)
    assert "40.0%" in md


def test_table2_compares_within_a_corpus(tmp_path):
    """learned-r and learned-s both have seed 42: each model is compared on its own corpus."""

    def log(name, model, geometry, corpus, val_loss):
        path = tmp_path / f"{name}.parquet"
        cfg = {"model_name": model, "seed": 42, "corpus": corpus, "model": {"geometry": geometry}}
        schema = pa.schema([("step", pa.int64())])
        meta = {"config": cfg, "n_params": 1, "val_loss_nats": val_loss}
        write_parquet(path, pd.DataFrame({"step": [1]}), schema, meta)
        return str(path)

    paths = [
        log("a", "learned-r", "learned", "R", 3.604),
        log("b", "learned-s", "learned", "S", 3.508),
        log("c", "write-rotated-r", "write-rotated", "R", 3.654),
        log("d", "all-rotated", "all-rotated", "S", 3.751),
    ]
    frame, md = table2(paths)
    delta = frame.set_index("model")["delta_vs_learned"]
    assert delta["write-rotated-r"] == pytest.approx(0.050)
    assert delta["all-rotated"] == pytest.approx(0.243)
    assert delta["learned-s"] == 0.0
    assert frame.set_index("model")["corpus"].to_dict() == {
        "learned-r": "R",
        "learned-s": "S",
        "write-rotated-r": "R",
        "all-rotated": "S",
    }
    assert "Corpus" in md
