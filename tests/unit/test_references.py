"""The paper's numbers as data (headgeom/heads/paper/references.yaml, headgeom/model/zoo.yaml): each
written once in the source tree, every record bound to a recipe and every recipe used, the
tables' paper values read from the file, and short errors naming file, record and key."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from headgeom import datafile
from headgeom.heads import selections
from headgeom.heads.paper import comparison, dynamics, edges, recipes, references
from headgeom.heads.paper.coordinates import coordinates_paper
from headgeom.model import zoo

FIGURE4 = [slot[0] for slot in selections.PAPER_SELECTIONS["figure4"]]

SRC = Path(__file__).resolve().parents[2] / "src"


def source_files(suffix: str = "") -> list[Path]:
    return sorted(
        p for p in SRC.rglob(f"*{suffix}") if p.is_file() and "__pycache__" not in p.parts
    )


def python_constants() -> list[tuple[Path, object]]:
    """Every literal (number or string, docstrings and f-string parts included) of src/."""
    return [
        (path, node.value)
        for path in source_files(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant)
    ]


def occurrences(text: str) -> list[str]:
    """Files under src/ (any type) that contain ``text``, once per occurrence."""
    return [
        str(path.relative_to(SRC))
        for path in source_files()
        if path.suffix in {".py", ".yaml", ".smk", ".md", ".txt"}
        for _ in range(path.read_text(errors="replace").count(text))
    ]


# ----------------------------------------------------------------------------- once
def test_the_zoo_numbers_stand_once_in_the_source_tree():
    # learned R seed 42's validation loss: the zoo's record, read from there by the comparison
    assert occurrences("3.604") == ["headgeom/model/zoo.yaml"]
    # 124,046,592 is written per geometry in the zoo; its printed 124.05M is derived from it
    assert occurrences("124.05") == []
    assert {p for p in occurrences("124_046_592")} == {"headgeom/model/zoo.yaml"}
    literals = [(p, v) for p, v in python_constants() if not isinstance(v, bool)]
    for number in (3.604, 124.05, 124_046_592, 3.508, 3.753):
        assert [p for p, v in literals if v == number] == [], number
    learned = [r for r in comparison.REFERENCES if r.metric == "validation loss (nats)"][0]
    assert learned.paper == f"{zoo.BY_KEY['learned-r'].val_loss[42]:.3f}" == "3.604"
    params = [r for r in comparison.REFERENCES if r.metric == "parameters (millions)"][0]
    assert params.paper == zoo.BY_KEY["learned-r"].printed == "124.05M"
    assert params.low == params.high == pytest.approx(124.05)


def table_paper_texts() -> set[str]:
    """The paper values the tables print (dynamics, coordinates, Table 7, clamps: every record
    a table asks for by id) that are distinctive: a range, a share or a ratio ("0.79–0.89",
    "52%", "20 / 2 of 75"), not a bare number that other text could hold (§10.4)."""
    ids = [e.id for e in (*references.references(), *references.printed()) if e.id]
    texts = {references.text(i) for i in ids} | set(coordinates_paper().values())
    return {t for t in texts if len(t) > 2 and any(c in t for c in "–%/≈")}


def test_the_tables_paper_values_are_no_literals_in_src():
    texts = table_paper_texts()
    assert {
        "0.79–0.89",
        "77–78%",
        "45–83%",
        "52%",
        "0.04–0.05",
        "−0.04–0.07",
        "−0.4% to 24%",
        "70–109%",
        "20 / 2 of 75",
        "≈ 0",
    } <= texts
    strings = [(p, v) for p, v in python_constants() if isinstance(v, str)]
    found = {(str(p.relative_to(SRC)), t) for p, v in strings for t in texts if t in v}
    assert found == set()
    # the comparison and the coordinates table read the same records
    coordinates = {
        (r.args["groups"][0], r.args["site"]): r.paper
        for r in comparison.REFERENCES
        if r.recipe == "coordinate_share"
    }
    assert coordinates == coordinates_paper() and len(coordinates) == 8
    assert dynamics._paper("vgrad_early", "write-rotated") == "77–78% (step 256)"
    assert dynamics._paper("tau_same", "write-rotated") == "0.04–0.05"
    assert dynamics._paper("tau_same", "learned") == "—"


def test_check_c16_reads_the_comparisons_n_eff():
    n_eff = {
        (r.args["geometry"], r.args["task"]): r.low
        for r in comparison.REFERENCES
        if r.id and r.id.startswith("neff.")
    }
    assert len(n_eff) == 15
    from headgeom.heads.paper.cross_run_checks import paper_figure4_n_eff

    figure4 = paper_figure4_n_eff()
    assert list(figure4) == FIGURE4 and len(FIGURE4) == 9
    for (geometry, task), value in n_eff.items():
        assert figure4[geometry][recipes.TASKS.index(task)] == value


# ----------------------------------------------------------------------------- recipes
def test_every_record_has_a_recipe_and_every_recipe_is_used():
    entries = references.references()
    assert len(entries) == len(comparison.REFERENCES) == 245
    assert all(e.recipe in recipes.RECIPES for e in entries)
    assert {e.recipe for e in entries} == set(recipes.RECIPES)
    for ref, entry in zip(comparison.REFERENCES, entries, strict=True):
        assert (ref.recipe, dict(ref.args), ref.paper) == (
            entry.recipe,
            dict(entry.args),
            entry.paper,
        )
        assert ref.kinds == recipes.RECIPES[ref.recipe].kinds({"kind": ref.args.get("kind")})
    # every record the tables and check C16 ask for exists, and every printed record is asked
    asked = {i for g in dynamics.DYNAMICS_PAPER.values() for i in g.values()}
    asked |= {i for group in edges.TABLE7_PAPER.values() for i in group if i}
    asked |= set(edges.ACDC_PAPER.values()) | {"interaction.over_20_50"}
    asked |= {f"neff.{g}.S.{t}" for g in FIGURE4 for t in recipes.TASKS}
    for i in asked:
        references.entry(i)
    assert {e.id for e in references.printed()} <= asked


def test_a_recipe_reads_its_arguments_from_the_record():
    (ref,) = [r for r in comparison.REFERENCES if r.id == "neff.learned.S.quote"]
    assert (ref.recipe, dict(ref.args)) == (
        "stat",
        {
            "kind": "summaries",
            "geometry": "learned",
            "corpus": "S",
            "task": "quote",
            "column": "N_eff",
        },
    )
    assert ref.kinds == ("summaries",) and ref.paper == "12.0" and ref.decimals == 1


# ----------------------------------------------------------------------------- errors
@pytest.fixture
def edited(monkeypatch):
    """Load the data files with ``edit(name, data)`` applied to the parsed file."""
    read = datafile.read

    def use(edit):
        def patched(package, name):
            data = copy.deepcopy(read(package, name))
            return edit(name, data) or data

        monkeypatch.setattr(datafile, "read", patched)
        references._load.cache_clear()

    yield use
    monkeypatch.undo()
    references._load.cache_clear()


def test_an_unknown_key_names_the_file_record_and_key(edited):
    def edit(name, data):
        if name == "references.yaml":
            data["references"][3]["lo"] = 1.0

    edited(edit)
    with pytest.raises(datafile.DataFileError) as err:
        references.references()
    assert str(err.value) == (
        "headgeom/heads/paper/references.yaml: 1 problem(s)\n  references[3] (§20.1 parameters "
        "(millions), all-common-axis): unknown key(s) 'lo'; allowed: id, section, metric, "
        "model, split, paper, value, range, from_zoo, decimals, percent, recipe, args"
    )


def test_a_record_needs_one_paper_value(edited):
    def edit(name, data):
        if name == "references.yaml":
            data["references"][10]["range"] = [1.0, 2.0]  # beside its value

    edited(edit)
    with pytest.raises(
        datafile.DataFileError,
        match=r"references\[10\] \(§20\.1 validation loss "
        r"\(nats\), .*\): give paper with value or with range, or from_zoo alone",
    ):
        references.references()


def test_an_unknown_recipe_or_argument_names_the_record():
    entry = references.references()[0]
    bad = references.Entry(**{**entry.__dict__, "recipe": "milions"})
    with pytest.raises(
        datafile.DataFileError,
        match=r"references\.yaml: references\[0\] "
        r"\(§20\.1 parameters \(millions\), learned\), key recipe: no recipe "
        r"'milions' \(did you mean 'millions'\?\)",
    ):
        comparison._bind(bad)
    bad = references.Entry(**{**entry.__dict__, "args": {"geometri": "learned"}})
    with pytest.raises(
        datafile.DataFileError,
        match=r"key args: recipe 'millions' takes no "
        r"'geometri'; it takes geometry$",
    ):
        comparison._bind(bad)
    bad = references.Entry(**{**entry.__dict__, "args": {}})
    with pytest.raises(
        datafile.DataFileError,
        match=r"key args: recipe 'millions': missing a "
        r"required argument: 'geometry'",
    ):
        comparison._bind(bad)


def test_a_zoo_reference_must_exist(edited):
    def edit(name, data):
        if name == "references.yaml":
            data["references"][6]["from_zoo"]["seed"] = 44

    edited(edit)
    with pytest.raises(
        datafile.DataFileError,
        match=r"references\[6\] \(§20\.1 validation loss "
        r"\(nats\), learned \(R, seed #1\)\), key from_zoo\.seed: learned-r has no "
        r"paper validation loss for seed 44 \(seeds: \[42, 43\]\)",
    ):
        references.references()


def test_a_zoo_record_is_checked_on_load(edited):
    def edit(name, data):
        if name == "zoo.yaml":
            del data["configurations"][0]["runs"][1]["val_loss"]
            data["configurations"][2]["corpus"] = "T"

    edited(edit)
    with pytest.raises(datafile.DataFileError) as err:
        zoo._load()
    assert str(err.value) == (
        "headgeom/model/zoo.yaml: 2 problem(s)\n"
        "  configurations[0] (learned-r), key runs.1: missing key(s) val_loss\n"
        "  configurations[2] (write-common-axis), key corpus: 'T' is not one of R, S"
    )


def test_a_zoo_geometry_needs_its_count(edited):
    def edit(name, data):
        if name == "zoo.yaml":
            del data["n_params"]["read-common"]

    edited(edit)
    with pytest.raises(
        datafile.DataFileError,
        match=r"zoo\.yaml: configurations\[6\] "
        r"\(read-common\), key geometry: 'read-common' has no n_params count",
    ):
        zoo._load()


def test_an_unknown_id_says_what_is_close():
    match = "no record with id 'tau.adjacnt'; did you mean 'tau.adjacent'"
    with pytest.raises(KeyError, match=match):
        references.text("tau.adjacnt")
