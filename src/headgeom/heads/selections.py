"""Which models each paper table and figure shows, which models the concentration analyses
compare, and how the paper groups models (docs §12.1, §12.2, §12.4, §12.7, §13.1, §15, §17).
The study reads these (the concentration pairs, the loss models, run-set defaults:
headgeom.heads.run_sets) as the paper's outputs do.

Everything here is named by geometry, so it resolves in any study: in the demo (model keys
= geometry names) and in the paper study (keys such as ``learned-s``, where two models share
a geometry on different corpora and only same-corpus models are compared or shown).
``models`` is always the config's ``models`` block (key -> ``{geometry, seeds, corpus?}``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from headgeom.model import facts

# ----------------------------------------------------------------------------- selections
_FIGURE3_SLOTS = [
    ["learned"],
    ["write-rotated"],
    ["read-common"],
    ["all-common-axis"],
    ["all-rotated"],
    ["all-rotated-self"],
]
#: Paper Table 6's rows (docs §6.7, §17.1) in the paper's order, every seed of each: corpus R
#: learned and write-common-axis (s42, s43), then the corpus-S models.
TABLE6_ROWS: tuple[tuple[str, str, str], ...] = (
    ("learned", "R", "learned (s42, s43)"),
    ("write-common-axis", "R", "write-common-axis (s42, s43)"),
    ("learned", "S", "learned"),
    ("write-rotated", "S", "write-rotated"),
    ("write-routed-a", "S", "write-routed A"),
    ("write-routed-b", "S", "write-routed B"),
    ("write-routed-c", "S", "write-routed C"),
    ("read-common", "S", "read-common"),
    ("all-common-axis", "S", "all-common-axis"),
    ("all-rotated", "S", "all-rotated"),
    ("all-rotated-self", "S", "all-rotated-self"),
)
#: The models each paper table or figure shows (docs §12.1–12.2, §12.7, §13.1, §17), as
#: slots of geometries in order of preference, on corpus S where the study names corpora.
#: A study without mlp3456 (the demo) shows its write-common-axis in that slot.
PAPER_SELECTIONS: dict[str, list[list[str]]] = {
    "table3": [*_FIGURE3_SLOTS, ["mlp3456", "write-common-axis"]],
    "figure3": _FIGURE3_SLOTS,
    "figure4": [*_FIGURE3_SLOTS, ["write-routed-a"], ["write-routed-b"], ["write-routed-c"]],
    "figure5": [
        ["learned"],
        ["mlp3456", "write-common-axis"],
        ["all-rotated"],
        ["all-rotated-self"],
    ],
    # clamps: paper Figure 8 (order A), docs §15.3 CHOICE: dense, rotated-m1-42,
    # headblock-learned42, headblock-identity42, rotated-m2-42, rotated-m3-42.
    "figure8": [
        ["learned"],
        ["write-rotated"],
        ["read-common"],
        ["all-common-axis"],
        ["all-rotated"],
        ["all-rotated-self"],
    ],
    # Table 2's ten rows (docs §6.1: rows 1, 4, 6, 7, 3, 8, 9, 10, 11, 12, both
    # corpora, seed 42 shown) and Figure 7's eight free-reader models (rows 1–8, every seed).
    "table2": [
        ["learned"],
        ["write-common-axis"],
        ["write-common"],
        ["write-rotated"],
        ["read-common"],
        ["all-common-axis"],
        ["all-rotated"],
        ["all-rotated-self"],
    ],
    "figure7": [
        ["learned"],
        ["write-common-axis"],
        ["write-common"],
        ["write-rotated"],
    ],
    "table6": [[geometry] for geometry, _, _ in TABLE6_ROWS],
}
#: The corpus of each slot of a selection whose slots name their own corpus (the others draw
#: every slot from SELECTION_CORPUS, or from every corpus: ALL_CORPORA).
SLOT_CORPORA: dict[str, list[str]] = {"table6": [corpus for _, corpus, _ in TABLE6_ROWS]}
#: Selections drawn from every corpus (the others: corpus S where the study names corpora).
ALL_CORPORA = {"table2", "figure7"}
#: Selections of free-reader models only (the registry's reader kind; docs §14.1: a block
#: reader's V read space is its write space by construction).
FREE_READERS_ONLY = {"figure7"}
#: Figure 5 draws one checkpoint per model (the first configured seed).
FIRST_SEED_ONLY = {"figure5", "figure8", "table2"}
#: The corpus the paper's selections are drawn from when a study names corpora (§12.2).
SELECTION_CORPUS = "S"


def select_models(models: Mapping[str, Mapping], name: str) -> list[tuple[str, int]]:
    """(model, seed) pairs of config ``models`` that paper table/figure ``name`` shows, in
    slot order: per slot, every model of the slot's corpus (corpus S, the slot's own corpus
    for :data:`SLOT_CORPORA`, every corpus for :data:`ALL_CORPORA`; every model when no model
    names a corpus) of the first geometry of the slot that the study has. A run is shown
    once, in its first slot (in a study without corpora Table 6's corpus-R and corpus-S
    learned rows are one model)."""
    if name not in PAPER_SELECTIONS:
        raise ValueError(f"no paper selection for {name!r}; known: {sorted(PAPER_SELECTIONS)}")
    named = any("corpus" in spec for spec in models.values())
    slots = PAPER_SELECTIONS[name]
    default = None if name in ALL_CORPORA else SELECTION_CORPUS
    corpora = SLOT_CORPORA.get(name, [default] * len(slots))
    chosen: list[tuple[str, int]] = []
    for slot, corpus in zip(slots, corpora, strict=True):
        eligible = {
            m: spec
            for m, spec in models.items()
            if (not named or corpus is None or spec.get("corpus") == corpus)
            and (name not in FREE_READERS_ONLY or facts.reader_kind(spec["geometry"]) == facts.FREE)
        }
        for geometry in slot:
            hits = [m for m, spec in eligible.items() if spec["geometry"] == geometry]
            if hits:
                for m in hits:
                    seeds = eligible[m]["seeds"]
                    seeds = seeds[:1] if name in FIRST_SEED_ONLY else seeds
                    chosen += [(m, int(s)) for s in seeds if (m, int(s)) not in chosen]
                break
    return chosen


def models_of_runs(runs) -> dict[str, dict[str, Any]]:
    """A config-like ``models`` mapping (model -> geometry, corpus when named, seeds in run
    order) from a frame of runs (``headgeom.heads.paper.inputs.read_runs``: corpus "—" = none), so
    a table applies the same selection to the runs it is given."""
    models: dict[str, dict[str, Any]] = {}
    for run in runs.sort_values("order").itertuples(index=False):
        spec = models.setdefault(run.model, {"geometry": run.geometry, "seeds": []})
        if run.corpus != "—":
            spec["corpus"] = run.corpus
        spec["seeds"].append(int(run.seed))
    return models


# ----------------------------------------------------------------------------- lanes
#: The runs whose Λ the paper reports (docs §13.1), as (geometry, corpus, first n seeds):
#: plain-learned42/43 and dense, layered42 and rotated-m1-42, all-rotated, all-rotated-self,
#: read-common, all-common-axis, mlp3456, value384, common42 and plain-identity42 only. Λ of
#: every other run is extra (§13.1 CHOICE: computed for every run and marked as extra).
LAMBDA_PAPER_RUNS: tuple[tuple[str, str, int], ...] = (
    ("learned", "R", 2),
    ("learned", "S", 1),
    ("write-rotated", "R", 1),
    ("write-rotated", "S", 1),
    ("all-rotated", "S", 1),
    ("all-rotated-self", "S", 1),
    ("read-common", "S", 1),
    ("all-common-axis", "S", 1),
    ("mlp3456", "S", 1),
    ("value384", "S", 1),
    ("write-common", "R", 1),
    ("write-common-axis", "R", 1),
)


def lambda_paper_runs(models: Mapping[str, Mapping[str, Any]]) -> set[tuple[str, int]]:
    """The (model, seed) runs of ``models`` that are the paper's Λ runs: per entry of
    :data:`LAMBDA_PAPER_RUNS`, the first n seeds of every model of that geometry on that
    corpus (any corpus when no model names one)."""
    named = any("corpus" in spec for spec in models.values())
    paper = set()
    for geometry, corpus, n in LAMBDA_PAPER_RUNS:
        for m, spec in models.items():
            if spec["geometry"] == geometry and (not named or spec.get("corpus") == corpus):
                paper |= {(m, int(s)) for s in spec["seeds"][:n]}
    return paper


# ----------------------------------------------------------------------------- pairs
#: (geometry A, geometry B) of the paper's paired bootstraps N_eff(A) − N_eff(B):
#: the main comparison (§12.1, §12.4) and the equal-head-count comparison (§12.1).
PAPER_PAIRS = (
    ("all-common-axis", "all-rotated"),
    ("all-common-axis", "all-rotated-self"),
    ("write-rotated", "learned"),
)


def unknown_model(model: str, models: Mapping[str, Any], where: str) -> ValueError:
    """The error for a model name the study lacks, with the nearest name it has."""
    close = difflib.get_close_matches(str(model), list(models), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"{where}: unknown model {model!r}{hint}; the study has {sorted(models)}")


def _seeds(models: Mapping[str, Mapping[str, Any]], model: str, where: str) -> list[int]:
    if model not in models:
        raise unknown_model(model, models, where)
    return [int(s) for s in models[model]["seeds"]]


def _pair(a: str, seed_a: int, b: str, seed_b: int) -> dict[str, Any]:
    return {
        "model_a": a,
        "seed_a": int(seed_a),
        "model_b": b,
        "seed_b": int(seed_b),
        "pair_label": f"{a} s{seed_a} − {b} s{seed_b}",
    }


def default_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The paper's pairs present in ``models``, first seed of each model.

    A geometry pair matches every model pair with those geometries trained on the same
    corpus (models without a ``corpus`` key match each other). Each model of the baseline
    geometry (``learned``) with at least two seeds adds its seed pair: the paper's seed
    reference (§12.1).
    """
    pairs = []
    for geometry_a, geometry_b in PAPER_PAIRS:
        for a, spec_a in models.items():
            for b, spec_b in models.items():
                if (
                    spec_a["geometry"] == geometry_a
                    and spec_b["geometry"] == geometry_b
                    and spec_a.get("corpus") == spec_b.get("corpus")
                ):
                    pairs.append(_pair(a, spec_a["seeds"][0], b, spec_b["seeds"][0]))
    for m, spec in models.items():
        if facts.is_baseline(spec["geometry"]) and len(spec["seeds"]) >= 2:
            pairs.append(_pair(m, spec["seeds"][0], m, spec["seeds"][1]))
    return pairs


def resolve_pairs(
    models: Mapping[str, Mapping[str, Any]], pairs: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Config ``concentration.pairs`` (``{a, b, seed_a?, seed_b?}``; seeds default to each
    model's first) checked against ``models``, or :func:`default_pairs` when ``None``."""
    if pairs is None:
        return default_pairs(models)
    resolved = []
    for i, pair in enumerate(pairs):
        where = f"config concentration.pairs[{i}]"
        seeds_a = _seeds(models, pair["a"], f"{where}.a")
        seeds_b = _seeds(models, pair["b"], f"{where}.b")
        seed_a, seed_b = int(pair.get("seed_a", seeds_a[0])), int(pair.get("seed_b", seeds_b[0]))
        for model, seed, seeds in ((pair["a"], seed_a, seeds_a), (pair["b"], seed_b, seeds_b)):
            if seed not in seeds:
                raise ValueError(f"{where}: model {model!r} has seeds {seeds}, not {seed}")
        if (pair["a"], seed_a) == (pair["b"], seed_b):
            raise ValueError(f"{where}: compares {pair['a']} s{seed_a} with itself")
        resolved.append(_pair(pair["a"], seed_a, pair["b"], seed_b))
    labels = [p["pair_label"] for p in resolved]
    if len(set(labels)) != len(labels):
        raise ValueError(f"config concentration.pairs lists a pair twice: {labels}")
    return resolved


def loss_models(models: Mapping[str, Mapping[str, Any]], chosen: Sequence[str] | None) -> list[str]:
    """Models of the loss-versus-N_eff analysis (§12.7): ``chosen`` (config
    ``concentration.loss_models``) or, by default, the models paper Figure 4 plots
    (:func:`select_models`: the corpus-S models of its slots), so the stored Spearman and
    the figure's are one number."""
    if chosen is None:
        return list(dict.fromkeys(m for m, _ in select_models(models, "figure4")))
    for i, model in enumerate(chosen):
        if model not in models:
            raise unknown_model(model, models, f"config concentration.loss_models[{i}]")
    return list(chosen)


# --------------------------------------------------------- dynamics (docs §13.2, §13.4, §14.2–14.5)
#: τ's steps in the paper (docs §13.4): 1,024, 4,096, 16,384 and 65,536 of 65,536, i.e. from
#: 1/64 of training on; the timelines' step 256 (1/256, Figure 6a–c) is not one of them.
TAU_FIRST_FRACTION = 1024 / 65536


def in_tau_range(step: int, final_step: int) -> bool:
    """Whether checkpoint ``step`` of a run trained for ``final_step`` steps is in the
    paper's τ range (at or after :data:`TAU_FIRST_FRACTION` of training)."""
    return step >= TAU_FIRST_FRACTION * final_step


# ------------------------------------------------------------------------ edges (docs §15.1, §15.4)
#: Table 7 (docs §15.1): the paper's row group of each geometry (data, as the paper groups
#: them); geometries absent here (multiscreen) have no edges. all-rotated and
#: all-rotated-self are reported separately (their PKs are uniform by design).
TABLE7_GROUPS: dict[str, str] = {
    "learned": "learned",
    "read-common": "read-common",
    "write-common-axis": "frozen writes, free readers",
    "write-common": "frozen writes, free readers",
    "write-rotated": "frozen writes, free readers",
    "write-routed-a": "frozen writes, free readers",
    "write-routed-b": "frozen writes, free readers",
    "write-routed-c": "frozen writes, free readers",
    "fixeddiag": "frozen writes, free readers",
    "value384": "frozen writes, free readers",
    "mlp3456": "frozen writes, free readers",
    "identity-original": "frozen writes, free readers",
    "all-common-axis": "all-common-axis (structural)",
    "all-rotated": "all-rotated (separate)",
    "all-rotated-self": "all-rotated-self (separate)",
}
TABLE7_ORDER = tuple(dict.fromkeys(TABLE7_GROUPS.values()))


# ------------------------------------------------------------------------- coordinates (docs §15.2)
#: Coordinate concentration (docs §15.2): its default geometries (the 7 write-common-axis
#: variants and the learned models after W_O; read-common and all-common-axis join the
#: pre-W_O comparison) and the paper's model group of each.
COORDINATE_GROUPS: dict[str, str] = {
    "write-common-axis": "write-common-axis variants",
    "fixeddiag": "write-common-axis variants",
    "value384": "write-common-axis variants",
    "mlp3456": "write-common-axis variants",
    "identity-original": "write-common-axis variants",
    "multiscreen-identity": "write-common-axis variants",
    "learned": "learned",
    "multiscreen-learned": "learned",
    "read-common": "read-common",
    "all-common-axis": "all-common-axis",
}
