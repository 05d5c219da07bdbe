"""Paper tables from hand-made Parquets: derived values computed by hand."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from headgeom.heads.paper.concentration import decomposition_cell, table3, table6
from headgeom.heads.paper.outputs import TABLES
from headgeom.heads.paper.setup import table2, table5
from headgeom.heads.stages.make_table import main as make_table_main
from headgeom.render import fixed, format_p, latex_escape, value_range
from tests.helpers.results import train_log, write_rows


def numbers(text: str) -> list[str]:
    """Numeric tokens in reading order (model names like s42 included on both sides)."""
    return re.findall(r"\d+(?:[.,]\d+)*(?:e[-+]?\d+)?", text)


def md_rows(md: str) -> list[str]:
    """Body rows of every Markdown block (each block repeats the header line first)."""
    lines = md.splitlines()
    header = {i - 1 for i, line in enumerate(lines) if line.startswith("|:")}
    return [
        line
        for i, line in enumerate(lines)
        if line.startswith("|") and not line.startswith("|:") and i not in header
    ]


def tex_rows(tex: str) -> list[str]:
    """Body rows of the tabular: after the first midrule, without block-title rows."""
    lines = tex.splitlines()
    body = lines[lines.index(r"\midrule") :]
    return [line for line in body if line.endswith("\\\\") and "multicolumn" not in line]


# ----------------------------------------------------------------------------- Table 2
def test_table2_delta_is_against_learned_of_the_same_seed(tmp_path):
    runs = [
        train_log(tmp_path / "a.parquet", "learned", "learned", 42, 1000, 3.50),
        train_log(tmp_path / "b.parquet", "learned", "learned", 43, 1000, 3.60),
        train_log(tmp_path / "c.parquet", "write-common-axis", "write-common-axis", 42, 900, 3.54),
        train_log(tmp_path / "d.parquet", "write-common-axis", "write-common-axis", 43, 900, 3.61),
    ]
    table = table2({"runs": runs})
    delta = table.frame.set_index(["model", "seed"])["delta_vs_learned"]
    assert delta[("learned", 42)] == 0.0
    assert delta[("write-common-axis", 42)] == pytest.approx(0.04)
    assert delta[("write-common-axis", 43)] == pytest.approx(0.01)
    md = table.markdown()
    assert "+0.040" in md and "1,000" in md


def test_table2_compares_within_a_corpus(tmp_path):
    """learned-r and learned-s both have seed 42: each model is compared on its own corpus."""
    runs = [
        train_log(tmp_path / "a.parquet", "learned-r", "learned", 42, val_loss=3.604, corpus="R"),
        train_log(tmp_path / "b.parquet", "learned-s", "learned", 42, val_loss=3.508, corpus="S"),
        train_log(
            tmp_path / "c.parquet",
            "write-rotated-r",
            "write-rotated",
            42,
            val_loss=3.654,
            corpus="R",
        ),
        train_log(
            tmp_path / "d.parquet", "all-rotated", "all-rotated", 42, val_loss=3.751, corpus="S"
        ),
    ]
    table = table2({"runs": runs})
    delta = table.frame.set_index("model")["delta_vs_learned"]
    assert delta["write-rotated-r"] == pytest.approx(0.050)
    assert delta["all-rotated"] == pytest.approx(0.243)
    assert delta["learned-s"] == 0.0
    assert table.frame.set_index("model")["corpus"].to_dict() == {
        "learned-r": "R",
        "learned-s": "S",
        "write-rotated-r": "R",
        "all-rotated": "S",
    }
    assert "Corpus" in table.markdown()


# ----------------------------------------------------------------------------- Table 5
def eval_rows(model, seed, task, split, acc, margin, n=8):
    return {
        "model": model,
        "seed": seed,
        "task": task,
        "split": split,
        "n": n,
        "accuracy": acc,
        "margin": margin,
    }


def test_table5_uses_the_evaluation_split_only_and_names_repositories(tmp_path):
    runs = [
        train_log(
            tmp_path / "r.parquet",
            "learned-r",
            "learned",
            42,
            corpus="R",
            display_name="learned",
            repository_name="plain-learned42",
        ),
    ]
    rows = [
        eval_rows("learned-r", 42, "sva", "evaluation", 0.875, 2.5),
        eval_rows("learned-r", 42, "sva", "discovery", 0.1, -1.0),
        eval_rows("learned-r", 42, "quote", "evaluation", 1.0, 4.25),
        eval_rows("learned-r", 42, "plural", "evaluation", 0.5, 0.125),
    ]
    paths = [write_rows(tmp_path / f"e{i}.parquet", [r]) for i, r in enumerate(rows)]
    table = table5({"runs": runs, "eval": paths})
    assert table.frame["task"].tolist() == ["sva", "quote", "plural"]  # paper order
    md = table.markdown()
    row = md_rows(md)[0]
    # paper layout: Model (repository) | Corpus | SVA | Quote | Plural as "acc% / margin"
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["learned (plain-learned42)", "R", "87.5 / 2.50", "100.0 / 4.25", "50.0 / 0.12"]
    assert "10.0" not in md


def test_table5_refuses_results_without_their_training_log(tmp_path):
    runs = [train_log(tmp_path / "r.parquet", "learned", "learned", 1)]
    path = write_rows(tmp_path / "e.parquet", [eval_rows("learned", 2, "sva", "evaluation", 1, 1)])
    with pytest.raises(ValueError, match=r"no training log given for \[\['learned', 2\]\]"):
        table5({"runs": runs, "eval": [path]})


def test_table5_names_a_missing_column_and_file(tmp_path):
    runs = [train_log(tmp_path / "r.parquet", "learned", "learned", 1)]
    bad = eval_rows("learned", 1, "sva", "evaluation", 1.0, 1.0)
    del bad["margin"]
    path = write_rows(tmp_path / "e.parquet", [bad])
    with pytest.raises(ValueError, match=r"e\.parquet: lacks columns \['margin'\]"):
        table5({"runs": runs, "eval": [path]})
    with pytest.raises(ValueError, match="needs input Parquets of kind 'eval'"):
        table5({"runs": runs})


# ----------------------------------------------------------------------------- Table 6
def summary_rows(model, seed, task, split="evaluation", **values):
    return {"model": model, "seed": seed, "task": task, "split": split, **values}


@pytest.fixture
def table6_inputs(tmp_path):
    runs = [
        train_log(
            tmp_path / "s.parquet", "learned-s", "learned", 42, corpus="S", display_name="learned"
        ),
        train_log(
            tmp_path / "r42.parquet", "learned-r", "learned", 42, corpus="R", display_name="learned"
        ),
        train_log(
            tmp_path / "r43.parquet", "learned-r", "learned", 43, corpus="R", display_name="learned"
        ),
    ]
    values = {
        ("learned-s", 42): [(10.44, 7.94), (12.0, 12.5), (9.2, 4.9)],
        ("learned-r", 42): [(10.0, 12.66), (12.8, 11.4), (13.3, 5.1)],
        ("learned-r", 43): [(12.7, 9.4), (16.94, 10.6), (6.0, 6.3)],
    }
    paths = []
    for (model, seed), per_task in values.items():
        for task, (n_eff, e) in zip(["sva", "quote", "plural"], per_task, strict=True):
            rows = [
                summary_rows(model, seed, task, N_eff=n_eff, E=e, top_head_share=0.25),
                summary_rows(
                    model, seed, task, "discovery", N_eff=99.0, E=99.0, top_head_share=0.9
                ),
            ]
            paths.append(write_rows(tmp_path / f"{model}{seed}{task}.parquet", rows))
    return {"runs": runs, "summaries": paths}


def test_table6_matches_the_paper_layout(table6_inputs):
    table = table6(table6_inputs)
    lines = [r for r in table.markdown().splitlines() if r.startswith("|") and "---" not in r]
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in lines]
    assert rows[0] == [
        "Model",
        "Corpus",
        "N_eff SVA",
        "N_eff Quote",
        "N_eff Plural",
        "E SVA",
        "E Quote",
        "E Plural",
    ]
    # corpus R first (seeds labelled because the display name has two), then S; 1 decimal
    assert rows[1] == ["learned (s42)", "R", "10.0", "12.8", "13.3", "12.7", "11.4", "5.1"]
    assert rows[2] == ["learned (s43)", "R", "12.7", "16.9", "6.0", "9.4", "10.6", "6.3"]
    assert rows[3] == ["learned", "S", "10.4", "12.0", "9.2", "7.9", "12.5", "4.9"]
    assert set(table.frame["split"]) == {"evaluation"}
    assert "top_head_share" in table.frame


def test_table6_shows_the_papers_rows_in_the_papers_order(tmp_path):
    """docs §6.7: corpus R learned and write-common-axis with their seeds, then the corpus-S
    models; a run of another configuration (write-rotated on R) is only in table6_all_runs,
    and the paper's rows the study lacks are named in the footnote."""
    from headgeom.heads.paper.concentration import table6_all_runs

    specs = [  # config order differs from the paper's
        ("acx", "all-common-axis", 42, "S", "all-common-axis"),
        ("wr-s", "write-rotated", 42, "S", "write-rotated"),
        ("wr-r", "write-rotated", 42, "R", "write-rotated"),
        ("learned-s", "learned", 42, "S", "learned"),
        ("learned-r", "learned", 42, "R", "learned"),
        ("learned-r", "learned", 43, "R", "learned"),
    ]
    runs, paths = [], []
    for i, (model, geometry, seed, corpus, name) in enumerate(specs):
        runs.append(train_log(tmp_path / f"run{i}.parquet", model, geometry, seed,
                              corpus=corpus, display_name=name))  # fmt: skip
        rows = [summary_rows(model, seed, t, N_eff=10.0 * i + k, E=float(i), top_head_share=0.5)
                for k, t in enumerate(["sva", "quote", "plural"])]  # fmt: skip
        paths.append(write_rows(tmp_path / f"sum{i}.parquet", rows))
    table = table6({"runs": runs, "summaries": paths})
    cells = table.blocks[0].cells
    # the paper's order; write-rotated on S needs no "[wr-s]": it is the table's only one
    assert cells["Model"].tolist() == [
        "learned (s42)", "learned (s43)", "learned", "write-rotated", "all-common-axis",
    ]  # fmt: skip
    assert cells["Corpus"].tolist() == ["R", "R", "S", "S", "S"]
    assert cells.iloc[0, 2:].tolist() == ["40.0", "41.0", "42.0", "4.0", "4.0", "4.0"]
    assert "wr-r" not in set(table.frame["model"])
    assert table.frame["model"].tolist()[::3] == ["learned-r", "learned-r", "learned-s", "wr-s",
                                                  "acx"]  # fmt: skip
    assert table.caption.endswith(
        "The paper's rows not in this study: corpus R: write-common-axis (s42, s43); corpus S: "
        "write-routed A, write-routed B, write-routed C, read-common, all-rotated, "
        "all-rotated-self."
    )
    every = table6_all_runs({"runs": runs, "summaries": paths})
    assert every.name == "table6_all_runs"
    # every run, corpus R first, then config order; two write-rotated runs need their key
    assert every.blocks[0].cells["Model"].tolist() == [
        "write-rotated [wr-r]", "learned (s42)", "learned (s43)", "all-common-axis",
        "write-rotated [wr-s]", "learned",
    ]  # fmt: skip
    assert "not in this study" not in every.caption


def test_table6_without_corpora_shows_each_run_once(tmp_path):
    """In a study without corpora (the demo) the corpus-R and corpus-S learned rows are one
    model: its seeds are shown once; nothing the study has is called missing."""
    runs, paths = [], []
    for i, (model, seed) in enumerate(
        [("learned", 42), ("learned", 43), ("write-common-axis", 42), ("all-rotated", 42)]
    ):
        runs.append(train_log(tmp_path / f"r{i}.parquet", model, model, seed))
        rows = [summary_rows(model, seed, "sva", N_eff=float(i + 1), E=1.0, top_head_share=0.5)]
        paths.append(write_rows(tmp_path / f"s{i}.parquet", rows))
    table = table6({"runs": runs, "summaries": paths})
    assert table.blocks[0].cells["Model"].tolist() == [
        "learned (s42)", "learned (s43)", "write-common-axis", "all-rotated",
    ]  # fmt: skip
    assert table.caption.endswith(
        "not in this study: write-rotated, write-routed A, write-routed B, write-routed C, "
        "read-common, all-common-axis, all-rotated-self."
    )


# ----------------------------------------------------------------------------- Table 1
#: Corpus S of the paper (docs §6.1, §6.2, §6.7): parameters, validation loss, N_eff and the
#: clean evaluation margin per task (SVA, quote, plural); read-common's quote margin is 5.48,
#: not 5.49, so that the median below is not a tie at the printed precision.
PAPER_S = {
    "learned": (124_046_592, 3.508, (10.4, 12.0, 9.2), (3.49, 5.50, 3.10)),
    "write-rotated": (116_968_704, 3.563, (16.2, 22.2, 22.2), (3.64, 4.53, 2.91)),
    "read-common": (104_582_400, 3.610, (8.1, 11.0, 10.0), (3.62, 5.48, 3.14)),
    "all-common-axis": (97_504_512, 3.698, (8.1, 12.7, 3.9), (3.81, 4.99, 2.30)),
    "all-rotated": (97_504_512, 3.751, (9.1, 11.4, 3.6), (3.88, 3.92, 2.44)),
    "all-rotated-self": (97_504_512, 3.753, (8.8, 7.9, 3.9), (3.66, 4.22, 2.54)),
}


def test_table1_writes_the_capacity_covariation_from_the_results(tmp_path):
    """docs §12.1 / §20.7: the model–task cases with N_eff below learned (the paper's 10 of
    12: every reader-restricted case but read-common plural and all-common-axis quote) have
    fewer parameters and a higher loss than the others; margins relative to learned's."""
    from headgeom.heads.paper import summary

    tasks = ["sva", "quote", "plural"]
    runs, summaries, evals = [], [], []
    for model, (n_params, loss, n_effs, margins) in PAPER_S.items():
        runs.append(train_log(tmp_path / f"{model}.log.parquet", model, model, 42, n_params,
                              loss, corpus="S"))  # fmt: skip
        rows = [summary_rows(model, 42, t, N_eff=n, E=1.0, top_head_share=0.5)
                for t, n in zip(tasks, n_effs, strict=True)]  # fmt: skip
        summaries.append(write_rows(tmp_path / f"{model}.sum.parquet", rows))
        rows = [eval_rows(model, 42, t, "evaluation", 1.0, m) for t, m in
                zip(tasks, margins, strict=True)]  # fmt: skip
        evals.append(write_rows(tmp_path / f"{model}.eval.parquet", rows))
    table = summary.table1({"runs": runs, "summaries": summaries, "eval": evals})
    finding = table.frame.set_index("property").loc["Functional concentration", "finding"]
    # Δ clean margin vs learned, by hand: the 10 cases below learned, sorted, −1.58, −1.28,
    # −0.80, −0.66, −0.56, −0.02, +0.13, +0.17, +0.32, +0.39 (median −0.29); the 5 others
    # −0.97, −0.51, −0.19, +0.04, +0.15 (median −0.19)
    assert finding.endswith(
        "capacity covariation (corpus S): the 10 model–task cases below learned have "
        "97.50M–104.58M parameters and Δ loss +0.102 to +0.245 (the 5 others: 97.50M–116.97M, "
        "+0.055 to +0.190), median Δ clean margin vs learned -0.29 (others -0.19)"
    )
    assert finding.startswith("N_eff 3.6–22.2 over runs × tasks")  # the earlier findings stay
    # without clean margins the finding says nothing about them
    no_eval = summary.table1({"runs": runs, "summaries": summaries})
    text = no_eval.frame.set_index("property").loc["Functional concentration", "finding"]
    assert text.endswith("(the 5 others: 97.50M–116.97M, +0.055 to +0.190)")


# ----------------------------------------------------------------------------- Table 3
def test_decomposition_cell_rounds_each_factor_separately():
    # 5.57 × 1.87 = 10.4159: the printed factors multiply to 10.64, not the printed 10.4
    assert decomposition_cell(5.57 * 1.87, 5.57, 1.87) == "10.4 = 5.6 × 1.9"
    assert decomposition_cell(8.1, float("nan"), float("nan")) == "8.1"
    assert format_p(1 / 5001) == "0.0002" and format_p(0.0312) == "0.031"
    assert fixed(-0.001, 2) == "0.00" and fixed(-0.006, 2) == "-0.01"


def robustness_row(model, seed, task, n_index, n_layer, meaningful=True, **extra):
    row = {
        "model": model,
        "seed": seed,
        "task": task,
        "split": "evaluation",
        "N_eff": n_index * n_layer,
        "N_index": n_index,
        "N_layer_given_index": n_layer,
        "index_meaningful": meaningful,
        "N_index_null_median": 5.0,
        "N_index_p_lower": 0.0042,
        "n_permutations": 5000,
        "N_eff_abs": 2.5 * n_index * n_layer,
        "N_eff_ci_low": n_index * n_layer - 0.5,
        "N_eff_ci_high": n_index * n_layer + 0.25,
        "ci_level": 0.95,
        "n_bootstrap": 2000,
    }
    row.update(extra)
    return row


@pytest.fixture
def table3_inputs(tmp_path):
    runs = [
        train_log(
            tmp_path / "a.parquet", "learned-s", "learned", 42, corpus="S", display_name="learned"
        ),
        train_log(
            tmp_path / "b.parquet",
            "write-routed-a",
            "write-routed-a",
            42,
            corpus="S",
            display_name="write-routed A",
        ),
    ]
    factors = {"sva": (5.57, 1.87), "quote": (2.04, 3.96), "plural": (4.9, 1.9)}
    paths = []
    for task, (n_index, n_layer) in factors.items():
        paths.append(
            write_rows(
                tmp_path / f"l{task}.parquet",
                [robustness_row("learned-s", 42, task, n_index, n_layer)],
            )
        )
        paths.append(
            write_rows(
                tmp_path / f"r{task}.parquet",
                [robustness_row("write-routed-a", 42, task, 4.0, 5.0, False)],
            )
        )
    return {"runs": runs, "robustness": paths}


def test_table3_blocks(table3_inputs):
    table = table3(table3_inputs)
    md = table.markdown()
    assert [b.title for b in table.blocks] == [
        "N_eff = N_index × N_layer|index",
        "N_index vs index-permutation null median (lower p)",
        "N_eff from E_x|d(x)|",
        "Reversals, A vs B: N_eff → N_eff from E_x|d(x)|",
    ]
    first = table.blocks[0].cells.set_index("Model")
    assert first.loc["learned", "SVA"] == "10.4 = 5.6 × 1.9"
    assert first.loc["learned", "Quote"] == "8.1 = 2.0 × 4.0"
    # the index is not comparable across layers in a routed model: N_eff alone
    assert first.loc["write-routed A", "SVA"] == "20.0"
    null = table.blocks[1].cells.set_index("Model")
    assert null.loc["learned", "SVA"] == "5.6 vs 5.0, p = 0.0042"
    assert null.loc["write-routed A", "SVA"] == "—"
    absolute = table.blocks[2].cells.set_index("Model")
    assert absolute.loc["learned", "SVA"] == f"{2.5 * 5.57 * 1.87:.1f}" == "26.0"
    ratio = table.frame.set_index(["model", "task"])["N_eff_abs_ratio"]
    assert ratio[("learned-s", "sva")] == pytest.approx(2.5)
    assert "**N_eff from E_x|d(x)|**" in md
    assert "5000 draws" in table.caption
    # 10.4 < 20.0 stays 26.0 < 50.0 in every task: no pair reverses
    assert table.blocks[3].cells.values.tolist() == [["none", "—", "—", "—"]]
    assert set(table.frame["abs_reversed_with"]) == {""}


def test_table3_lists_the_reversals_of_close_pairs(tmp_path):
    """docs §12.3 with the paper's Table 3 values of three models: plural learned vs
    read-common 9.2 < 10.0 becomes 24.0 > 21.0, quote learned vs all-common-axis 12.0 < 12.7
    becomes 18.8 > 18.7; SVA has no reversal (8.1 = 8.1 is a tie, not a reversal)."""
    values = {  # (N_eff, N_eff from E_x|d(x)|) per task: SVA, quote, plural
        "learned": [(10.4, 20.1), (12.0, 18.8), (9.2, 24.0)],
        "read-common": [(8.1, 14.8), (11.0, 16.1), (10.0, 21.0)],
        "all-common-axis": [(8.1, 11.9), (12.7, 18.7), (3.9, 9.1)],
    }
    runs, paths = [], []
    for model, per_task in values.items():
        runs.append(train_log(tmp_path / f"{model}.parquet", model, model, 42))
        rows = [robustness_row(model, 42, task, 1.0, n_eff, N_eff_abs=n_abs)
                for task, (n_eff, n_abs) in zip(["sva", "quote", "plural"], per_task,
                                                strict=True)]  # fmt: skip
        paths.append(write_rows(tmp_path / f"{model}.rob.parquet", rows))
    table = table3({"runs": runs, "robustness": paths})
    flips = table.blocks[3].cells.set_index("Model")
    assert flips.to_dict("index") == {
        "learned vs read-common": {"SVA": "—", "Quote": "—", "Plural": "9.2 < 10.0 → 24.0 > 21.0"},
        "learned vs all-common-axis": {"SVA": "—", "Quote": "12.0 < 12.7 → 18.8 > 18.7",
                                       "Plural": "—"},
    }  # fmt: skip
    partners = table.frame.set_index(["model", "task"])["abs_reversed_with"]
    assert partners[("learned", "plural")] == "read-common"
    assert partners[("read-common", "plural")] == "learned"
    assert partners[("learned", "quote")] == "all-common-axis"
    assert partners[("learned", "sva")] == partners[("all-common-axis", "plural")] == ""
    assert r"9.2 $<$ 10.0 $\rightarrow$ 24.0 $>$ 21.0" in table.latex()


def test_table3_of_models_without_a_meaningful_index_gives_n_eff_alone(tmp_path):
    """A study of one pretrained model (or routed models only): no row's head index is
    comparable across layers, so every decomposition and null cell is N_eff alone / —."""
    runs = [train_log(tmp_path / "r.parquet", "write-routed-a", "write-routed-a", 42)]
    rows = [robustness_row("write-routed-a", 42, t, 4.0, 5.0, False)
            for t in ("sva", "quote", "plural")]  # fmt: skip
    table = table3({"runs": runs, "robustness": [write_rows(tmp_path / "r.rob.parquet", rows)]})
    assert table.blocks[0].cells.values.tolist() == [["write-routed-a", "20.0", "20.0", "20.0"]]
    assert table.blocks[1].cells.values.tolist() == [["write-routed-a", "—", "—", "—"]]


def test_table3_fails_clearly_without_the_robustness_columns(tmp_path, table3_inputs):
    row = robustness_row("learned-s", 42, "sva", 2.0, 2.0)
    del row["N_index_p_lower"]
    path = write_rows(tmp_path / "old.parquet", [row])
    with pytest.raises(ValueError, match=r"old\.parquet: lacks columns \['N_index_p_lower'\]"):
        table3({"runs": table3_inputs["runs"], "robustness": [path]})


# ----------------------------------------------------------------------------- τ (§13.4)
def test_tau_is_reported_over_the_papers_steps_only(tmp_path):
    """docs §13.4: τ at the paper's 1,024, 4,096, 16,384 and 65,536 of 65,536 steps; the
    timeline's step 256 (1/256 of training) is neither in the dynamics table nor in the
    comparison's "all steps" range."""
    from headgeom import results
    from headgeom.heads.paper import comparison
    from headgeom.heads.paper.context import Context
    from headgeom.heads.paper.dynamics import dynamics_table

    steps, adjacent = [256, 1024, 4096, 16384, 65536], [0.2, 0.8, 0.85, 0.87, 0.89]
    tau = pd.DataFrame([{"model": "wc", "seed": 42, "step": s, "is_final": s == 65536,
                         "checkpoint_sha256": "0" * 64, "n_examples": 240, "n_positions": 2400,
                         "adjacent_cosine_mean": a, "adjacent_cosine_min": a - 0.1,
                         "adjacent_cosine_max": a + 0.05, "same_index_cosine": a / 2,
                         "different_index_cosine": 0.0, "same_index_internal_cosine": 0.5,
                         "different_index_internal_cosine": 0.0, "lane_index": 1,
                         "lane_share": 0.4, "lane_share_max_other": 0.3,
                         "lane_share_chance": 0.25} for s, a in zip(steps, adjacent,
                                                                   strict=True)])  # fmt: skip
    results.TAU.write(tmp_path / "tau.parquet", tau)
    heads = pd.DataFrame([{"model": "wc", "seed": 42, "step": 65536, "is_final": True,
                           "checkpoint_sha256": "1" * 64, "layer": 0, "head": 0,
                           "own_trace": 1.0, "max_other_abs_trace": 0.5, "own_largest": True,
                           "n_tokens": 64, "scalar_trace": 1.0}])  # fmt: skip
    results.VALUE_GRADIENTS.write(tmp_path / "vg.parquet", heads)
    runs = [train_log(tmp_path / "log.parquet", "wc", "write-common", 42)]
    table = dynamics_table({"runs": runs, "tau": [str(tmp_path / "tau.parquet")],
                            "value_gradients": [str(tmp_path / "vg.parquet")]})  # fmt: skip
    tau_rows = table.frame[table.frame["section"] == "§13.4"]
    assert list(dict.fromkeys(tau_rows["step"])) == ["1024", "4096", "16384", "65536 (final)"]
    c = Context({"tau": ["unused"]})
    c._frames = {"tau": tau}
    (ref,) = [r for r in comparison.REFERENCES
              if r.metric == "task-gradient adjacent-layer cosine, all steps"]  # fmt: skip
    assert ref.compute(c) == pytest.approx((0.8, 0.89))  # not 0.2 at step 256


# ----------------------------------------------------------------------------- ranges
def test_value_range_prints_both_ends_unless_they_print_alike():
    assert value_range(pd.Series([0.1234, 0.5678, np.nan])) == "0.12–0.57"
    # ends that print the same are one value, even when they differ below the precision
    assert value_range(pd.Series([0.121, 0.124])) == "0.12"
    assert value_range(pd.Series([0.121, 0.126])) == "0.12–0.13"
    assert value_range(pd.Series([0.05, 0.835]), "{:.0f}", scale=100, unit="%") == "5–84%"
    assert value_range(pd.Series([0.2, 0.2]), "{:.1f}%", " to ", 100, collapse=False) == (
        "20.0% to 20.0%"
    )
    assert value_range(pd.Series([-0.1, 0.246]), "{:+.3f}", " to ") == "-0.100 to +0.246"
    assert value_range(pd.Series([np.nan])) == value_range(pd.Series([], dtype=float)) == "—"


# ----------------------------------------------------------------------------- LaTeX
def test_latex_escapes_names_and_paper_symbols():
    assert latex_escape("a_b & 50% #1 {x}") == r"a\_b \& 50\% \#1 \{x\}"
    assert latex_escape("10.4 = 5.6 × 1.9") == r"10.4 = 5.6 $\times$ 1.9"
    assert latex_escape("N_eff") == r"$N_{\mathrm{eff}}$"
    assert latex_escape("Δ vs learned") == r"$\Delta$ vs learned"
    assert latex_escape("—") == "---"
    assert latex_escape("E_x|d(x)| vs |E_x d(x)|") == (
        r"$\mathbb{E}_x|d(x)|$ vs $|\mathbb{E}_x d(x)|$"
    )


@pytest.mark.parametrize("name", ["table3", "table6"])
def test_latex_prints_the_same_numbers_as_markdown_and_csv(name, table3_inputs, table6_inputs):
    table = TABLES[name].function()(table3_inputs if name == "table3" else table6_inputs)
    tex = table.latex()
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 1
    assert r"\begin{tabular}" in tex and r"\end{table}" in tex
    md, tx = md_rows(table.markdown()), tex_rows(tex)
    assert len(md) == len(tx) > 0
    for m, t in zip(md, tx, strict=True):
        assert numbers(m) == numbers(t), (m, t)
        assert m.count("|") - 1 == t.count("&") + 1 - t.count("$|$")  # same cells per row
    # and both print the CSV's unrounded values at the paper's precision
    frame = table.frame
    printed = set(numbers(tex))
    for value in frame["N_eff"]:
        assert f"{value:.1f}" in printed


def test_latex_group_header_spans_the_statistics(table6_inputs):
    tex = table6(table6_inputs).latex()
    assert r"\multicolumn{3}{c}{$N_{\mathrm{eff}}$} & \multicolumn{3}{c}{$E$}" in tex
    assert r"\cmidrule(lr){3-5} \cmidrule(lr){6-8}" in tex
    assert r"\begin{tabular}{llrrrrrr}" in tex


# ----------------------------------------------------------------------------- lanes, leakage
def test_lane_table_applies_bonferroni_within_model(tmp_path):
    paths = [
        write_rows(
            tmp_path / f"{t}.parquet",
            [
                summary_rows(
                    "learned",
                    42,
                    t,
                    "discovery",
                    lambda_score=lam,
                    chance=0.25,
                    p_value=p,
                    n_permutations=5000,
                )
            ],
        )
        for t, lam, p in [("sva", 0.5, 0.0002), ("quote", 0.3, 0.4), ("plural", 0.2, 0.9)]
    ]
    runs = [train_log(tmp_path / "run.parquet", "learned", "learned", 42)]
    table = TABLES["lanes"].function()({"runs": runs, "lanes": paths})
    corrected = table.frame.set_index("task")["p_bonferroni"]
    assert corrected["sva"] == pytest.approx(0.0006)
    assert corrected["quote"] == 1.0  # 3 × 0.4 capped at 1
    assert corrected["plural"] == 1.0
    assert r"$\Lambda$" in table.latex()


def test_lane_table_marks_runs_beyond_the_papers_lambda_runs_as_extra(tmp_path):
    """docs §13.1: the paper's Λ runs include two learned seeds on corpus R and only the
    first write-common-axis seed; the second seed and the routed model are extra."""
    specs = [("learned", "learned", 42), ("learned", "learned", 43),
             ("wca", "write-common-axis", 42), ("wca", "write-common-axis", 43),
             ("routed", "write-routed-a", 42)]  # fmt: skip
    runs, paths = [], []
    for i, (model, geometry, seed) in enumerate(specs):
        runs.append(train_log(tmp_path / f"r{i}.parquet", model, geometry, seed))
        row = summary_rows(model, seed, "sva", "discovery", lambda_score=0.2, chance=0.25,
                           p_value=0.5, n_permutations=100)  # fmt: skip
        paths.append(write_rows(tmp_path / f"l{i}.parquet", [row]))
    table = TABLES["lanes"].function()({"runs": runs, "lanes": paths})
    marked = table.frame.set_index(["model", "seed"])["paper_lambda"].to_dict()
    assert marked == {("learned", 42): True, ("learned", 43): True, ("wca", 42): True,
                      ("wca", 43): False, ("routed", 42): False}  # fmt: skip
    assert table.blocks[0].cells["Run"].tolist() == ["paper", "paper", "paper", "extra", "extra"]
    assert "(2 runs)" in table.caption


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
    table = TABLES["leakage"].function()({"leakage": [write_rows(tmp_path / "l.parquet", rows)]})
    q = table.frame.set_index("read_type").loc["Q"]
    assert q["median_leakage"] == pytest.approx(0.4)
    assert q["median_leakage_over_rho"] == pytest.approx(2.0)
    assert q["spearman_leakage_rho"] == pytest.approx(1.0)
    assert "40.0%" in table.markdown() and r"40.0\%" in table.latex()


# ----------------------------------------------------------------------------- script
def test_make_table_writes_md_csv_tex_and_sources(tmp_path, table3_inputs):
    out = tmp_path / "out"
    argv = ["--table", "table3"]
    for kind, paths in table3_inputs.items():
        argv += ["--input", kind, *paths]
    argv += ["--out-md", str(out / "t.md"), "--out-csv", str(out / "t.csv")]
    argv += ["--out-tex", str(out / "t.tex"), "--out-sources", str(out / "t.json")]
    assert make_table_main(argv) == 0
    assert "10.4 = 5.6 × 1.9" in (out / "t.md").read_text()
    assert r"10.4 = 5.6 $\times$ 1.9" in (out / "t.tex").read_text()
    csv = pd.read_csv(out / "t.csv")
    assert np.allclose(
        csv.set_index(["model", "task"]).loc[("learned-s", "sva"), "N_eff"], 5.57 * 1.87
    )
    sources = json.loads((out / "t.json").read_text())
    assert set(sources["kinds"]) == {"runs", "robustness"}
    assert set(sources["inputs"]) == {p for ps in table3_inputs.values() for p in ps}


def test_a_block_with_its_own_header_prints_its_own_column_names():
    from headgeom.render import Block, Table

    main = Block(pd.DataFrame({"Model": ["a"], "ρ": ["0.1 [≈ 0]"]}))
    other = Block(pd.DataFrame({"Circuit": ["c"], "Edges": ["11 [22]"]}), "ACDC", True)
    table = Table("t", pd.DataFrame(), [main, other], "caption")
    md = table.markdown()
    assert "| Circuit" in md and "| Model" in md
    assert md.index("| Model") < md.index("**ACDC**") < md.index("| Circuit")
    tex = table.latex()
    assert r"Circuit & Edges \\" in tex and r"Model & $\rho$ \\" in tex
    assert r"[$\approx$ 0]" in tex
    plain = Table("t", pd.DataFrame(), [main, Block(other.cells, "ACDC")], "caption").markdown()
    assert "| Circuit" not in plain  # without own_header a block takes the table's titles


def test_a_multiscreen_learned_run_is_not_the_learned_reference(tmp_path):
    # a multiscreen-learned model stores `geometry: learned` in its config; on the same corpus
    # and seed as the GPT learned run it must not become a second learned reference (the
    # rehearsal's document failed on the duplicate before read_runs named study geometries)
    from headgeom.heads.paper.inputs import learned_reference, read_runs
    from headgeom.io import write_parquet as write

    paths = []
    for name, model, loss in (("learned-r", {"geometry": "learned"}, 3.0),
                              ("multiscreen-learned", {"geometry": "learned",
                                                       "architecture": "multiscreen"}, 4.0),
                              ("write-common", {"geometry": "write-common"}, 3.5)):  # fmt: skip
        cfg = {"model_name": name, "seed": 42, "corpus": "R", "model": model}
        frame = pd.DataFrame({"step": [1]})
        path = tmp_path / f"{name}.parquet"
        write(path, frame, pa.schema([("step", pa.int64())]),
              {"config": cfg, "n_params": 1, "val_loss_nats": loss})  # fmt: skip
        paths.append(str(path))
    runs = read_runs(paths)
    assert runs["geometry"].tolist() == ["learned", "multiscreen-learned", "write-common"]
    ref = learned_reference(runs, "val_loss", [])
    assert ref.tolist() == [3.0, 3.0, 3.0]  # the GPT learned run's loss for every row
