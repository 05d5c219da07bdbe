"""Imports of any registered ``transformers`` causal LM (``models.<m>.import`` formats
``hf-causal-lm``, ``gguf``, ``hub``) through :mod:`headgeom.model.sources`.

Where ``hf-gpt2``/``tl-gpt2`` convert GPT-2 weights into our own ``learned`` GPT, these keep
the ``transformers`` model itself (:class:`headgeom.model.hf.HFCausalLM`, architecture
``hf-causal-lm`` of the registry), so its checkpoint holds the model's own tensors (float32,
dequantised for a GGUF file) and a model config whose ``hf_config`` rebuilds it
(``registry.build_model``). The vocabulary is the model's own (identity map): the task files
of such a study are built with its tokenizer (``Study.task_tokenizer``).

* ``hf-causal-lm`` — ``path``: a local ``transformers`` directory (config.json, safetensors;
  pickle only with ``allow_pickle``);
* ``gguf`` — ``path``: a ``.gguf`` file (needs the ``gguf`` package);
* ``hub`` — ``repo_id`` and a pinned 40-hex ``revision``: needs network (or the model in the
  local Hub cache); offline it fails saying so. Its files cannot be listed before the
  download, so the workflow cannot track their mtimes (the manifest still holds their hashes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from headgeom.data.tokenizer import load_gpt2_tokenizer
from headgeom.model import facts
from headgeom.model.hf import HFCausalLM, HFModelConfig
from headgeom.model.import_errors import ModelImportError
from headgeom.model.sources import TOKENIZER_FILES, ModelSource, load_source
from headgeom.model.weight_files import weight_files
from headgeom.optional import require

#: import format (``facts.CAUSAL_LM_FORMATS``) -> model source kind
SOURCE_KINDS = dict(zip(facts.CAUSAL_LM_FORMATS, ("directory", "gguf", "hub"), strict=True))
FORMATS = tuple(SOURCE_KINDS)
#: Version of this import (bump on any change that could change an imported tensor); the
#: conversion itself (casting, dequantising) is ``transformers``', named in the source record.
CONVERSION_VERSION = 1


def source_of(spec: Mapping[str, Any]) -> ModelSource:
    """The model source an import block (format, path [+ package] | repo_id + revision,
    allow_pickle) names; a key the format does not take is refused, named."""
    fmt = spec["format"]
    if fmt not in SOURCE_KINDS:
        raise ModelImportError(f"import format {fmt!r} is not a causal-LM format ({FORMATS})")
    keys = ("repo_id", "revision") if fmt == "hub" else ("path",)
    takes = keys if fmt == "hub" else (*keys, "package")  # a file inside an installed package
    stray = [k for k in ("path", "repo_id", "revision", "package") if k in spec and k not in takes]
    if stray:
        raise ModelImportError(
            f"import format {fmt} takes {' and '.join(takes)}, not {', '.join(stray)}"
        )
    missing = [k for k in keys if not spec.get(k)]
    if missing:
        raise ModelImportError(f"import format {fmt} needs {' and '.join(missing)}")
    return ModelSource(
        kind=SOURCE_KINDS[fmt],
        allow_pickle=bool(spec.get("allow_pickle", False)),
        package=spec.get("package"),
        **{k: str(spec[k]) for k in keys},
    )


def _read_config(source: ModelSource) -> Any:
    """The ``transformers`` config of a local source (config.json, or the GGUF metadata)."""
    transformers = require("transformers", f"a {source.kind} model source")
    path = source.location
    if source.kind == "gguf":
        require("gguf", "a gguf model source")
        if not path.is_file():
            raise ModelImportError(f"{path}: no such GGUF file")
        return transformers.AutoConfig.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True
        )
    if not (path / "config.json").is_file():
        raise ModelImportError(f"{path}: no config.json (not a transformers model directory)")
    return transformers.AutoConfig.from_pretrained(path, local_files_only=True)


def model_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ``hf-causal-lm`` model config (HFModelConfig.to_dict) an import will give, from the
    source's config alone (no weight is read; an unsupported family is refused here)."""
    source = source_of(spec)
    if source.kind == "hub":
        raise ModelImportError(
            f"import format hub ({source.repo_id}@{source.revision}): its config is read "
            "after the download, which needs network; use hf-causal-lm with a local "
            "directory (e.g. the Hub snapshot) to run offline"
        )
    return _portable(HFModelConfig.from_hf(_read_config(source)).to_dict())


def _portable(cfg: dict[str, Any]) -> dict[str, Any]:
    """The model config without ``transformers``' record of where it was read from
    (``_name_or_path``), which would tie the run config to a path."""
    return {**cfg, "hf_config": {k: v for k, v in cfg["hf_config"].items() if k != "_name_or_path"}}


def context_length(model_cfg: Mapping[str, Any]) -> int | None:
    """The longest context of an ``hf-causal-lm`` model config (``max_position_embeddings``,
    GPT-2's ``n_positions``); None when the config names none."""
    hf = model_cfg["hf_config"]
    value = hf.get("max_position_embeddings", hf.get("n_positions"))
    return None if value is None else int(value)


def import_files(spec: Mapping[str, Any]) -> list[str]:
    """The local files an import reads, for the workflow's inputs (config, weights and
    tokenizer files of a directory; the GGUF file); none for a Hub source."""
    source = source_of(spec)
    if source.kind == "hub":
        return []
    if source.kind == "gguf":
        return [str(source.location)]
    root = source.location
    _read_config(source)
    weights = weight_files(root, source.allow_pickle)
    tokenizer = [root / n for n in TOKENIZER_FILES if (root / n).exists()]  # hashed, too
    return [str(p) for p in (root / "config.json", *weights, *tokenizer)]


def import_causal_lm(
    spec: Mapping[str, Any],
    expected_sha256: Mapping[str, str] | None = None,
    where: str = "the source record",
) -> tuple[HFCausalLM, np.ndarray, dict[str, Any], Any]:
    """(model, identity vocabulary, import record, tokenizer or None) of an import block;
    with ``expected_sha256`` (file name -> SHA-256) every file is refused before it is read
    unless its bytes hash so (``where`` names the record in the error).

    The record holds ``format``, ``conversion_version``, ``files_sha256`` and ``pickle`` (as
    the GPT-2 imports' do) and ``source``: the full source record of
    :func:`headgeom.model.sources.load_source` (kind, path or id + revision, hashes, family,
    model_type, conversion, versions)."""
    model, tokenizer, source = load_source(source_of(spec), expected_sha256, where)
    model.cfg = HFModelConfig.from_dict(_portable(model.cfg.to_dict()))
    record = {
        "format": spec["format"],
        "conversion_version": CONVERSION_VERSION,
        "files_sha256": source["files_sha256"],
        "pickle": source["pickle"],
        "source": source,
    }
    return model, np.arange(model.cfg.n_vocab, dtype=np.int64), record, tokenizer


def retokenize(gpt2_ids: np.ndarray, tokenizer: Any) -> np.ndarray:
    """The study's validation text (stored as GPT-2 ids) in the model's own ids: GPT-2's
    byte-level BPE decodes to the exact text, which the model's tokenizer encodes."""
    text = load_gpt2_tokenizer().decode(np.asarray(gpt2_ids, dtype=np.int64).tolist())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)
