"""The paper's outputs in one study: which tables and figures it can make, and which
Parquets of which runs each one reads (:class:`PaperPlan`). The workflow asks this plan
(``PAPER`` in workflow/heads/common.smk); the study itself knows nothing of the paper's
outputs.
"""

from __future__ import annotations

from typing import Any

from headgeom.heads import selections
from headgeom.heads.paper import outputs
from headgeom.heads.paper.output import Output
from headgeom.heads.study import Study

Run = tuple[str, int]


class PaperPlan:
    """The records of :mod:`headgeom.heads.paper.outputs` resolved against ``study``."""

    def __init__(self, study: Study):
        self.study = study

    def selection(self, record: Output) -> list[Run]:
        """(model, seed) pairs an output shows: its ``shows`` run set, else its paper
        selection (``selections.PAPER_SELECTIONS``), else every run."""
        if record.shows is not None:
            return self.study.run_set(record.shows)
        if record.name in selections.PAPER_SELECTIONS:
            return selections.select_models(self.study.models, record.name)
        return self.study.runs

    def _made(self, record: Output) -> bool:
        """A study makes an output when it has runs to show and what it needs."""
        return bool(self.selection(record)) and (
            record.needs is None or bool(self.study.run_set(record.needs))
        )

    @property
    def tables(self) -> list[str]:
        """The paper tables of their own make_table job this study can make."""
        return [n for n in outputs.TABLE_JOBS if self._made(outputs.TABLES[n])]

    @property
    def figures(self) -> list[str]:
        return [n for n, record in outputs.FIGURES.items() if self._made(record)]

    @property
    def document_tables(self) -> list[str]:
        """The tables rule make_document builds in one job."""
        return [n for n in outputs.DOCUMENT_TABLES if self._made(outputs.TABLES[n])]

    def _runs_of(self, record: Output, which: str | None) -> list[Run] | None:
        """The runs an input is read for: a run set, the output's selection, or for a
        cross-run file None (one file) when the DAG makes it and [] (nothing) when not."""
        study = self.study
        if which is None:
            return None
        if which == "selection":
            return self.selection(record)
        if which == "exclusivity":  # one file, made when leakage is measured
            return None if study.run_set("leakage") else []
        if which == "paired_tasks":  # one file per task, made when there are pairs
            return None if study.pairs else []
        if which == "pairs":
            return study.pair_runs
        return study.run_set(which)

    def paper_inputs(self, name: str, kind: str = "table") -> dict[str, tuple[str, Any]]:
        """input kind -> (result, runs) of what paper ``kind`` (table or figure) ``name``
        reads (its record's inputs); runs None: one file."""
        record = outputs.record(kind, name)
        return {k: (result, self._runs_of(record, which))
                for k, (result, which) in record.inputs.items()}  # fmt: skip

    def figure_models(self, name: str) -> list[str]:
        """Models a figure is told to plot from a cross-model Parquet (Figure 4), else []."""
        record = outputs.record("figure", name)
        if not record.plots_models:
            return []
        return list(dict.fromkeys(m for m, _ in self.selection(record)))

    def output_runs(self, name: str, kind: str = "table") -> set[Run]:
        """Every run a paper table or figure reads (the union of its inputs' run sets, and
        its selection where it draws one from a cross-run Parquet, as Figure 4)."""
        record = outputs.record(kind, name)
        inputs = self.paper_inputs(name, kind).values()
        runs = {run for _, rs in inputs if rs is not None for run in rs}
        if name in selections.PAPER_SELECTIONS:
            runs |= set(self.selection(record))
        return runs

    def sections_used(self) -> dict[str, list[str]]:
        """Per model, the paper sections whose outputs read one of its runs (Table 4)."""
        made = [("table", t) for t in self.tables] + [("figure", f) for f in self.figures]
        used: dict[str, set[str]] = {m: set() for m in self.study.models}
        for kind, name in made:
            record = outputs.record(kind, name)
            if record.summary:
                continue
            for model, _ in self.output_runs(name, kind):
                used[model].add(record.section)
        return {m: sorted(s, key=outputs.section_order) for m, s in used.items()}

    def document_context(self) -> dict[str, Any]:
        """What the document's tables take from the config (not from Parquets): per model its
        geometry, corpus and the sections that use it (Table 4)."""
        models = self.study.models
        return {
            "models": {
                m: {
                    "geometry": spec["geometry"],
                    "corpus": spec.get("corpus"),
                    "seeds": [int(s) for s in spec["seeds"]],
                    "sections": sections,
                }
                for (m, spec), sections in zip(
                    models.items(), self.sections_used().values(), strict=True
                )
            }
        }
