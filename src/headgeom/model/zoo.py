"""The model zoo: the study's 21 configurations (docs §6.1, paper Table 4) by name, and
the rule that sizes each geometry for a study's base architecture.

Names. A :class:`Configuration` is one model of ``config/paper.yaml``: its ``key`` there
(``learned-r``), the paper's display name (``learned``), geometry, corpus (R or S), seeds and
one repository name per seed (``plain-learned42``). Its 21 (configuration, seed) runs are the
21 rows of §6.1. They are data, ``zoo.yaml`` beside this module (checked against
``zoo.schema.yaml`` on load): the one place the paper's parameter counts, validation losses
and row numbers are written. :func:`lookup` takes a key, display name or repository name; a
repository name gives ``(configuration, seed)``. Display names shared by two corpora
(``learned``, ``write-rotated``) need ``corpus=``.

Sizes. A study config gives one base ``architecture`` (paper: 12 layers, 12 heads, D = 768,
d = 64, MLP 3072, context 512). :func:`derive_model_config` turns (geometry, architecture)
into the model section of a run config with every size and choice explicit:

* value384: value adapter width D/2 (384 at paper size);
* mlp3456: MLP width d_mlp + D/2 (3072 + 384 = 3456);
* write-routed-a/b/c: n_head = 4H/3 (16), which needs 3 | H;
* multiscreen-*: n_head = 4H/3 tiles, d_model = n_head·d, n_layer = 7L/4 (21), d_key = d/4
  (16), which needs 3 | H, 4 | L and 4 | d (docs §6.6);
* everything else: the base architecture as it is.

Each rule is the ``size`` of the geometry's record (``headgeom.model.geometries``); the zoo
asks ``headgeom.model.registry`` for it and for the architecture whose config it fills. A
geometry that cannot exist at the requested size (axis lanes need H·d = D, rotated ones a
Kerdock family for D with enough members, ...) raises ValueError naming the geometry, the
size and the reason.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from headgeom import datafile

if TYPE_CHECKING:
    from torch import nn

#: The paper's base architecture (docs §4.1) and vocabulary (GPT-2, unpadded, §4.4).
PAPER_ARCHITECTURE: Mapping[str, int] = MappingProxyType(
    {"n_layer": 12, "n_head": 12, "d_model": 768, "d_head": 64, "d_mlp": 3072, "n_ctx": 512}
)
PAPER_N_VOCAB = 50257
CORPORA = ("R", "S")


@dataclass(frozen=True, eq=False)
class Configuration:
    """One model configuration of the study (paper Table 4), seeds included."""

    key: str  # model name in config/paper.yaml and results/<study>/models/<key>/
    display_name: str  # the paper's name in its text
    geometry: str
    corpus: str  # "R" (200M tokens, with replacement) or "S" (1.07B, read once)
    repository_names: Mapping[int, str]  # seed -> repository name
    n_params: int  # exact trainable parameters at paper size (docs §4.4, §6.1)
    val_loss: Mapping[int, float | None]  # seed -> paper validation loss (nats), None: "---"
    rows: Mapping[int, int]  # seed -> row of docs §6.1
    description: str  # write / readers, as §6.1 describes them

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.repository_names)

    @property
    def printed(self) -> str:
        """The count as paper Table 4 prints it: millions to two decimals and an M."""
        return f"{self.n_params / 1e6:.2f}M"

    def repository_name(self, seed: int) -> str:
        try:
            return self.repository_names[seed]
        except KeyError:
            raise ValueError(
                f"configuration {self.key!r} has no seed {seed}; seeds: {list(self.seeds)}"
            ) from None


def _name(_list: str, _index: int, entry: Any) -> str:
    return str(entry.get("key", "?")) if isinstance(entry, dict) else "?"


def _load() -> tuple[tuple[Configuration, ...], Mapping[str, int]]:
    """docs §6.1 from ``zoo.yaml`` (schema-checked), in row order, and the paper's training
    budget."""
    data = datafile.load(__package__, "zoo", _name)
    counts: dict[str, int] = data["n_params"]

    def fail(index: int, key: str, text: str) -> datafile.DataFileError:
        where = datafile.entry_where(data, ["configurations", index], _name, key)
        return datafile.problem(__package__, "zoo", where, text)

    configurations, keys, repositories = [], set(), set()
    for i, entry in enumerate(data["configurations"]):
        if entry["key"] in keys:
            raise fail(i, "key", f"{entry['key']!r} names an earlier configuration too")
        if entry["geometry"] not in counts:
            raise fail(i, "geometry", f"{entry['geometry']!r} has no n_params count")
        runs = entry["runs"]
        seeds = [run["seed"] for run in runs]
        if len(set(seeds)) != len(seeds):
            raise fail(i, "runs", f"a seed repeats: {seeds}")
        for run in runs:
            if run["repository"] in repositories:
                raise fail(i, "runs", f"repository {run['repository']!r} is named twice")
            repositories.add(run["repository"])
        keys.add(entry["key"])
        configurations.append(
            Configuration(
                key=entry["key"],
                display_name=entry["display_name"],
                geometry=entry["geometry"],
                corpus=entry["corpus"],
                repository_names=MappingProxyType({r["seed"]: r["repository"] for r in runs}),
                n_params=counts[entry["geometry"]],
                val_loss=MappingProxyType({r["seed"]: r["val_loss"] for r in runs}),
                rows=MappingProxyType({r["seed"]: r["row"] for r in runs}),
                description=entry["description"],
            )
        )
    unused = set(counts) - {c.geometry for c in configurations}
    if unused:
        where = datafile.entry_where(data, ["n_params"])
        raise datafile.problem(
            __package__, "zoo", where, f"no configuration has geometry {sorted(unused)}"
        )
    return tuple(configurations), MappingProxyType(dict(data["training"]))


#: docs §6.1, in row order (``zoo.yaml``); the paper's training steps and batch size (§7).
CONFIGURATIONS, PAPER_TRAINING = _load()
#: Sequences the paper trained every run on: its validation losses are of runs this long.
PAPER_TRAINING_SEQUENCES: int = PAPER_TRAINING["steps"] * PAPER_TRAINING["batch_size"]

BY_KEY: Mapping[str, Configuration] = MappingProxyType({c.key: c for c in CONFIGURATIONS})
BY_REPOSITORY_NAME: Mapping[str, tuple[Configuration, int]] = MappingProxyType(
    {name: (c, seed) for c in CONFIGURATIONS for seed, name in c.repository_names.items()}
)
#: Exact paper-size count of each geometry (every configuration of a geometry shares it).
PAPER_N_PARAMS: Mapping[str, int] = MappingProxyType(
    {c.geometry: c.n_params for c in CONFIGURATIONS}
)


def paper_runs() -> list[tuple[Configuration, int]]:
    """The 21 (configuration, seed) runs in the row order of docs §6.1."""
    runs = [(c, seed) for c in CONFIGURATIONS for seed in c.seeds]
    return sorted(runs, key=lambda run: run[0].rows[run[1]])


def lookup(name: str, corpus: str | None = None) -> tuple[Configuration, int | None]:
    """A configuration by key, display name or repository name.

    A repository name also gives its seed: ``lookup("rotated-m3-42")`` is
    ``(all-rotated-self, 42)``; keys and display names give seed None. ``corpus`` ("R" or
    "S") picks between configurations that share a display name.
    """
    if corpus is not None and corpus not in CORPORA:
        raise ValueError(f"corpus={corpus!r}; expected one of {list(CORPORA)}")
    if name in BY_REPOSITORY_NAME:
        found, seed = BY_REPOSITORY_NAME[name]
        if corpus is not None and found.corpus != corpus:
            raise ValueError(f"{name!r} is trained on corpus {found.corpus}, not {corpus}")
        return found, seed
    if name in BY_KEY and (corpus is None or BY_KEY[name].corpus == corpus):
        return BY_KEY[name], None
    matches = [
        c
        for c in CONFIGURATIONS
        if c.display_name == name and (corpus is None or c.corpus == corpus)
    ]
    if len(matches) == 1:
        return matches[0], None
    if matches:
        choices = ", ".join(f"{c.key} (corpus {c.corpus})" for c in matches)
        raise ValueError(
            f"display name {name!r} names {len(matches)} configurations: {choices}; "
            f"pass corpus='R' or 'S', or a key or repository name"
        )
    names = sorted({*BY_KEY, *BY_REPOSITORY_NAME, *(c.display_name for c in CONFIGURATIONS)})
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    where = f" on corpus {corpus}" if corpus else ""
    raise ValueError(f"no configuration is named {name!r}{where}{hint}")


# --------------------------------------------------------------------------- sizing
def derive_model_config(
    geometry: str, architecture: Mapping[str, Any], geometry_params: Mapping | None = None
) -> dict[str, Any]:
    """The model section of a run config (every field but n_vocab, defaults and choices
    filled) for ``geometry`` in a study whose base architecture is ``architecture``."""
    from headgeom.model import registry  # torch: not for the tables that only read names
    from headgeom.model.geometries import SizeError  # torch, as above

    spec = registry.geometry(geometry)
    arch = registry.architecture(spec.architecture)
    if geometry_params and not arch.geometry_params:
        raise ValueError(f"geometry {geometry!r} takes no geometry_params")
    try:
        sized = spec.size(architecture)
    except SizeError as err:
        size = ", ".join(
            f"{k}={architecture[k]}" for k in ("n_layer", "n_head", "d_model", "d_head")
        )
        raise ValueError(f"geometry {geometry!r} cannot exist at {size}: {err}") from None
    params = {"geometry_params": dict(geometry_params or {})} if arch.geometry_params else {}
    try:
        cfg = arch.config(**sized, n_vocab=1, geometry=spec.stored_geometry, **params)
    except TypeError as err:
        raise ValueError(f"architecture {dict(architecture)}: {err}") from None
    model = cfg.to_dict()
    del model["n_vocab"]
    return model


def paper_model_config(geometry: str) -> dict[str, Any]:
    """:func:`derive_model_config` at paper size."""
    return derive_model_config(geometry, PAPER_ARCHITECTURE)


def _shape(model_config: Mapping) -> dict[str, Any]:
    """What decides a count: every integer, boolean and string field (not the float scales)."""
    flat = {k: v for k, v in model_config.items() if k != "geometry_params"}
    params = model_config.get("geometry_params", {})
    flat.update({f"geometry_params.{k}": v for k, v in params.items()})
    return {k: v for k, v in flat.items() if not isinstance(v, float)}


def is_paper_size(geometry: str, model_config: Mapping) -> bool:
    """The model has the paper's size for its geometry (docs §6.1): every integer, boolean
    and string field of its model config equals the paper configuration's (``n_vocab`` is not
    compared). Checks that hold only at that size (docs §9.4, §7.3) are enforced there."""
    if geometry not in PAPER_N_PARAMS:
        return False
    shape = {k: v for k, v in _shape(model_config).items() if k != "n_vocab"}
    paper = {k: v for k, v in _shape(paper_model_config(geometry)).items() if k != "n_vocab"}
    return shape == paper


def expected_n_params(geometry: str, model_config: Mapping, n_vocab: int) -> int | None:
    """The exact paper count (docs §6.1) when the model has the paper's size, else None."""
    if geometry not in PAPER_N_PARAMS or n_vocab != PAPER_N_VOCAB:
        return None
    paper = paper_model_config(geometry)
    return PAPER_N_PARAMS[geometry] if _shape(model_config) == _shape(paper) else None


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, tied embedding once; frozen buffer elements) (docs §4.4)."""
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return n_params, sum(b.numel() for b in model.buffers())
