"""What a recipe of the paper-vs-run comparison reads (:mod:`headgeom.heads.paper.comparison`,
:mod:`headgeom.heads.paper.recipes`): the :class:`Context` of the comparison's inputs by kind
and the runs by geometry, and the :data:`Value` a recipe returns. Its own module, below both,
so the comparison and its recipes import it without importing each other.
"""

from __future__ import annotations

from functools import cached_property

import pandas as pd

from headgeom.heads.paper.inputs import Inputs, read_runs
from headgeom.io import read_table

#: A run's value: a number, a (min, max) range over the models or tasks, or None.
Value = float | tuple[float, float] | None


class Context:
    """Lazy access to the comparison's inputs by kind, and the runs by geometry."""

    def __init__(self, inputs: Inputs):
        self.inputs = inputs
        self._frames: dict[str, pd.DataFrame] = {}

    def has(self, kind: str) -> bool:
        return bool(self.inputs.get(kind))

    def frame(self, kind: str) -> pd.DataFrame:
        if kind not in self._frames:
            paths = list(self.inputs.get(kind, []))
            frames = [read_table(p).to_pandas() for p in paths]
            self._frames[kind] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._frames[kind]

    @cached_property
    def runs(self) -> pd.DataFrame:
        return read_runs(self.inputs["runs"])

    @cached_property
    def with_corpora(self) -> bool:
        return bool((self.runs["corpus"] != "—").any())

    def runs_of(self, geometry: str, corpus: str | None = None) -> list[tuple[str, int]]:
        """(model, seed) of every run of ``geometry`` (on ``corpus`` when the study names
        corpora), in config order."""
        rows = self.runs[self.runs["geometry"] == geometry]
        if corpus is not None and self.with_corpora:
            rows = rows[rows["corpus"] == corpus]
        return list(zip(rows["model"], rows["seed"].astype(int), strict=True))

    def run(self, geometry: str, corpus: str | None = None, seed_index: int = 0):
        runs = self.runs_of(geometry, corpus)
        return runs[seed_index] if len(runs) > seed_index else None

    def value(self, kind: str, run, column: str, split: str | None = "evaluation", **where):
        """The one value of ``column`` in ``kind`` for ``run`` (and ``where`` filters)."""
        frame = self.frame(kind)
        if run is None or frame.empty:
            return None
        mask = (frame["model"] == run[0]) & (frame["seed"] == run[1])
        if split is not None and "split" in frame:
            mask &= frame["split"] == split
        for key, want in where.items():
            mask &= frame[key] == want
        rows = frame.loc[mask, column]
        return float(rows.iloc[0]) if len(rows) else None

    def excl(self, quantity: str, scope: str = "all", read_type: str | None = None):
        frame = self.frame("exclusivity")
        if frame.empty:
            return None
        mask = (frame["quantity"] == quantity) & (frame["scope"] == scope)
        if read_type is not None:
            mask &= frame["read_type"] == read_type
        rows = frame.loc[mask, "value"]
        return float(rows.iloc[0]) if len(rows) else None
