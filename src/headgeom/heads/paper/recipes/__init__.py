"""How the paper-vs-run comparison computes a run's value for each reference number: the
recipes, by name (:data:`RECIPES`), one module per part of METHODS §20.

A reference of ``headgeom/heads/paper/references.yaml`` names its recipe and the recipe's
arguments (``recipe: stat``, ``args: {kind: summaries, geometry: learned, corpus: S, task:
sva, column: N_eff}``); :mod:`headgeom.heads.paper.comparison` calls ``recipe(context, **args)``.
A recipe returns a number, a (min, max) range over the models or tasks the paper's number
covers, or None when the study lacks what it needs.
:func:`~headgeom.heads.paper.recipes.recipe.recipe` makes one with the input kinds it reads
(``"{kind}"``: the kind its ``kind`` argument names); a reference whose kinds the study does
not make is listed as "not in this study".

A model is named by geometry and, where the study names corpora, corpus (``corpus: S``; a
study that does not, like the demo, matches any corpus); ``seed_index`` picks a seed in
config order.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from headgeom.heads.paper.recipes import (
    alignment,
    appendix,
    concentration,
    dynamics,
    exclusivity,
    lanes,
    setup,
)
from headgeom.heads.paper.recipes.recipe import Recipe
from headgeom.vocabulary import TASKS

#: The modules of recipes, in the order of METHODS §20.
MODULES = (setup, exclusivity, concentration, lanes, alignment, appendix, dynamics)


def _gather() -> Mapping[str, Recipe]:
    found: dict[str, Recipe] = {}
    for module in MODULES:
        for value in vars(module).values():
            if isinstance(value, Recipe) and found.setdefault(value.name, value) is not value:
                raise ValueError(f"two recipes are named {value.name!r}")
    return MappingProxyType(found)


#: Every recipe by name.
RECIPES: Mapping[str, Recipe] = _gather()

__all__ = ["RECIPES", "TASKS", "Recipe"]
