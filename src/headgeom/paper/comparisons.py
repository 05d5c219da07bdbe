"""Which models the concentration analyses compare (METHODS §12.1, §12.4, §12.7).

The paper's paired comparisons are named by geometry, so they resolve in any study: in the
demo (keys = display names) and in the paper study (keys such as ``learned-s``, where two
models share a geometry on different corpora and only same-corpus pairs are compared).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headgeom.paper.tables import select_models

#: (geometry A, geometry B) of the paper's paired bootstraps N_eff(A) − N_eff(B):
#: the main comparison (§12.1, §12.4) and the equal-head-count comparison (§12.1).
PAPER_PAIRS = (
    ("all-common-axis", "all-rotated"),
    ("all-common-axis", "all-rotated-self"),
    ("write-rotated", "learned"),
)
#: Geometries whose first two seeds form the paper's seed reference (§12.1).
SEED_PAIR_GEOMETRIES = ("learned",)


def _seeds(models: Mapping[str, Mapping[str, Any]], model: str, where: str) -> list[int]:
    if model not in models:
        raise ValueError(f"{where}: unknown model {model!r}; the study has {sorted(models)}")
    return [int(s) for s in models[model]["seeds"]]


def _pair(models, a: str, seed_a: int, b: str, seed_b: int) -> dict[str, Any]:
    return {
        "model_a": a,
        "seed_a": int(seed_a),
        "model_b": b,
        "seed_b": int(seed_b),
        "pair_label": f"{a} s{seed_a} − {b} s{seed_b}",
    }


def default_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The paper's pairs present in ``models`` (config ``models``), first seed of each model.

    A geometry pair matches every model pair with those geometries trained on the same
    corpus (models without a ``corpus`` key match each other). Each model of a
    :data:`SEED_PAIR_GEOMETRIES` geometry with at least two seeds adds its seed pair.
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
                    pairs.append(_pair(models, a, spec_a["seeds"][0], b, spec_b["seeds"][0]))
    for m, spec in models.items():
        if spec["geometry"] in SEED_PAIR_GEOMETRIES and len(spec["seeds"]) >= 2:
            pairs.append(_pair(models, m, spec["seeds"][0], m, spec["seeds"][1]))
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
        seeds_a, seeds_b = _seeds(models, pair["a"], where), _seeds(models, pair["b"], where)
        seed_a, seed_b = int(pair.get("seed_a", seeds_a[0])), int(pair.get("seed_b", seeds_b[0]))
        for model, seed, seeds in ((pair["a"], seed_a, seeds_a), (pair["b"], seed_b, seeds_b)):
            if seed not in seeds:
                raise ValueError(f"{where}: model {model!r} has seeds {seeds}, not {seed}")
        if (pair["a"], seed_a) == (pair["b"], seed_b):
            raise ValueError(f"{where}: compares {pair['a']} s{seed_a} with itself")
        resolved.append(_pair(models, pair["a"], seed_a, pair["b"], seed_b))
    labels = [p["pair_label"] for p in resolved]
    if len(set(labels)) != len(labels):
        raise ValueError(f"config concentration.pairs lists a pair twice: {labels}")
    return resolved


def loss_models(models: Mapping[str, Mapping[str, Any]], chosen: Sequence[str] | None) -> list[str]:
    """Models of the loss-versus-N_eff analysis (§12.7): ``chosen`` (config
    ``concentration.loss_models``) or, by default, the models paper Figure 4 plots
    (``headgeom.paper.tables.select_models``: the corpus-S models of its slots), so the stored
    Spearman and the figure's are one number."""
    if chosen is None:
        return list(dict.fromkeys(m for m, _ in select_models(models, "figure4")))
    unknown = sorted(set(chosen) - set(models))
    if unknown:
        raise ValueError(
            f"config concentration.loss_models names unknown models {unknown}; "
            f"the study has {sorted(models)}"
        )
    return list(chosen)
