"""The paper's model selections and pairs (headgeom.heads.selections), by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from headgeom.heads.selections import (
    default_pairs,
    in_tau_range,
    lambda_paper_runs,
    loss_models,
    resolve_pairs,
    select_models,
)

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- selections
def test_paper_selections_on_the_paper_config():
    models = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["models"]
    # docs §12.2: the 7 corpus-S models of Table 3
    assert select_models(models, "table3") == [
        ("learned-s", 42),
        ("write-rotated-s", 42),
        ("read-common", 42),
        ("all-common-axis", 42),
        ("all-rotated", 42),
        ("all-rotated-self", 42),
        ("mlp3456", 42),
    ]
    assert [m for m, _ in select_models(models, "figure4")][6:] == [
        "write-routed-a",
        "write-routed-b",
        "write-routed-c",
    ]
    assert len(select_models(models, "figure4")) == 9  # §12.7
    assert select_models(models, "figure5") == [
        ("learned-s", 42),
        ("mlp3456", 42),
        ("all-rotated", 42),
        ("all-rotated-self", 42),
    ]


def test_paper_selections_without_corpora_use_stand_ins():
    models = {
        "learned": {"geometry": "learned", "seeds": [42, 43]},
        "write-common-axis": {"geometry": "write-common-axis", "seeds": [42, 43]},
        "all-rotated": {"geometry": "all-rotated", "seeds": [42]},
    }
    assert select_models(models, "table3") == [
        ("learned", 42),
        ("learned", 43),
        ("all-rotated", 42),
        ("write-common-axis", 42),
        ("write-common-axis", 43),
    ]
    assert select_models(models, "figure5") == [
        ("learned", 42),
        ("write-common-axis", 42),
        ("all-rotated", 42),
    ]
    with pytest.raises(ValueError, match="no paper selection"):
        select_models(models, "table9")


# ----------------------------------------------------------------------- pairs
def test_default_pairs_match_geometry_and_corpus():
    models = {
        "learned-r": {"geometry": "learned", "corpus": "R", "seeds": [42, 43]},
        "learned-s": {"geometry": "learned", "corpus": "S", "seeds": [42]},
        "write-rotated-s": {"geometry": "write-rotated", "corpus": "S", "seeds": [42]},
        "acx": {"geometry": "all-common-axis", "corpus": "S", "seeds": [42]},
        "ar": {"geometry": "all-rotated", "corpus": "S", "seeds": [42]},
    }
    labels = [p["pair_label"] for p in default_pairs(models)]
    assert labels == [
        "acx s42 − ar s42",
        "write-rotated-s s42 − learned-s s42",
        "learned-r s42 − learned-r s43",
    ]
    assert loss_models(models, None) == ["learned-s", "write-rotated-s", "acx", "ar"]


def test_configured_pairs_are_checked():
    models = {
        "a": {"geometry": "learned", "seeds": [1, 2]},
        "b": {"geometry": "learned", "seeds": [3]},
    }
    got = resolve_pairs(models, [{"a": "a", "b": "b"}, {"a": "a", "seed_a": 2, "b": "a"}])
    assert [(p["seed_a"], p["seed_b"]) for p in got] == [(1, 3), (2, 1)]
    with pytest.raises(ValueError, match="unknown model 'c'"):
        resolve_pairs(models, [{"a": "a", "b": "c"}])
    with pytest.raises(ValueError, match="has seeds \\[3\\], not 4"):
        resolve_pairs(models, [{"a": "a", "b": "b", "seed_b": 4}])
    with pytest.raises(ValueError, match="itself"):
        resolve_pairs(models, [{"a": "a", "b": "a"}])


# ----------------------------------------------------------------------------- Table 6, Λ, τ
def test_table6_selects_the_papers_thirteen_rows_on_the_paper_config():
    models = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["models"]
    # docs §6.7: corpus R learned s42, s43 and write-common-axis s42, s43; then corpus S
    assert select_models(models, "table6") == [
        ("learned-r", 42),
        ("learned-r", 43),
        ("write-common-axis", 42),
        ("write-common-axis", 43),
        ("learned-s", 42),
        ("write-rotated-s", 42),
        ("write-routed-a", 42),
        ("write-routed-b", 42),
        ("write-routed-c", 42),
        ("read-common", 42),
        ("all-common-axis", 42),
        ("all-rotated", 42),
        ("all-rotated-self", 42),
    ]


def test_table6_without_corpora_takes_each_run_once():
    models = {
        "learned": {"geometry": "learned", "seeds": [42, 43]},
        "write-rotated": {"geometry": "write-rotated", "seeds": [42]},
        "write-common-axis": {"geometry": "write-common-axis", "seeds": [42, 43]},
        "write-common": {"geometry": "write-common", "seeds": [42]},  # not a Table 6 row
    }
    assert select_models(models, "table6") == [
        ("learned", 42),
        ("learned", 43),
        ("write-common-axis", 42),
        ("write-common-axis", 43),
        ("write-rotated", 42),
    ]


def test_lambda_paper_runs_are_the_papers_thirteen():
    models = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["models"]
    runs = {(m, int(s)) for m, spec in models.items() for s in spec["seeds"]}
    paper = lambda_paper_runs(models)
    # docs §13.1: plain-learned42/43, dense, layered42, rotated-m1-42, the four block-reader
    # models, mlp3456, value384, common42 and plain-identity42
    assert paper == {
        ("learned-r", 42), ("learned-r", 43), ("learned-s", 42), ("write-rotated-r", 42),
        ("write-rotated-s", 42), ("all-rotated", 42), ("all-rotated-self", 42),
        ("read-common", 42), ("all-common-axis", 42), ("mlp3456", 42), ("value384", 42),
        ("write-common", 42), ("write-common-axis", 42),
    }  # fmt: skip
    assert sorted(runs - paper) == [
        ("fixeddiag", 42), ("identity-original", 42), ("multiscreen-identity", 42),
        ("multiscreen-learned", 42), ("write-common-axis", 43), ("write-routed-a", 42),
        ("write-routed-b", 42), ("write-routed-c", 42),
    ]  # fmt: skip
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]
    demo_runs = {(m, int(s)) for m, spec in demo.items() for s in spec["seeds"]}
    assert demo_runs - lambda_paper_runs(demo) == {("write-common-axis", 43)}


def test_tau_range_starts_at_the_papers_step_1024_of_65536():
    assert [in_tau_range(s, 65536) for s in (256, 1024, 4096, 16384, 65536)] == [
        False, True, True, True, True,
    ]  # fmt: skip
    # the same fraction of a shorter run: 1/64 of 6,400 is 100
    assert [in_tau_range(s, 6400) for s in (99, 100, 6400)] == [False, True, True]
