"""The study as a document (docs §17): the paper's Table 2 rows, Tables 1 and 4, the §12.1 and
§12.5 counts, seed statistics, the paper-vs-run comparison, the §12.3 Spearman subsets, the
selections of Table 2 and Figure 7, and the results catalog. Expectations are hand-computed."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from headgeom import io, results
from headgeom.catalog import catalog, template_regex
from headgeom.hashing import ManifestMismatchError
from headgeom.heads import selections
from headgeom.heads.analysis.concentration import spearman_rows
from headgeom.heads.paper import comparison, seeds, setup, summary
from headgeom.io import IntegrityError
from tests.helpers.results import train_log, write_rows

TASKS = ("sva", "quote", "plural")


def summaries(tmp_path, n_effs: dict[tuple[str, int], tuple[float, float, float]], E=1.0):
    paths = []
    for (model, seed), values in n_effs.items():
        rows = [
            {
                "model": model,
                "seed": seed,
                "task": t,
                "split": "evaluation",
                "N_eff": v,
                "E": E,
                "top_head_share": 0.5,
            }
            for t, v in zip(TASKS, values, strict=True)
        ]
        paths.append(write_rows(tmp_path / f"{model}-{seed}.summary.parquet", rows))
    return paths


# ----------------------------------------------------------------------------- selections
PAPER_MODELS = {
    "learned-r": {"geometry": "learned", "seeds": [42, 43], "corpus": "R"},
    "wca-r": {"geometry": "write-common-axis", "seeds": [42, 43], "corpus": "R"},
    "common": {"geometry": "write-common", "seeds": [42], "corpus": "R"},
    "layered": {"geometry": "write-rotated", "seeds": [42], "corpus": "R"},
    "learned-s": {"geometry": "learned", "seeds": [42], "corpus": "S"},
    "rot-m1": {"geometry": "write-rotated", "seeds": [42], "corpus": "S"},
    "hb-learned": {"geometry": "read-common", "seeds": [42], "corpus": "S"},
    "hb-identity": {"geometry": "all-common-axis", "seeds": [42], "corpus": "S"},
    "rot-m2": {"geometry": "all-rotated", "seeds": [42], "corpus": "S"},
    "rot-m3": {"geometry": "all-rotated-self", "seeds": [42], "corpus": "S"},
    "fixeddiag": {"geometry": "fixeddiag", "seeds": [42], "corpus": "R"},
    "mlp3456": {"geometry": "mlp3456", "seeds": [42], "corpus": "S"},
    "ms-identity": {"geometry": "multiscreen-identity", "seeds": [42], "corpus": "R"},
}


def test_table2_selects_the_papers_ten_rows_seed_42():
    chosen = selections.select_models(PAPER_MODELS, "table2")
    # rows 1, 4, 6, 7, 3, 8, 9, 10, 11, 12 of docs §6.1: both corpora, first seed only
    assert sorted(chosen) == sorted(
        [
            (m, 42)
            for m in (
                "learned-r",
                "wca-r",
                "common",
                "layered",
                "learned-s",
                "rot-m1",
                "hb-learned",
                "hb-identity",
                "rot-m2",
                "rot-m3",
            )
        ]
    )


def test_figure7_selects_the_eight_free_reader_models():
    chosen = selections.select_models(PAPER_MODELS, "figure7")
    # rows 1–8: learned ×3 runs, write-common-axis ×2, write-common, write-rotated ×2
    assert chosen == [
        ("learned-r", 42),
        ("learned-r", 43),
        ("learned-s", 42),
        ("wca-r", 42),
        ("wca-r", 43),
        ("common", 42),
        ("layered", 42),
        ("rot-m1", 42),
    ]


def test_spearman_of_the_paper_pairs_leaves_out_the_other_runs():
    # four runs; the fourth (a multiscreen control) reverses the order of N_eff_abs
    summary = pd.DataFrame(
        [
            (m, 1, t, n, a)
            for m, n, a in (("a", 1.0, 1.0), ("b", 2.0, 2.0), ("c", 3.0, 3.0), ("x", 4.0, 0.5))
            for t in TASKS
        ],
        columns=["model", "seed", "task", "N_eff", "N_eff_abs"],
    )
    loss = pd.DataFrame(
        {
            "val_loss": [1.0, 2.0, 3.0, 4.0],
            "N_eff_geomean": [1.0, 2.0, 3.0, 4.0],
            "included": True,
            "index_meaningful": True,
        }
    )
    rows = spearman_rows(loss, summary, [("a", 1), ("b", 1), ("c", 1)], [("a", 1), ("b", 1)])
    rows = rows[rows["analysis"] == "N_eff_vs_N_eff_abs"].set_index(["subset", "task"])
    paper = rows.xs("paper_pairs", level="subset").iloc[0]
    assert paper["n"] == 9 and paper["rho"] == pytest.approx(1.0)  # a, b, c × 3 tasks: ties
    every = rows.xs("every_run", level="subset")
    pooled = every[every.index.isna()].iloc[0]
    expected = stats.spearmanr(summary["N_eff"], summary["N_eff_abs"]).statistic
    assert pooled["n"] == 12 and pooled["rho"] == pytest.approx(expected) and expected < 0.5
    figure3 = rows.xs("figure3", level="subset")
    assert list(figure3["n"]) == [2, 2, 2]  # two runs: ρ is undefined below 3 points
    assert figure3["rho"].isna().all()


# ----------------------------------------------------------------------------- tables
def test_paper_table2_has_no_delta_for_learned_and_states_the_seeds(tmp_path):
    shown = [
        train_log(tmp_path / "a.parquet", "learned", "learned", 42, 1000, 3.50),
        train_log(tmp_path / "c.parquet", "all-common-axis", "all-common-axis", 42, 900, 3.69),
    ]
    every = [*shown, train_log(tmp_path / "b.parquet", "learned", "learned", 43, 1000, 3.6)]
    table = setup.table2_paper({"runs": shown, "all_runs": every})
    frame = table.frame.set_index("model")
    assert math.isnan(frame.loc["learned", "delta_vs_learned"])
    assert frame.loc["all-common-axis", "delta_vs_learned"] == pytest.approx(0.19)
    assert frame.loc["all-common-axis", "readers"] == "block E_h"  # registry: block reader
    assert frame.loc["learned", "readers"] == "free"
    assert "except learned, which have 2 or more (seed 42 shown)" in table.caption
    assert "g = 0.02·sqrt(D/2L)" in table.caption


def test_table4_lists_every_run_with_its_sections(tmp_path):
    runs = [
        train_log(tmp_path / "a.parquet", "learned", "learned", 42, repository_name="dense"),
        train_log(tmp_path / "b.parquet", "all-rotated", "all-rotated", 42),
    ]
    context = {
        "models": {
            "learned": {"sections": ["§5.1 Exclusivity", "§5.2 Concentration"]},
            "all-rotated": {"sections": []},
        }
    }
    table = setup.table4({"runs": runs}, context)
    cells = table.blocks[0].cells
    assert list(cells["Model"]) == ["dense", "all-rotated s42"]
    assert list(cells["Sections used"]) == ["§5.1 Exclusivity, §5.2 Concentration", "—"]
    assert cells["Write / Readers"].iloc[1] == "g B_l E_h / block h of B_(L+l) (other basis)"


def test_counts_below_learned_and_conditions(tmp_path):
    runs = [
        train_log(tmp_path / "l.parquet", "learned", "learned", 42),
        train_log(tmp_path / "a.parquet", "aca", "all-common-axis", 42),
        train_log(tmp_path / "r.parquet", "ar", "all-rotated", 42),
        train_log(tmp_path / "w.parquet", "wr", "write-rotated", 42),
    ]
    paths = summaries(
        tmp_path,
        {
            ("learned", 42): (10, 10, 10),
            ("aca", 42): (8, 12, 4),
            ("ar", 42): (9, 11, 3),
            ("wr", 42): (16, 22, 9),
        },
    )
    conditions = write_rows(
        tmp_path / "cond.parquet",
        [
            {
                "model": m,
                "seed": 42,
                "task": "sva",
                "split": "evaluation",
                "condition": c,
                "N_eff": v,
            }
            for m, values in (("aca", (1, 5, 3, 9)), ("ar", (2, 4, 4, 8)))
            for c, v in zip("wxyz", values, strict=True)
        ],
    )
    paired = write_rows(
        tmp_path / "paired.parquet",
        [{"task": "sva", "model_a": "aca", "seed_a": 42, "model_b": "ar", "seed_b": 42}],
    )
    table = seeds.counts(
        {"runs": runs, "summaries": paths, "conditions": [conditions], "paired": [paired]}
    )
    frame = table.frame.set_index("comparison")
    block = frame.loc["block-reader models: N_eff below learned"]
    assert (block["k"], block["n"]) == (4, 6)  # aca: 8, 4 < 10; ar: 9, 3 < 10
    wr = frame.loc["wr: N_eff below learned"]  # per display name (the config key here)
    assert (wr["k"], wr["n"]) == (1, 3)
    won = frame.loc["aca s42 more concentrated than ar s42"]
    assert (won["k"], won["n"]) == (2, 4)  # conditions w and z


def test_seed_statistics_are_student_t_and_paired_by_seed(tmp_path):
    runs = [
        train_log(tmp_path / f"{m}{s}.parquet", m, g, s)
        for m, g in (("learned", "learned"), ("wca", "write-common-axis"), ("one", "learned"))
        for s in ((42, 43, 44) if m != "one" else (42,))
    ]
    n = {
        ("learned", 42): (5.0, 1, 1),
        ("learned", 43): (7.0, 1, 1),
        ("learned", 44): (9.0, 1, 1),
        ("wca", 42): (6.0, 1, 1),
        ("wca", 43): (6.0, 1, 1),
        ("wca", 44): (12.0, 1, 1),
        ("one", 42): (1.0, 1, 1),
    }
    table = seeds.seeds({"runs": runs, "summaries": summaries(tmp_path, n)})
    frame = table.frame
    mean = frame[
        (frame["kind"] == "seed mean")
        & (frame["model"] == "learned")
        & (frame["task"] == "sva")
        & (frame["metric"] == "N_eff")
    ].iloc[0]
    half = stats.t.ppf(0.975, 2) * 2.0 / math.sqrt(3)  # s = 2 for 5, 7, 9
    assert mean["mean"] == pytest.approx(7.0)
    assert (mean["ci_low"], mean["ci_high"]) == pytest.approx((7.0 - half, 7.0 + half))
    assert "one" not in set(frame["model"])  # one seed: no seed statistics
    contrast = frame[
        (frame["kind"] == "paired seed contrast")
        & (frame["task"] == "sva")
        & (frame["metric"] == "N_eff")
    ].iloc[0]
    diffs = np.array([5 - 6, 7 - 6, 9 - 12], dtype=float)  # learned − wca per seed
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert (contrast["model"], contrast["model_b"]) == ("learned", "wca")
    assert contrast["mean"] == pytest.approx(diffs.mean())
    assert contrast["ci_high"] - contrast["mean"] == pytest.approx(half)


def test_table1_marks_properties_whose_inputs_the_study_lacks(tmp_path):
    runs = [train_log(tmp_path / "l.parquet", "learned", "learned", 42)]
    paths = summaries(tmp_path, {("learned", 42): (2.0, 3.0, 4.0)})
    table = summary.table1({"runs": runs, "summaries": paths})
    frame = table.frame.set_index("property")
    assert frame.loc["Basis concentration", "finding"] == "not in this study (no coordinates input)"
    assert frame.loc["Geometric exclusivity", "finding"].startswith("not in this study")
    assert frame.loc["Functional concentration", "finding"].startswith("N_eff 2.0–4.0")
    assert not frame.loc["Basis concentration", "in_study"]
    assert frame.loc["Functional concentration", "in_study"]


# ----------------------------------------------------------------------------- comparison
def test_within_uses_the_papers_printed_precision():
    ref = comparison.Reference(
        section="§",
        metric="m",
        model="x",
        paper="8.1",
        low=8.1,
        high=8.1,
        decimals=1,
        compute=lambda c: None,
        kinds=(),
    )
    assert ref.within(8.149) and ref.within(8.05) and not ref.within(8.151)
    assert ref.within((8.06, 8.14)) and not ref.within((8.0, 8.1))
    assert ref.within(None) is None
    share = comparison.Reference(
        section="§",
        metric="m",
        model="x",
        paper="28%",
        low=0.28,
        high=0.28,
        decimals=0,
        compute=lambda c: None,
        kinds=(),
        percent=True,
    )
    assert share.within(0.284) and not share.within(0.286)


def test_the_comparison_computes_from_parquets_and_says_what_is_missing(tmp_path):
    runs = [
        train_log(tmp_path / "l.parquet", "learned", "learned", 42, val_loss=3.508),
        train_log(tmp_path / "a.parquet", "aca", "all-common-axis", 42, val_loss=3.698),
    ]
    paths = summaries(tmp_path, {("learned", 42): (10.4, 12.0, 9.2), ("aca", 42): (8.1, 13, 3.9)})
    frame = comparison.evaluate({"runs": runs, "summaries": paths})
    rows = frame.set_index(["metric", "model"])
    assert rows.loc[("N_eff SVA", "all-common-axis (S)"), "within"] == True  # noqa: E712
    assert rows.loc[("N_eff Quote", "all-common-axis (S)"), "within"] == False  # noqa: E712
    delta = rows.loc[("Δ validation loss vs learned", "all-common-axis (S)")]
    assert delta["run_low"] == pytest.approx(0.190) and delta["within"]
    assert rows.loc[("N_eff SVA", "all-rotated (S)"), "run_value"] == (
        "not in this study (no such run)"
    )
    missing = rows.loc[("Spearman(PK, KL), pooled over edges", "learned"), "run_value"]
    assert missing == "not in this study (no edge_summary input)"
    # every §20 number is listed, each once
    assert len(frame) == len(comparison.REFERENCES) > 150
    assert not frame.duplicated(["section", "metric", "model", "paper"]).any()


def test_a_reference_made_in_code_is_evaluated_beside_the_records(tmp_path):
    before = comparison.REFERENCES
    ref = comparison.reference("§x", "two", "all", "2", 2.0, kinds=["runs"], compute=lambda c: 2.0)
    runs = [train_log(tmp_path / "l.parquet", "learned", "learned", 42)]
    frame = comparison.evaluate({"runs": runs}, [ref])
    assert frame["within"].tolist() == [True]
    assert comparison.REFERENCES is before and ref not in comparison.REFERENCES  # untouched


# ----------------------------------------------------------------------------- catalog
def test_template_regex_takes_the_most_specific_template():
    rx = template_regex("r/c/{model}/s{seed}/{task}.parquet", {"model": "a|a-b", "seed": r"\d+"})
    assert rx.match("r/c/a-b/s42/sva.parquet").groupdict() == {
        "model": "a-b",
        "seed": "42",
        "task": "sva",
    }
    assert rx.match("r/c/a/s42/sva.heads.parquet") is None  # a wildcard holds no dot


def test_catalog_rows_hash_files_and_name_their_manifest(tmp_path):
    root = tmp_path / "results" / "s"
    (root / "models" / "m" / "s1").mkdir(parents=True)
    io.write_manifest(root / "models" / "m" / "s1" / "manifest.json", {"seed": 1})
    (root / "eval" / "m" / "s1").mkdir(parents=True)
    table = root / "eval" / "m" / "s1" / "sva.parquet"
    io.write_parquet(table, pd.DataFrame({"x": [1.0]}), pa.schema([("x", pa.float64())]))
    (root / "logs").mkdir()
    (root / "logs" / "x.log").write_text("log")
    (root / "stale.txt").write_text("no template")
    templates = {
        f"{root}/models/{{model}}/s{{seed}}/manifest.json": "hash_checkpoint",
        f"{root}/eval/{{model}}/s{{seed}}/{{task}}.parquet": "evaluate_clean",
    }
    frame = catalog(root, templates, ["m"]).set_index("rule")
    assert sorted(frame.index) == ["evaluate_clean", "hash_checkpoint"]
    row = frame.loc["evaluate_clean"]
    assert row["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert json.loads(row["wildcards"]) == {"model": "m", "seed": "1", "task": "sva"}
    assert row["manifest"].endswith("models/m/s1/manifest.json") and row["manifest_sha256"]
    path = tmp_path / "catalog.parquet"
    results.CATALOG.write(path, frame.reset_index())
    assert pq.read_table(path).schema.names == results.CATALOG.names


def test_catalog_refuses_a_result_or_manifest_changed_after_it_was_written(tmp_path):
    root = tmp_path / "results" / "s"
    (root / "models" / "m" / "s1").mkdir(parents=True)
    manifest = root / "models" / "m" / "s1" / "manifest.json"
    io.write_manifest(manifest, {"seed": 1})
    templates = {f"{root}/models/{{model}}/s{{seed}}/manifest.json": "hash_checkpoint"}
    catalog(root, templates, ["m"])
    manifest.write_text(manifest.read_text().replace('"seed": 1', '"seed": 2'))
    with pytest.raises(ManifestMismatchError, match="manifest.json.*seal records"):
        catalog(root, templates, ["m"])
    io.write_manifest(manifest, {"seed": 1})
    table = root / "models" / "m" / "s1" / "losses.parquet"
    io.write_parquet(table, pd.DataFrame({"x": [1.0, 2.0]}), pa.schema([("x", pa.float64())]))
    templates[f"{root}/models/{{model}}/s{{seed}}/losses.parquet"] = "train"
    data = bytearray(table.read_bytes())
    data[4] ^= 0x01  # inside the first data page, which carries a CRC-32
    table.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="losses.parquet: pages SHA-256 is .* changed after"):
        catalog(root, templates, ["m"])
