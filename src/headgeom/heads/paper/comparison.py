"""The paper-vs-run comparison (docs §17): every reference number of METHODS §20 beside this
run's value, computed from the result Parquets.

The comparison is a registry, :data:`REFERENCES`: one :class:`Reference` per number (metric,
model, split, the paper's value or range, and how to compute the run's value from Parquets
of given input kinds). The numbers are data, ``headgeom/heads/paper/references.yaml``
(:mod:`headgeom.heads.paper.references`): each record names a recipe of
:data:`headgeom.heads.paper.recipes.RECIPES` and its arguments, bound here on import (an unknown
recipe or argument fails naming the record). Another analysis adds its numbers as records
of the file (and its input kinds to the comparison record in ``headgeom.heads.paper.outputs``),
or in code with :func:`reference`; a reference whose inputs the study does not make, or
whose model it lacks, is listed with "not in this study".

A model is named by geometry (and corpus, where the study names corpora; a study that does
not, like the demo, matches any corpus). Values are computed from unrounded numbers; a value
"lies within" the paper's range when it does after rounding to the paper's printed
precision (half a unit of the last printed digit of slack).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pandas as pd

from headgeom import datafile
from headgeom.heads.paper import recipes, references
from headgeom.heads.paper.context import Context, Value
from headgeom.heads.paper.inputs import Inputs
from headgeom.render import Block, Table


@dataclass(frozen=True, kw_only=True)
class Reference:
    """One reference number: ``paper`` as printed, its range [low, high] (a point value has
    low = high; a bound has one end infinite), the printed decimals, and ``compute`` from the
    inputs of ``kinds`` (returns a number, a (min, max) range over models, or None when the
    study lacks the model)."""

    section: str
    metric: str
    model: str
    paper: str
    low: float
    high: float
    decimals: int
    compute: Callable[[Context], Value]
    kinds: tuple[str, ...]
    split: str = "evaluation"
    percent: bool = False
    id: str | None = None
    recipe: str | None = None  # its name in recipes.RECIPES, for a record of the file
    args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def within(self, value: Value) -> bool | None:
        if value is None:
            return None
        values = value if isinstance(value, tuple) else (value,)
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        scale = 100.0 if self.percent else 1.0
        slack = 0.5 * 10.0 ** (-self.decimals)
        return all(
            self.low * scale - slack - 1e-12 <= v * scale <= self.high * scale + slack + 1e-12
            for v in values
        )

    def show(self, value: Value) -> str:
        if value is None:
            return "—"
        scale, suffix = (100.0, "%") if self.percent else (1.0, "")
        digits = self.decimals + 1 if abs(self.decimals) < 4 else self.decimals

        def one(v: float) -> str:
            return "—" if v is None or not math.isfinite(v) else f"{v * scale:.{digits}f}{suffix}"

        if isinstance(value, tuple):
            return f"{one(value[0])} – {one(value[1])}"
        return one(value)


def reference(
    section: str,
    metric: str,
    model: str,
    paper: str,
    low: float,
    high: float | None = None,
    *,
    compute: Callable[[Context], Value],
    kinds: Sequence[str],
    decimals: int | None = None,
    split: str = "evaluation",
    percent: bool = False,
) -> Reference:
    """One reference number made in code (``high`` defaults to ``low``: a point value;
    ``decimals`` to those of ``paper``'s first number), for :func:`evaluate` beside
    :data:`REFERENCES`."""
    if decimals is None:
        first = paper.replace("−", "-").lstrip("≤≥<>+- ").split()[0].rstrip("%,;")
        decimals = len(first.split(".")[1]) if "." in first else 0
    ref = Reference(
        section=section,
        metric=metric,
        model=model,
        paper=paper,
        low=low,
        high=low if high is None else high,
        decimals=decimals,
        compute=compute,
        kinds=tuple(kinds),
        split=split,
        percent=percent,
    )
    return ref


def _bind(entry: references.Entry) -> Reference:
    """A record of ``references.yaml`` with its recipe and arguments bound."""

    def fail(key: str, text: str) -> datafile.DataFileError:
        return datafile.problem(references.__package__, references.NAME,
                                f"{entry.where}, key {key}", text)  # fmt: skip

    recipe = recipes.RECIPES.get(entry.recipe)
    if recipe is None:
        close = difflib.get_close_matches(entry.recipe, list(recipes.RECIPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise fail("recipe", f"no recipe {entry.recipe!r}{hint}")
    signature = inspect.signature(recipe.function)
    takes = list(signature.parameters)[1:]
    unknown = [name for name in entry.args if name not in takes]
    if unknown:
        raise fail("args", f"recipe {entry.recipe!r} takes no {', '.join(map(repr, unknown))}; "
                   f"it takes {', '.join(takes) or 'no arguments'}")  # fmt: skip
    try:
        bound = signature.bind(None, **entry.args)
    except TypeError as err:
        raise fail("args", f"recipe {entry.recipe!r}: {err}") from None
    bound.apply_defaults()
    return Reference(
        section=entry.section,
        metric=entry.metric,
        model=entry.model,
        paper=entry.paper,
        low=entry.low,
        high=entry.high,
        decimals=entry.decimals,
        compute=functools.partial(recipe, **entry.args),
        kinds=recipe.kinds(bound.arguments),
        split=entry.split,
        percent=entry.percent,
        id=entry.id,
        recipe=entry.recipe,
        args=entry.args,
    )


#: Every reference number of METHODS §20: the records of ``references.yaml``, in order.
REFERENCES: tuple[Reference, ...] = tuple(_bind(entry) for entry in references.references())


# ----------------------------------------------------------------------------- the table
@dataclass
class Row:
    ref: Reference
    value: Value
    status: str = field(default="")


def evaluate(inputs: Inputs, references: Sequence[Reference] | None = None) -> pd.DataFrame:
    """One row per reference: the run's value (number or range), whether it lies within the
    paper's range, or why it is not in this study."""
    ctx = Context(inputs)
    rows = []
    for ref in REFERENCES if references is None else references:
        missing = [k for k in ref.kinds if not ctx.has(k)]
        value: Any = None
        if missing:
            status = f"not in this study (no {', '.join(missing)} input)"
        else:
            value = ref.compute(ctx)
            status = "not in this study (no such run)" if value is None else ""
        within = ref.within(value)
        lo, hi = (
            (value if isinstance(value, tuple) else (value, value))
            if value is not None
            else (None, None)
        )
        rows.append(
            {
                "section": ref.section,
                "metric": ref.metric,
                "model": ref.model,
                "split": ref.split,
                "paper": ref.paper,
                "paper_low": ref.low,
                "paper_high": ref.high,
                "run_value": ref.show(value) if value is not None else status,
                "run_low": lo,
                "run_high": hi,
                "within": None if within is None else bool(within),
            }
        )
    return pd.DataFrame(rows)


def comparison_table(inputs: Inputs) -> Table:
    frame = evaluate(inputs)
    cells = pd.DataFrame(
        {
            "Section": frame["section"],
            "Metric": frame["metric"],
            "Model": frame["model"],
            "Split": frame["split"],
            "Paper": frame["paper"],
            "This run": frame["run_value"],
            "Within?": frame["within"].map({True: "yes", False: "no"}).fillna("—"),
        }
    )
    known = frame["within"].notna()
    caption = (
        f"Paper vs this run: every reference number of METHODS §20 ({len(frame)}), with this "
        f"run's value computed from the result Parquets; {int(known.sum())} computed here, "
        f"{int(frame.loc[known, 'within'].sum())} of them within the paper's range (after "
        "rounding to the paper's precision). A range in 'This run' spans the models or tasks "
        "the paper's number covers. Toy-size studies (the demo) are not expected to match."
    )
    return Table("comparison", frame, [Block(cells)], caption)
