"""Bring your own model: a ``transformers`` GPT2LMHeadModel directory as the
workspace's ``learned`` checkpoint, so every analysis runs on it unchanged.

The inverse of :func:`headgeom.model.interop.hf_state_dict`: GPT-2's Conv1D weights
(in, out) are transposed to our (out, in); the tied ``lm_head`` is dropped (our
unembedding is ``wte``). The vocabulary is GPT-2's own, in full (identity map, no
compaction): the task datasets are already GPT-2 ids.

* Weights are read from ``model.safetensors`` (or the shards named by
  ``model.safetensors.index.json``). Pickle-only weights (``pytorch_model.bin``) are
  refused unless the caller opts in with ``allow_pickle=True``: unpickling a file can run
  arbitrary code. With the opt-in they are read with ``torch.load(weights_only=True)``.
* A directory that is not a GPT-2 model is refused with an error naming what is missing
  or different (a file, ``model_type``, a config key, an activation our model lacks).

Format ``tl-gpt2`` (a TransformerLens HookedTransformer state dict) is converted by
:mod:`headgeom.model.importing_tl`; the causal-LM formats (``hf-causal-lm``, ``gguf``,
``hub``: any registered ``transformers`` causal LM, kept as itself) are
:mod:`headgeom.model.causal_import`'s. :func:`import_inputs` and
:func:`imported_model_config` dispatch on the format; :func:`import_model` reads the GPT-2
formats.

Needs neither transformers nor TransformerLens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from headgeom.hashing import sha256_file
from headgeom.model import causal_import, facts, importing_tl
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT
from headgeom.model.import_errors import ModelImportError
from headgeom.model.weight_files import weight_files

#: Version of the hf-gpt2 conversion below; recorded in every hf-gpt2 import manifest (bump
#: on any change that could change a converted weight; tl-gpt2 has its own,
#: ``importing_tl.TL_CONVERSION_VERSION``).
CONVERSION_VERSION = 1
#: Formats :func:`import_model` reads (converted to our GPT).
GPT2_FORMATS = ("hf-gpt2", "tl-gpt2")
#: Formats of any registered causal LM (``headgeom.model.causal_import.FORMATS``: imported
#: there, through ``headgeom.model.sources``).
CAUSAL_LM_FORMATS = facts.CAUSAL_LM_FORMATS
#: Every import format.
FORMATS = (*GPT2_FORMATS, *CAUSAL_LM_FORMATS)
GPT2_VOCAB_SIZE = 50257
_REQUIRED_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")
# GPT-2 keys whose non-default value our model does not compute
_UNSUPPORTED = {
    "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True,
    "add_cross_attention": False,
}
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
_OURS = {
    "ln_1": "attn.reader.ln_1",
    "attn.c_attn": "attn.reader.c_attn",
    "attn.c_proj": "attn.writer.c_proj",
    "ln_2": "ln_2",
    "mlp.c_fc": "mlp.c_fc",
    "mlp.c_proj": "mlp.c_proj",
}


def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of a GPT-2 directory, checked: model_type gpt2 and every size key."""
    path = Path(directory) / "config.json"
    if not Path(directory).is_dir():
        raise ModelImportError(f"{directory}: not a directory (a GPT2LMHeadModel directory needed)")
    if not path.exists():
        raise ModelImportError(f"{directory}: no config.json (not a transformers model directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ModelImportError(f"{path}: not valid JSON ({err})") from None
    if config.get("model_type") != "gpt2":
        raise ModelImportError(
            f"{path}: model_type is {config.get('model_type')!r}, not 'gpt2'; only GPT-2 "
            "models (GPT2LMHeadModel) can be imported"
        )
    missing = [k for k in _REQUIRED_KEYS if k not in config]
    if missing:
        raise ModelImportError(f"{path}: GPT-2 config lacks {', '.join(missing)}")
    act = config.get("activation_function", "gelu_new")
    if act != "gelu_new":
        raise ModelImportError(
            f"{path}: activation_function is {act!r}; our GPT computes the tanh GELU "
            "('gelu_new') only"
        )
    for key, default in _UNSUPPORTED.items():
        if config.get(key, default) != default:
            raise ModelImportError(
                f"{path}: {key} = {config[key]!r} is not supported (needs {default})"
            )
    if config.get("tie_word_embeddings", True) is not True:
        raise ModelImportError(f"{path}: tie_word_embeddings is false; our GPT ties W_U to W_E")
    if config["n_embd"] % config["n_head"]:
        raise ModelImportError(
            f"{path}: n_embd {config['n_embd']} is not a multiple of n_head {config['n_head']}"
        )
    return config


def model_config(config: dict[str, Any]) -> dict[str, Any]:
    """The ``learned`` model config (ModelConfig.to_dict) of a checked GPT-2 config."""
    d_model, n_head = int(config["n_embd"]), int(config["n_head"])
    return ModelConfig(
        n_vocab=int(config["vocab_size"]),
        n_ctx=int(config["n_positions"]),
        n_layer=int(config["n_layer"]),
        n_head=n_head,
        d_model=d_model,
        d_head=d_model // n_head,
        d_mlp=int(config.get("n_inner") or 4 * d_model),
        geometry="learned",
        ln_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        init_std=float(config.get("initializer_range", 0.02)),
    ).to_dict()


def _read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if f.name.endswith(".index.json"):
            continue
        try:
            if f.suffix == ".bin":
                out.update(torch.load(f, map_location="cpu", weights_only=True))
            else:
                out.update(load_file(str(f)))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ModelImportError(f"{f}: not readable weights ({err})") from None
    return out


def convert_state_dict(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel weights (with or without the ``transformer.`` prefix) → our names."""
    w = {k.removeprefix("transformer."): v.to(torch.float32) for k, v in hf.items()}

    def take(name: str) -> torch.Tensor:
        if name not in w:
            raise ModelImportError(f"weights lack GPT-2 tensor {name!r}")
        return w[name]

    out = {"wte.weight": take("wte.weight"), "wpe.weight": take("wpe.weight")}
    for layer in range(cfg.n_layer):
        for hf_name, ours in _OURS.items():
            weight = take(f"h.{layer}.{hf_name}.weight")
            out[f"blocks.{layer}.{ours}.weight"] = weight.T if hf_name in _CONV1D else weight
            out[f"blocks.{layer}.{ours}.bias"] = take(f"h.{layer}.{hf_name}.bias")
    out["ln_f.weight"], out["ln_f.bias"] = take("ln_f.weight"), take("ln_f.bias")
    if "lm_head.weight" in w and not torch.equal(w["lm_head.weight"], out["wte.weight"]):
        raise ModelImportError("lm_head.weight differs from wte.weight; our GPT ties W_U to W_E")
    return {k: v.contiguous() for k, v in out.items()}


def import_hf_gpt2(
    directory: str | os.PathLike, allow_pickle: bool = False
) -> tuple[GPT, np.ndarray, dict[str, Any]]:
    """(model, identity GPT-2 vocabulary, import record) of a GPT2LMHeadModel directory.

    The record holds ``format``, ``conversion_version``, ``hf_config`` and
    ``files_sha256`` (file name → SHA-256 of every file read)."""
    root = Path(directory)
    hf_config = read_hf_config(root)
    files = [root / "config.json", *weight_files(root, allow_pickle)]
    cfg = ModelConfig.from_dict(model_config(hf_config))
    model = GPT(cfg)
    state = convert_state_dict(_read_weights(files[1:]), cfg)
    expected = model.state_dict()
    wrong = {
        k: (tuple(v.shape), tuple(expected[k].shape))
        for k, v in state.items()
        if v.shape != expected[k].shape
    }
    if wrong:
        raise ModelImportError(f"{root}: tensor shapes differ from config.json's: {wrong}")
    model.load_state_dict(state, strict=True)
    record = {
        "format": "hf-gpt2",
        "conversion_version": CONVERSION_VERSION,
        "hf_config": hf_config,
        "files_sha256": {f.name: sha256_file(f) for f in files},
        "pickle": files[-1].suffix == ".bin",
    }
    return model.eval(), np.arange(cfg.n_vocab, dtype=np.int64), record


def _known(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ModelImportError(f"import format {fmt!r} is not known; known: {', '.join(FORMATS)}")


def import_model(
    fmt: str, directory: str | os.PathLike, allow_pickle: bool = False
) -> tuple[GPT, np.ndarray, dict[str, Any]]:
    """Dispatch on ``fmt`` (:data:`GPT2_FORMATS`; the causal-LM formats are imported by
    ``headgeom.model.causal_import.import_causal_lm``)."""
    _known(fmt)
    if fmt in CAUSAL_LM_FORMATS:
        raise ModelImportError(f"import format {fmt!r} is a causal-LM format (causal_import)")
    if fmt == "tl-gpt2":
        return importing_tl.import_tl_gpt2(directory, allow_pickle)
    return import_hf_gpt2(directory, allow_pickle)


def import_inputs(
    directory: str | os.PathLike | None,
    allow_pickle: bool = False,
    fmt: str = "hf-gpt2",
    spec: dict[str, Any] | None = None,
) -> list[str]:
    """The files an import of format ``fmt`` reads (its config.json and the weights), for
    the workflow's inputs; a causal-LM format reads its whole import block ``spec``."""
    _known(fmt)
    if fmt in CAUSAL_LM_FORMATS:
        return causal_import.import_files(spec or {"format": fmt, "path": directory})
    root = Path(directory)
    if fmt == "tl-gpt2":
        return [str(f) for f in importing_tl.import_files(root, allow_pickle)]
    read_hf_config(root)
    return [str(root / "config.json"), *map(str, weight_files(root, allow_pickle))]


def imported_model_config(
    fmt: str,
    directory: str | os.PathLike | None,
    allow_pickle: bool = False,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``learned`` model config (ModelConfig.to_dict) an import of ``fmt`` will give,
    from the directory's config and (tl-gpt2) tensor shapes, without converting weights;
    for a causal-LM format, its ``hf-causal-lm`` config from the import block ``spec``."""
    _known(fmt)
    if fmt in CAUSAL_LM_FORMATS:
        return causal_import.model_config(spec or {"format": fmt, "path": directory})
    if fmt == "tl-gpt2":
        return importing_tl.model_config(directory, allow_pickle)
    config = read_hf_config(directory)
    weight_files(directory, allow_pickle)
    return model_config(config)
