"""The paper's outputs as records (headgeom.heads.paper.outputs): each names functions that exist
and take what its job gives them, inputs the workflow can make, a section of the paper;
the workflow reads them without loading the section modules; nothing can add to them."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from headgeom.heads.paper import outputs
from headgeom.heads.paper.output import SECTIONS, SETUP, Output
from headgeom.heads.paper.plan import PaperPlan
from headgeom.heads.study import Study
from headgeom.paths import TEMPLATES

REPO = Path(__file__).resolve().parents[2]
RECORDS = [*outputs.TABLES.values(), *outputs.FIGURES.values()]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r.kind}-{r.name}")
def test_every_record_names_functions_its_job_can_call(record):
    build = record.function("build")
    params = list(inspect.signature(build).parameters.values())
    assert params and params[0].name == "inputs", record.build
    if record.kind == "table" and record.document:  # make_document: (inputs, context)
        assert len(params) >= 2, f"{record.build} takes no context"
    elif record.kind == "table":  # make_table: (inputs)
        assert all(p.default is not p.empty for p in params[1:]), record.build
    else:
        draw = record.function("draw")
        assert len(inspect.signature(draw).parameters) >= 1, record.draw
        if record.plots_models:  # make_figure passes --models as models=
            assert "models" in inspect.signature(build).parameters, record.build


def test_every_input_is_a_result_the_workflow_makes_for_a_run_set_the_study_knows():
    paths = TEMPLATES
    study = Study.from_config(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    for record in RECORDS:
        for kind, (result, _) in record.inputs.items():
            assert result in paths, f"{record.name}: input {kind} reads unknown result {result}"
        # every run set resolves (an unknown one is a KeyError in Study.run_set)
        PaperPlan(study).paper_inputs(record.name, record.kind)


def test_the_records_are_every_output_once_in_the_papers_section_order():
    assert sorted(outputs.DOCUMENT_TABLES + outputs.TABLE_JOBS) == sorted(outputs.TABLES)
    order = [outputs.section_order(r.section) for r in outputs.RECORDS]
    assert order == sorted(order)
    assert {r.section for r in outputs.RECORDS} == set(SECTIONS)
    # the block ablation atlas is a table and a figure of the same Parquets
    assert outputs.TABLES["ablation_atlas"].inputs == outputs.FIGURES["ablation_atlas"].inputs


def test_nothing_can_add_to_the_records_or_change_one():
    with pytest.raises(TypeError):
        outputs.TABLES["new"] = outputs.TABLES["table2"]  # type: ignore[index]
    with pytest.raises(TypeError):
        outputs.TABLES["table2"].inputs["extra"] = ("train_log", "runs")  # type: ignore[index]
    with pytest.raises(AttributeError):
        outputs.TABLES["table2"].section = "§9"  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"kind": "plot"}, "kind 'plot' is not table or figure"),
        ({"section": "§9 Future"}, "section '§9 Future' not in"),
        ({"draw": "setup:figure1"}, "a figure has a draw function, a table none"),
        ({"build": "setup.table2"}, "'setup.table2' is not 'module:function'"),
        ({"caption": "Table 2."}, "a caption says what it shows"),
    ],
)
def test_a_bad_record_is_refused_with_what_is_wrong(changes, message):
    spec = {
        "name": "t",
        "kind": "table",
        "section": SETUP,
        "inputs": {},
        "build": "setup:table2",
        "caption": "A table of what the setup builds, forty characters or more.",
    }
    with pytest.raises(ValueError, match=re.escape(message)):
        Output(**{**spec, **changes})


def test_an_unknown_output_names_the_known():
    with pytest.raises(KeyError, match="no paper figure 'figure9'; known: .*'figure8'"):
        outputs.record("figure", "figure9")


def loaded_after(statements: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a new interpreter has loaded after running ``statements``."""
    code = f"import sys; {statements}; print([m for m in {modules!r} if m in sys.modules])"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return ast.literal_eval(out.stdout)


def test_the_workflow_reads_the_records_without_loading_pandas_or_matplotlib():
    # the Snakefile and every Slurm job parse the records (about 2 s more with the engines)
    statements = "import headgeom.heads.study, headgeom.heads.paper.plan, headgeom.model.facts"
    assert loaded_after(statements, ("pandas", "matplotlib", "scipy", "torch")) == []


def test_a_table_job_loads_neither_seaborn_nor_scipy_stats():
    # about 1 s of every make_table job's start; only drawing (and the few table builders
    # that compute a Spearman ρ or a t interval) import them, when called
    statements = (
        "from headgeom.heads.paper import outputs; "
        "[o.function('build') for o in [*outputs.TABLES.values(), *outputs.FIGURES.values()]]"
    )
    assert loaded_after(statements, ("seaborn", "scipy.stats")) == []
