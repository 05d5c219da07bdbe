"""A recipe: a named way to compute a run's value from the comparison's inputs, with the
input kinds it reads; and the two helpers every recipe shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from headgeom.heads.paper.context import Context, Value


class Recipe:
    """A named way to compute a run's value from the comparison's inputs."""

    def __init__(self, function: Callable[..., Value], kinds: tuple[str, ...]):
        self.function, self.name, self._kinds = function, function.__name__, kinds

    def kinds(self, args: dict) -> tuple[str, ...]:
        """The input kinds the recipe reads with ``args``."""
        return tuple(k.format(**args) for k in self._kinds)

    def __call__(self, c: Context, **args) -> Value:
        return self.function(c, **args)


def recipe(*kinds: str) -> Callable[[Callable], Recipe]:
    """Make ``function`` a recipe that reads inputs of ``kinds`` (``"{kind}"``: its ``kind``
    argument); :data:`headgeom.heads.paper.recipes.RECIPES` gathers every one by name."""

    def make(function: Callable) -> Recipe:
        return Recipe(function, kinds)

    return make


def span_of(values: Sequence[float | None]) -> Value:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return (min(values), max(values)) if len(values) > 1 else values[0]


def runs_in(frame: pd.DataFrame, runs: set) -> list[bool]:
    return [(m, int(s)) in runs for m, s in zip(frame["model"], frame["seed"], strict=True)]
