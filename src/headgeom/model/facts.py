"""What each geometry of the study is, as facts the rest of the code asks without building a
model: its architecture, how its heads read the residual, whether a shared LN_1 sits before
learned readers, whether it is exactly GPT-2, whether it is the baseline (docs §4, §6.1).

No torch here: the study, the run sets, the paper's selections and tables read these facts;
:mod:`headgeom.model.geometries` attaches the builders to the same names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

#: How a head reads the residual: "free" (learned maps of the whole residual) or "block"
#: (one fixed d-dim block per head, docs §4.3.1).
ReaderKind = Literal["free", "block"]
FREE: ReaderKind = "free"
BLOCK: ReaderKind = "block"
#: The architectures (``headgeom.model.registry.ARCHITECTURES``): the study's base GPT, the
#: softmax-free multiscreen controls (docs §6.6), and any registered ``transformers`` causal
#: LM (``headgeom.model.hf``; no study geometry).
GPT = "gpt"
MULTISCREEN = "multiscreen"
HF_CAUSAL_LM = "hf-causal-lm"
#: Import formats (``models.<m>.import.format``) of any registered causal LM, kept as an
#: ``hf-causal-lm`` model with its own vocabulary (``headgeom.model.causal_import``); the
#: others (hf-gpt2, tl-gpt2) convert GPT-2 into our GPT.
CAUSAL_LM_FORMATS = (HF_CAUSAL_LM, "gguf", "hub")


@dataclass(frozen=True)
class GeometryFacts:
    """``reader`` — FREE or BLOCK; ``shared_ln1`` — a shared LN_1 before learned W_{Q,K,V},
    what leakage needs (docs §11.1; multiscreen tiles read freely but without LayerNorm);
    ``gpt2_form`` — exactly GPT-2's parameterisation (exportable to transformers and
    TransformerLens); ``baseline`` — the unconstrained model every Δ compares with."""

    name: str
    reader: ReaderKind
    shared_ln1: bool
    architecture: str = GPT
    gpt2_form: bool = False
    baseline: bool = False
    #: The ``geometry`` its model configs store, when not ``name`` (a multiscreen model
    #: config names the write geometry inside its tiles).
    stored: str | None = None


def _gpt_free(name: str, **extra) -> GeometryFacts:
    return GeometryFacts(name, FREE, True, **extra)


def _gpt_block(name: str) -> GeometryFacts:
    return GeometryFacts(name, BLOCK, False)


def _multiscreen(name: str, stored: str) -> GeometryFacts:
    return GeometryFacts(name, FREE, False, architecture=MULTISCREEN, stored=stored)


#: Every geometry of the study, in the order of the config schema's enum.
FACTS: Mapping[str, GeometryFacts] = MappingProxyType(
    {
        f.name: f
        for f in (
            _gpt_free("learned", gpt2_form=True, baseline=True),
            _gpt_free("write-common-axis"),
            _gpt_free("write-common"),
            _gpt_free("write-rotated"),
            _gpt_block("read-common"),
            _gpt_block("all-common-axis"),
            _gpt_block("all-rotated"),
            _gpt_block("all-rotated-self"),
            _gpt_free("fixeddiag"),
            _gpt_free("identity-original"),
            _gpt_free("value384"),
            _gpt_free("mlp3456"),
            _gpt_free("write-routed-a"),
            _gpt_free("write-routed-b"),
            _gpt_free("write-routed-c"),
            _multiscreen("multiscreen-learned", "learned"),
            _multiscreen("multiscreen-identity", "write-common-axis"),
        )
    }
)


def facts(name: str) -> GeometryFacts:
    """The facts of study geometry ``name``; an unknown name is an error naming the known."""
    try:
        return FACTS[name]
    except KeyError:
        raise ValueError(f"unknown geometry {name!r}; known: {list(FACTS)}") from None


def reader_kind(name: str) -> ReaderKind:
    """``"free"`` or ``"block"`` (docs §4.3.1); multiscreen tiles read freely."""
    return facts(name).reader


def has_shared_ln1(name: str) -> bool:
    """A shared LN_1 before learned W_{Q,K,V}: what leakage needs (docs §11.1)."""
    return facts(name).shared_ln1


def has_gpt2_form(name: str) -> bool:
    """Exactly GPT-2's parameterisation: exportable to transformers / TransformerLens."""
    return facts(name).gpt2_form


def is_baseline(name: str) -> bool:
    """The unconstrained model (``learned``) that Δs and seed pairs compare with."""
    return facts(name).baseline


def is_base_architecture(name: str) -> bool:
    """A model of the study's base (GPT) architecture: False for the softmax-free
    multiscreen controls, which the paper's 19-configuration summaries leave out (docs §6.7:
    57 model–task pairs = 19 configurations × 3 tasks)."""
    return facts(name).architecture == GPT


#: The study geometry of every imported model (a checkpoint the user brings): GPT-2's own,
#: free readers; a pretrained transformers model, which has none of its own, is counted with it.
IMPORTED_GEOMETRY = "learned"


def study_geometry(model_config: dict) -> str:
    """The study geometry of a stored model config (a run config's ``model`` section): its
    ``geometry``, or for another architecture the geometry whose configs store that one
    (a multiscreen-learned model's config says ``geometry: learned``); for an architecture
    without study geometries (a pretrained transformers model) :data:`IMPORTED_GEOMETRY`, as
    the study counts it (``headgeom.heads.study``)."""
    arch = model_config.get("architecture", GPT)
    if not any(f.architecture == arch for f in FACTS.values()):
        return IMPORTED_GEOMETRY
    stored = model_config["geometry"]
    for f in FACTS.values():
        if f.architecture == arch and (f.stored or f.name) == stored:
            return f.name
    raise ValueError(f"no study geometry is a {arch!r} model of geometry {stored!r}")
