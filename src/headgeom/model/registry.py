"""The model registry: every architecture and geometry of the study, and the one model builder.

Code outside this package asks here; it never compares an architecture or geometry name with
a string and never probes a model with ``hasattr``:

* a geometry by its study name: :func:`geometry` returns its record
  (``headgeom.model.geometries.Geometry``: architecture, reader kind, shared LN_1, sizing
  rule, GPT-2 form, baseline); :func:`geometry_names`; and the questions of the workflow and
  the paper tables, :func:`reader_kind`, :func:`has_shared_ln1`, :func:`has_gpt2_form`,
  :func:`is_baseline`;
* an architecture: :func:`architecture` by name, :func:`architecture_of` for a built model
  (None for a model type the registry does not know): its config and model types, its named
  sites with their axes, and what the analysis engines may assume of it (``fast_patching``,
  ``prefix_reuse``); :func:`heads_of`: a built model's heads' weight maps and readers;
* a model config: :func:`config_from_dict` (the dict of a run config or checkpoint header ->
  its typed config), :func:`geometry_of`, :func:`basis_family` and :func:`frozen_bases`
  (typed config -> its geometry record, its Kerdock ⊗ Haar family or None, the frozen basis
  of each layer's writes and block reads), and :func:`build_model`, the one
  constructor that training, checkpoints, the zoo and the benchmarks use.

Adding a geometry is one record in ``headgeom.model.geometries.GEOMETRIES``; adding an
architecture is one record in :data:`ARCHITECTURES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from headgeom.model import config as gpt_config
from headgeom.model import facts, geometries, gpt, hf, multiscreen
from headgeom.model.config import ModelConfig
from headgeom.model.geometries import GEOMETRIES, Geometry
from headgeom.model.heads import BlockHeads, Heads, free_reader_refusal
from headgeom.model.hf_weights import HFHeads, config_leakage_refusal
from headgeom.model.kerdock import BasisFamily
from headgeom.model.multiscreen import MultiscreenConfig, MultiscreenLM


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """One architecture: what its configs and models are, and what engines may assume.

    * ``name`` — the ``architecture`` key of its model configs (GPT configs have none);
    * ``config`` — its typed config (``from_dict``, ``to_dict``); ``model`` — its module,
      built as ``model(config)``;
    * ``sites`` — its named activation sites and their axes (``blocks.{l}.<site>``, and
      ``hook_resid_final``);
    * ``geometry_params`` — its configs carry ``geometry_params`` (frozen maps, Kerdock bases);
    * ``fast_patching`` — every block is a function of the residual entering it
      (``hook_resid_pre``) with head outputs at ``attn.hook_z``, and ``model.answer_logits``
      reads the answer logits from the residual leaving the last block: the fast engine may
      resume from a cached residual and compute two logits only;
    * ``prefix_reuse`` — blocks also offer the KV-prefix forward (``forward_suffix``,
      ``after_z``, ``after_attn``): readers act position by position under causal attention
      whose keys and values are cached at ``attn.hook_k``/``attn.hook_v``, so the fast
      engine may reuse the clean prefix;
    * ``edge_patching`` — its Q/K/V readers are the ones the edge engine re-evaluates on a
      patched residual (``headgeom.heads.analysis.edges``: LN_1 or block readers, the value
      adapter); docs §15.1 defines edges for GPT models only;
    * ``heads`` — a built model -> its heads' weight maps and readers
      (``headgeom.model.heads.Heads``: W_O, W_Q/W_K/W_V, the norm before them), what the
      weight-space and leakage analyses read (:func:`heads_of`);
    * ``coordinate_engine`` — coordinate concentration (docs §15.2) runs on its blocks
      (layer resumption, ``attn.writer``); checked on our GPTs only;
    * ``block_attention`` — a block's ``attn(x)`` recomputes its attention output from the
      residual entering it, which the leakage pass over the clean prefix calls once per
      patched head (a transformers layer's attention takes more than the residual: the
      leakage analysis then runs its hooked pass, whole forwards through the sites);
    * ``leakage_refusal`` — a model config dict -> why leakage (docs §11) is not defined on
      its models, or None: what the workflow asks before any model is built
      (:func:`analysis_refusal`; a built model's ``heads_of(model).leakage_refusal`` says the
      same).
    """

    name: str
    config: type
    model: type[nn.Module]
    sites: Mapping[str, tuple[str, ...]]
    geometry_params: bool
    fast_patching: bool
    prefix_reuse: bool
    edge_patching: bool
    heads: Callable[[nn.Module], Heads]
    leakage_refusal: Callable[[Mapping[str, Any]], str | None]
    block_attention: bool = True
    coordinate_engine: bool = True


def _block_heads(model: nn.Module) -> Heads:
    """Our GPT and multiscreen models: readers and writers of the model's geometry."""
    spec = geometry_of(model.cfg)
    return BlockHeads(model, spec.shared_ln1, spec.name, spec.reader)


def _geometry_leakage_refusal(model_config: Mapping[str, Any]) -> str | None:
    """Our models: leakage needs a geometry with a shared LN_1 (docs §11.1)."""
    spec = geometry(facts.study_geometry(dict(model_config)))
    return None if spec.shared_ln1 else free_reader_refusal(spec.name, spec.reader)


ARCHITECTURES: Mapping[str, Architecture] = MappingProxyType(
    {
        a.name: a
        for a in (
            Architecture(
                name=gpt_config.ARCHITECTURE,
                config=ModelConfig,
                model=gpt.GPT,
                sites=MappingProxyType(gpt.SITE_AXES),
                geometry_params=True,
                fast_patching=True,
                prefix_reuse=True,
                edge_patching=True,
                heads=_block_heads,
                leakage_refusal=_geometry_leakage_refusal,
            ),
            # Windows and MiPE rotations depend on absolute positions only, so the tiles
            # have the KV-prefix forward too (``ScreeningBlock.forward_suffix``, docs §6.6).
            Architecture(
                name=multiscreen.ARCHITECTURE,
                config=MultiscreenConfig,
                model=MultiscreenLM,
                sites=MappingProxyType(multiscreen.SITE_AXES),
                geometry_params=False,
                fast_patching=True,
                prefix_reuse=True,
                edge_patching=False,
                heads=_block_heads,
                leakage_refusal=_geometry_leakage_refusal,
            ),
            # A transformers model's own forward, sites by hooks on its family's modules
            # (headgeom.model.families); its decoder layers run as blocks from a cached
            # residual and against the clean prefix's keys/values (headgeom.model.hf_blocks);
            # its heads' maps through the family record (hf_weights).
            Architecture(
                name=hf.ARCHITECTURE,
                config=hf.HFModelConfig,
                model=hf.HFCausalLM,
                sites=MappingProxyType(hf.SITE_AXES),
                geometry_params=False,
                fast_patching=True,
                prefix_reuse=True,
                edge_patching=False,
                heads=HFHeads,
                leakage_refusal=config_leakage_refusal,
                block_attention=False,
                coordinate_engine=False,
            ),
        )
    }
)
_BY_MODEL_TYPE = {a.model: a for a in ARCHITECTURES.values()}
_BY_STORED = {(g.architecture, g.stored_geometry): g for g in GEOMETRIES.values()}


# --------------------------------------------------------------------------- geometries
def geometry(name: str) -> Geometry:
    """The record of a study geometry (``models.<m>.geometry`` of a config)."""
    try:
        return GEOMETRIES[name]
    except KeyError:
        raise ValueError(f"unknown geometry {name!r}; known: {list(GEOMETRIES)}") from None


def geometry_names(arch: str | None = None) -> tuple[str, ...]:
    """Every study geometry (the config schema's enum, in its order), or those of the
    architecture named ``arch``."""
    if arch is not None:
        architecture(arch)  # an unknown name fails here
    return tuple(g.name for g in GEOMETRIES.values() if arch in (None, g.architecture))


# The facts of a geometry (torch-free, headgeom.model.facts), here beside the builders.
reader_kind, has_shared_ln1 = facts.reader_kind, facts.has_shared_ln1
has_gpt2_form, is_baseline, is_base_architecture = (
    facts.has_gpt2_form,
    facts.is_baseline,
    facts.is_base_architecture,
)


# --------------------------------------------------------------------------- architectures
def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {list(ARCHITECTURES)}") from None


def architecture_of(model: nn.Module) -> Architecture | None:
    """The architecture of a built model, by its exact type; None for a type not registered
    (an engine then assumes nothing of it)."""
    return _BY_MODEL_TYPE.get(type(model))


#: What an analysis engine needs of an architecture beyond its hook sites: the registry flag,
#: and the words of a refusal without it (leakage asks ``Architecture.leakage_refusal``).
_ENGINE_NEEDS = {
    "edges": ("edge_patching", "the Q/K/V readers the edge engine re-evaluates (docs §15.1)"),
    "coordinates": ("coordinate_engine", "a coordinate engine checked on its blocks (docs "
                    "§15.2: the directions of our models' W_O and z; untested on "
                    "transformers layers)"),
}  # fmt: skip
ANALYSES = ("leakage", *_ENGINE_NEEDS)


def analysis_refusal(model_config: Mapping[str, Any], analysis: str) -> str | None:
    """Why the models of a config dict (a run config's ``model`` section) cannot run
    ``analysis`` (one of :data:`ANALYSES`), or None: what the workflow's run sets ask before
    building anything."""
    arch = architecture(model_config.get("architecture", gpt_config.ARCHITECTURE))
    if analysis == "leakage":
        return arch.leakage_refusal(model_config)
    if analysis not in _ENGINE_NEEDS:
        raise ValueError(f"no engine needs recorded for analysis {analysis!r}; known: {ANALYSES}")
    flag, what = _ENGINE_NEEDS[analysis]
    return None if getattr(arch, flag) else f"architecture {arch.name!r} lacks {what}"


def heads_of(model: nn.Module) -> Heads:
    """The weight maps and readers of a built model's heads (``Architecture.heads``)."""
    arch = architecture_of(model)
    if arch is None:
        raise ValueError(f"{type(model).__name__} is not a registered architecture")
    return arch.heads(model)


# --------------------------------------------------------------------------- model configs
def config_from_dict(model_config: Mapping[str, Any]) -> Any:
    """The typed config (``ModelConfig`` or ``MultiscreenConfig``) of a model config dict;
    the dict's ``architecture`` picks it, GPT when absent. Unknown or missing keys fail here
    with the key named."""
    name = model_config.get("architecture", gpt_config.ARCHITECTURE)
    return architecture(name).config.from_dict(model_config)


def geometry_of(cfg: Any) -> Geometry:
    """The study geometry of a typed model config (e.g. ``model.cfg``)."""
    try:
        return _BY_STORED[(cfg.architecture, cfg.geometry)]
    except KeyError:
        raise ValueError(
            f"no study geometry is a {cfg.architecture!r} model of geometry {cfg.geometry!r}"
        ) from None


def basis_family(cfg: Any) -> BasisFamily | None:
    """The Kerdock ⊗ Haar family a model's frozen maps come from (its ``family_hash`` is the
    manifests' ``basis_family_hash``, docs §5.7), or None when it uses none."""
    if not architecture(cfg.architecture).geometry_params:
        return None
    return geometries.basis_family(cfg)


def frozen_bases(cfg: Any) -> dict[str, list]:
    """Per role ("write", "read") and layer, the frozen basis of a typed model config:
    ``geometries.AXIS`` or a member of its basis family (docs §5.6); {} when it has none
    (learned maps, routings, multiscreen tiles)."""
    if not architecture(cfg.architecture).geometry_params:
        return {}
    return geometries.frozen_bases(cfg)


def build_model(model_config: Mapping[str, Any], n_vocab: int | None = None) -> nn.Module:
    """The model a model config dict describes (a run config's ``model`` section, or a
    checkpoint header's ``model_config``), with ``n_vocab`` set when given. The constructor
    seeds nothing: seed the RNGs first for fixed bytes; build under ``torch.device("meta")``
    to count without memory."""
    if n_vocab is not None:
        model_config = {**model_config, "n_vocab": int(n_vocab)}
    cfg = config_from_dict(model_config)
    return architecture(cfg.architecture).model(cfg)
