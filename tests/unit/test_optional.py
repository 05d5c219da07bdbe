"""Optional packages (headgeom.optional): the default install leaves out what only some
studies need, and a feature that needs a missing one says which extra installs it."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from headgeom import optional
from headgeom.data import corpus_sources

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_each_optional_package_is_in_its_extra_and_not_in_the_default_install():
    extras = PROJECT["optional-dependencies"]
    for module, extra in optional.EXTRAS.items():
        assert module not in names(PROJECT["dependencies"]), module
        assert module in names(extras[extra]), (module, extra)
    # the test command (README command 2) installs [dev]: it must bring every extra's package
    assert {f"{PROJECT['name']}[{e}]" for e in set(optional.EXTRAS.values())} <= set(extras["dev"])


@pytest.fixture
def without(monkeypatch):
    """Make ``module`` unimportable, as in an install without its extra (a None entry in
    sys.modules makes ``import`` raise ModuleNotFoundError naming it)."""

    def hide(module: str) -> None:
        for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, module, None)

    return hide


def test_require_returns_an_installed_module():
    assert optional.require("datasets", "this test").__name__ == "datasets"


@pytest.mark.parametrize("module", sorted(optional.EXTRAS))
def test_a_missing_package_names_what_needed_it_and_the_install_command(without, module):
    without(module)
    with pytest.raises(optional.MissingExtra) as err:
        optional.require(module, "the thing under test")
    text = str(err.value)
    assert text.startswith(f"the thing under test needs {module}, which is not installed")
    assert f'pip install -e ".[{optional.EXTRAS[module]}]" -c requirements/lock.txt' in text
    assert isinstance(err.value, ImportError)  # callers catching ImportError still do


def test_a_broken_dependency_inside_an_installed_package_is_not_renamed(monkeypatch):
    # the package is there but one of its own imports is missing: that error, unchanged
    def broken(name, *args):
        raise ModuleNotFoundError("No module named 'dill'", name="dill")

    monkeypatch.setattr(optional.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError) as err:
        optional.require("datasets", "the thing under test")
    assert not isinstance(err.value, optional.MissingExtra) and err.value.name == "dill"


def test_a_local_corpus_without_datasets_names_its_source_and_the_extra(without, tmp_path):
    (tmp_path / "doc.txt").write_text("a document", encoding="utf-8")
    cfg = corpus_sources.resolve_source(
        {"source": "text", "files": [str(tmp_path / "*.txt")], "n_val_tokens": 8}
    )
    without("datasets")
    with pytest.raises(optional.MissingExtra, match=r"^corpus.source text needs datasets"):
        corpus_sources.open_source(cfg)


def test_the_embedded_corpus_needs_no_optional_package(without):
    without("datasets")
    source = corpus_sources.open_source(
        corpus_sources.resolve_source({"source": "embedded", "n_val_tokens": 8})
    )
    assert source.provenance["dataset"] == "embedded-demo" and source.dataset is None


def test_a_hub_model_without_transformers_names_the_repository_and_the_extra(without):
    from headgeom.samoe.hub import HubSource

    source = HubSource("org/model", "0" * 40, {"model_type": "llama"})
    without("transformers")
    with pytest.raises(optional.MissingExtra, match=r"^Hub model org/model needs transformers"):
        source.hf_config()
