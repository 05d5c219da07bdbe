"""The study kinds of the workspace, one registration each (:data:`KINDS`): what a config's
``kind:`` selects, the study object that checks it, its schema, its rules, its results
contract and the configs that ship with it.

Each study is a wing over the shared core (docs/extending.md, "The shape"): its own package
(``headgeom.heads``, ``headgeom.samoe``, ``headgeom.atlas``), rules folder, schema, stage
scripts, paper outputs and docs. The core names a wing's modules here by string and loads
them with importlib (:func:`study_class`, :func:`results_tables`), so no core module imports
a wing and the layer contract (``.importlinter``) keeps every dependency pointing from a
wing to the core; adding a study kind is one row here plus its own folders.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from headgeom.validation import StudyConfigError

#: The repository root (it holds src/ and workflow/).
ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "workflow" / "schemas"


class StudyObject(Protocol):
    """What the core asks of every kind's study object."""

    kind: str
    name: str
    config: dict

    @classmethod
    def from_config(cls, config: Mapping) -> StudyObject: ...


@dataclass(frozen=True)
class StudyKind:
    """One study kind."""

    name: str  # the config's `kind:` (the default kind's configs may leave it out)
    title: str  # its section of config/README.md
    study: str  # "module:Class" of its study object (``from_config``)
    schema: str  # its JSON schema, a file under workflow/schemas/
    rules: str  # the rules file the Snakefile includes, relative to the repository root
    results: str  # the module whose ``TABLES`` are its result Parquets
    results_doc: str  # the page documenting their columns (headgeom.results_doc)
    selector: str  # how a config picks this kind, in words
    configs: tuple[str, ...]  # the configs of this kind that ship with the workspace

    @property
    def schema_path(self) -> Path:
        return SCHEMAS / self.schema


KINDS: dict[str, StudyKind] = {
    kind.name: kind
    for kind in (
        StudyKind(
            name="heads",
            title="Head-geometry study",
            study="headgeom.heads.study:Study",
            schema="heads.schema.yaml",
            rules="workflow/heads/main.smk",
            results="headgeom.results",
            results_doc="docs/results.md",
            selector="any config without `kind` (or `kind: heads`)",
            configs=(
                "config/config.yaml",
                "config/paper.yaml",
                "config/rehearsal.yaml",
                "config/smollm2.yaml",
            ),
        ),
        StudyKind(
            name="samoe",
            title="SA-MoE study",
            study="headgeom.samoe.study:SAMoEStudy",
            schema="samoe.schema.yaml",
            rules="workflow/samoe/main.smk",
            results="headgeom.samoe.results",
            results_doc="docs/samoe.md",
            selector="`kind: samoe`",
            configs=("config/samoe.yaml", "config/samoe-paper.yaml", "config/samoe-smollm2.yaml"),
        ),
        StudyKind(
            name="atlas",
            title="Edit atlas",
            study="headgeom.atlas.study:AtlasStudy",
            schema="atlas.schema.yaml",
            rules="workflow/atlas/main.smk",
            results="headgeom.atlas.results",
            results_doc="docs/atlas.md",
            selector="`kind: atlas`",
            configs=("config/atlas-smollm2.yaml", "config/atlas-demo.yaml"),
        ),
    )
}
#: The kind of a config without ``kind:`` (the workspace's first study).
DEFAULT = "heads"


def kind_of(config: Mapping) -> StudyKind:
    """The kind a config selects; an unknown one is a :class:`StudyConfigError` naming it."""
    name = config.get("kind", DEFAULT)
    if name not in KINDS:
        raise StudyConfigError([f"config kind: {name!r} is not a study kind; known: "
                                f"{', '.join(KINDS)}"])  # fmt: skip
    return KINDS[name]


def _load(qualified: str) -> Any:
    module, _, attribute = qualified.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def study_class(kind: StudyKind) -> type[StudyObject]:
    """The study object class of ``kind`` (its wing's module, loaded now)."""
    return _load(kind.study)


def from_config(config: Mapping) -> StudyObject:
    """The checked study of any kind: :func:`kind_of` picks the class, whose ``from_config``
    validates the config against its own schema and across keys."""
    return study_class(kind_of(config)).from_config(config)


def results_tables(kind: StudyKind) -> Mapping[str, Any]:
    """``kind``'s result tables (name -> :class:`headgeom.results.ResultTable`)."""
    return _load(kind.results).TABLES
