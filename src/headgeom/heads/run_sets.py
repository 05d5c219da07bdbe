"""Which runs each analysis measures: one table of run sets (:data:`RUN_SETS`) and one
resolver (:func:`resolve`, :meth:`headgeom.heads.study.Study.run_set`).

A run set is a list of (model, seed) in config order. Each one either follows a config key
that names models (``leakage.models``: model names, all their seeds; ``clamps.pairs_models``
and the others marked ``entries="runs"``: a model, or ``{model, seeds}``) or, when the config
leaves it out, its default: the runs of some geometries (the paper's, docs §11–§15), the
models a paper selection shows, or every model; in both cases only models whose architecture
can run the analysis (``needs``: the registry's :func:`~headgeom.model.registry.analysis_refusal`
answers from the model config). A default leaves out an imported model the registry refuses
and records why (:func:`skipped`: the workflow prints it); a config entry naming a refused
model is an error saying why. The paper's tables and figures name these sets too
(``headgeom.heads.paper.outputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from headgeom.heads import selections
from headgeom.heads.selections import unknown_model

Run = tuple[str, int]


class RunSetStudy(Protocol):
    """What the resolver reads of a study (:class:`headgeom.heads.study.Study`, which asks
    this module for its run sets): named here, so the two modules do not import each other."""

    config: dict
    models: dict[str, dict]

    @property
    def runs(self) -> list[Run]: ...

    @property
    def first_seed_runs(self) -> list[Run]: ...

    @property
    def extra_modes(self) -> list[str]: ...

    def stage(self, name: str) -> dict: ...

    def is_imported(self, model: str) -> bool: ...

    @property
    def imported_models(self) -> list[str]: ...

    def model_config(self, model: str) -> dict: ...

    def run_set(self, name: str) -> list[Run]: ...


#: Default geometries of each clamp analysis (docs §13.3, §15.3), every corpus and seed: the
#: pair clamps of Figure 6d–e (write-common, write-common-axis, the frozen-write write-rotated
#: and learned), both orders of the path decomposition (the learned and write-common-axis
#: models of §11.1) and the lumped lane clamp (all-common-axis). Figure 8's order-A models
#: are its paper selection.
CLAMP_PAIRS = ("learned", "write-common", "write-common-axis", "write-rotated")
CLAMP_BOTH_ORDERS = ("learned", "write-common-axis")
CLAMP_LUMPED = ("all-common-axis",)
#: Training dynamics (docs §13.2, §13.4, §14.2, §14.4: the paper's common42 and layered42),
#: on corpus R where a study names corpora; the scalar-part ablation (docs §14.5:
#: identity-type writes with free readers: plain-identity42/43, fixeddiag42, value384,
#: mlp3456), every corpus.
TIMELINE = ("write-common", "write-rotated")
TIMELINE_CORPUS = "R"
SCALAR_ABLATION = ("write-common-axis", "fixeddiag", "value384", "mlp3456")
#: ACDC (docs §15.4) runs on these geometries' edge runs unless edges.acdc_models names models.
ACDC = ("all-rotated",)


@dataclass(frozen=True)
class RunSet:
    """One analysis's runs: what config key chooses them, and what they are without it."""

    name: str
    #: ``block.key`` of the config entry naming its models; None: not configurable.
    config: str | None = None
    #: Config entries: model names (all seeds) or ``runs`` (a model, or {model, seeds}).
    entries: Literal["models", "runs"] = "models"
    #: The default: these geometries (on ``corpus`` where the study names corpora), the
    #: models of paper selection ``selection``, or every model; always within run set
    #: ``within`` if given.
    geometries: tuple[str, ...] | None = None
    corpus: str | None = None
    selection: str | None = None
    within: str | None = None
    #: The analysis (``headgeom.model.registry.ANALYSES``) whose engine a model's
    #: architecture must have: a model it refuses is never in the set.
    needs: str | None = None
    #: ``all`` seeds, the ``first`` of each model, or the config flag that picks first seeds.
    seeds: str = "all"
    #: Whether the analysis runs at all (a config switch); None: always.
    when: Callable[[RunSetStudy], bool] | None = None
    #: Reads training checkpoints: imported models are never defaults, and naming one fails.
    trained: bool = False
    #: The union of these run sets, in run order.
    union: tuple[str, ...] = ()


def refusal(study: RunSetStudy, model: str, analysis: str | None) -> str | None:
    """Why ``model``'s architecture cannot run ``analysis``, or None (no analysis: None)."""
    if analysis is None:
        return None
    from headgeom.model import registry  # the architectures' engines: torch

    return registry.analysis_refusal(study.model_config(model), analysis)


RUN_SETS: dict[str, RunSet] = {
    s.name: s
    for s in (
        RunSet("runs"),
        RunSet("first_seeds", seeds="first"),
        RunSet("leakage", config="leakage.models", needs="leakage"),
        RunSet("clamp_pairs", config="clamps.pairs_models", entries="runs",
               geometries=CLAMP_PAIRS),
        RunSet("clamp_figure8", config="clamps.figure8_models", entries="runs",
               selection="figure8"),
        RunSet("clamp_both_orders", config="clamps.both_orders_models", entries="runs",
               geometries=CLAMP_BOTH_ORDERS),
        RunSet("clamp_lumped", config="clamps.lumped_models", entries="runs",
               geometries=CLAMP_LUMPED),
        RunSet("clamps", union=("clamp_pairs", "clamp_figure8", "clamp_both_orders",
                                "clamp_lumped")),
        RunSet("dynamics_timeline", config="dynamics.models", entries="runs",
               geometries=TIMELINE, corpus=TIMELINE_CORPUS, trained=True),
        RunSet("dynamics_ablation", config="dynamics.ablation_models", entries="runs",
               geometries=SCALAR_ABLATION),
        # edges (docs §15.1): every run of a Table 7 group whose architecture has the
        # engine's Q/K/V readers; ACDC (§15.4): the first seed of the all-rotated ones
        RunSet("edges", config="edges.models", geometries=tuple(selections.TABLE7_GROUPS),
               needs="edges"),
        RunSet("acdc", config="edges.acdc_models", geometries=ACDC, within="edges",
               seeds="first"),
        # coordinate concentration (docs §15.2): the write-common-axis variants and learned
        # after W_O; read-common and all-common-axis join the pre-W_O comparison
        RunSet("coordinates", config="coordinates.models",
               geometries=tuple(selections.COORDINATE_GROUPS), seeds="coordinates.first_seeds",
               needs="coordinates"),
        # ablation modes and the block ablation atlas (docs §10.6): opt-in, first seeds
        RunSet("ablation_modes", config="ablation.mode_models", seeds="first",
               when=lambda study: bool(study.extra_modes)),
        RunSet("ablation_atlas", config="ablation.atlas_models", seeds="first",
               when=lambda study: study.config["ablation"]["atlas"]),
    )
}  # fmt: skip


def _configured(study: RunSetStudy, spec: RunSet) -> list | None:
    if spec.config is None:
        return None
    block, key = spec.config.split(".")
    return (study.config.get(block) or {}).get(key)


def _pool(study: RunSetStudy, spec: RunSet) -> list[Run]:
    """Every run, or one per model, as the run set's ``seeds`` says."""
    if spec.seeds in ("all", "first"):
        first = spec.seeds == "first"
    else:  # a config switch, e.g. coordinates.first_seeds
        block, key = spec.seeds.split(".")
        first = bool(study.stage(block)[key])
    return study.first_seed_runs if first else study.runs


def _default(study: RunSetStudy, spec: RunSet) -> list[Run]:
    if spec.selection is not None:
        chosen = selections.select_models(study.models, spec.selection)
        return [(m, s) for m, s in chosen if refusal(study, m, spec.needs) is None]
    named = any("corpus" in s for s in study.models.values())
    within = set(resolve(study, spec.within)) if spec.within else None

    def wanted(model: str, seed: int) -> bool:
        geometry, corpus = study.models[model]["geometry"], study.models[model].get("corpus")
        return (
            (spec.geometries is None or geometry in spec.geometries)
            and (spec.corpus is None or not named or corpus == spec.corpus)
            and not (spec.trained and study.is_imported(model))
            and (within is None or (model, seed) in within)
            and refusal(study, model, spec.needs) is None
        )

    return [(m, s) for m, s in _pool(study, spec) if wanted(m, s)]


def skipped(study: RunSetStudy) -> list[dict[str, str]]:
    """The analyses whose default would take an imported model but whose engine its
    architecture lacks: one ``{run_set, model, reason}`` per (run set, model), in run-set and
    config order. The study's own geometries are chosen by design (docs §16.2), not skipped."""
    out = []
    for spec in RUN_SETS.values():
        if spec.needs is None or _configured(study, spec) is not None:
            continue
        if spec.when is not None and not spec.when(study):
            continue
        for model in study.imported_models:
            geometry = study.models[model]["geometry"]
            if spec.geometries is not None and geometry not in spec.geometries:
                continue
            reason = refusal(study, model, spec.needs)
            if reason is not None:
                out.append({"run_set": spec.name, "model": model, "reason": reason})
    return out


def _named(study: RunSetStudy, spec: RunSet, entries: list) -> list[Run]:
    """The runs config entries name, each checked: a known model, its seeds, checkpoints."""
    runs: list[Run] = []
    for i, entry in enumerate(entries):
        where = f"config {spec.config}[{i}]"
        model = entry if isinstance(entry, str) else entry["model"]
        if model not in study.models:
            raise unknown_model(model, study.models, where)
        if spec.trained and study.is_imported(model):
            raise ValueError(f"{where}: imported model {model!r} has no training checkpoints")
        reason = refusal(study, model, spec.needs)
        if reason is not None:
            raise ValueError(f"{where}: model {model!r} cannot run {spec.name}: {reason}")
        seeds = [int(s) for s in study.models[model]["seeds"]]
        chosen = seeds if isinstance(entry, str) else [int(s) for s in entry["seeds"]]
        for seed in chosen:
            if seed not in seeds:
                raise ValueError(f"{where}: model {model!r} has seeds {seeds}, not {seed}")
        runs += [(model, s) for s in chosen]
    pool = _pool(study, spec) if spec.entries == "models" else study.runs
    return [r for r in pool if r in set(runs)]


def resolve(study: RunSetStudy, name: str) -> list[Run]:
    """The runs of run set ``name`` in ``study``, in config order; an unknown name, a model
    the study lacks or a seed it lacks is an error naming it."""
    if name not in RUN_SETS:
        raise KeyError(f"no run set {name!r}; known: {sorted(RUN_SETS)}")
    spec = RUN_SETS[name]
    if spec.union:
        chosen = {run for part in spec.union for run in study.run_set(part)}
        return [r for r in study.runs if r in chosen]
    if spec.when is not None and not spec.when(study):
        return []
    entries = _configured(study, spec)
    return _default(study, spec) if entries is None else _named(study, spec, entries)
