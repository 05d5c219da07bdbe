"""A paper table or figure as a record (docs §17): what it is called, which section of the
paper it belongs to, what it reads and what builds it.

Every record is declared once, in :mod:`headgeom.heads.paper.outputs`; its build functions live in
the module of its paper section (``setup``, ``exclusivity``, ``concentration``, ...). The
workflow (which Parquets a table or figure job reads, the report's categories), the
document and the catalog read the records; nothing is registered anywhere else. Adding a
table is its build function in its section module, one record, and its caption in
``workflow/report``.

A record names its functions (``"setup:table2"``: function ``table2`` of
``headgeom.heads.paper.setup``) rather than holding them, so the workflow reads every record
without loading pandas, SciPy and matplotlib (about 2 s of every Snakefile parse, and
every Slurm job parses it again); a job imports only the section it builds.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from headgeom.heads.run_sets import RUN_SETS

#: The paper's sections in reading order: the report's categories and Table 4's "sections
#: used" (a run is used by a section when one of its outputs reads the run).
SUMMARY = "Summary"
SETUP = "§4 Setup"
EXCLUSIVITY = "§5.1 Exclusivity"
CONCENTRATION = "§5.2 Concentration"
LANES = "§5.3 Lanes"
ALIGNMENT = "§5.4 Self-alignment"
APPENDIX_B = "App. B"
SECTIONS = (SUMMARY, SETUP, EXCLUSIVITY, CONCENTRATION, LANES, ALIGNMENT, APPENDIX_B)

#: Run sets an input may name besides headgeom.heads.run_sets.RUN_SETS: the output's selection,
#: the runs of the concentration pairs, and cross-run files made only with leakage
#: (exclusivity) or with pairs (paired_tasks).
EXTRA = ("selection", "pairs", "exclusivity", "paired_tasks")

#: An input kind's source: (result, run set). ``result`` names a path template of the
#: workflow (headgeom.paths.TEMPLATES); the run set the runs it is read for
#: (``headgeom.heads.paper.plan.PaperPlan.paper_inputs``: ``runs`` every run, ``selection``
#: the output's paper selection, ``leakage`` the runs leakage measures, ...; None: one
#: cross-run file).
Source = tuple[str, "str | None"]


@dataclass(frozen=True)
class Output:
    """One paper table or figure.

    ``build`` makes it from its inputs by kind: a table's builder returns a
    :class:`headgeom.render.Table` (a document table's also takes the study context),
    a figure's returns the frame it plots, which ``draw`` turns into a matplotlib figure.
    Both are ``"module:function"`` names inside :mod:`headgeom.heads.paper` (:meth:`function`).
    """

    name: str
    kind: Literal["table", "figure"]
    section: str
    inputs: Mapping[str, Source]
    build: str
    #: What the report says about it (workflow/report is written from these:
    #: ``python -m headgeom.heads.paper.captions``).
    caption: str
    draw: str | None = None
    #: Built with the document (rule make_document: one job for all of them, given the
    #: study's context), not by its own make_table job.
    document: bool = False
    #: Summarises other outputs: reading a run does not make the run "used" by its section.
    summary: bool = False
    #: A figure told which models to plot (``--models``), drawn from a cross-model Parquet.
    plots_models: bool = False
    #: The run set whose models it shows (headgeom.heads.run_sets); None: its paper selection
    #: (headgeom.heads.selections.PAPER_SELECTIONS) if it has one, else every run.
    shows: str | None = None
    #: A run set the study must have for the output to exist (an opt-in analysis, or one
    #: whose engine the models' architectures may lack: edges, coordinates).
    needs: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))  # read-only
        if self.kind not in ("table", "figure"):
            raise ValueError(f"output {self.name!r}: kind {self.kind!r} is not table or figure")
        if self.section not in SECTIONS:
            raise ValueError(f"output {self.name!r}: section {self.section!r} not in {SECTIONS}")
        if (self.kind == "figure") != (self.draw is not None):
            raise ValueError(f"output {self.name!r}: a figure has a draw function, a table none")
        if self.document and self.kind != "table":
            raise ValueError(f"output {self.name!r}: only tables are built with the document")
        if len(self.caption) < 40:
            raise ValueError(f"output {self.name!r}: a caption says what it shows (40+ characters)")
        run_sets = [self.shows, self.needs, *(which for _, which in self.inputs.values())]
        unknown = [s for s in run_sets if s is not None and s not in RUN_SETS and s not in EXTRA]
        if unknown:
            raise ValueError(f"output {self.name!r}: unknown run sets {unknown}")
        for ref in (self.build, self.draw):
            if ref is not None and not REFERENCE.fullmatch(ref):
                raise ValueError(f"output {self.name!r}: {ref!r} is not 'module:function'")

    def function(self, which: Literal["build", "draw"] = "build") -> Callable[..., Any]:
        """The build (or draw) function, imported from its section module on first use."""
        module, name = getattr(self, which).split(":")
        return getattr(importlib.import_module(f"headgeom.heads.paper.{module}"), name)


#: A function reference: ``module:function`` of a module of headgeom.heads.paper.
REFERENCE = re.compile(r"[a-z_]+:[A-Za-z_][A-Za-z0-9_]*")
