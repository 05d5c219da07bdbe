"""Bring your own model, format ``tl-gpt2``: a TransformerLens HookedTransformer
state dict of the GPT-2 family as the workspace's ``learned`` checkpoint.

The inverse of :func:`headgeom.model.interop.tl_state_dict` (TL names and axes, no folding):
``W_Q, W_K, W_V`` (H, D, d) → our fused ``c_attn`` (3Hd, D); ``W_O`` (H, d, D) → ``c_proj``
(D, Hd); ``W_in`` (D, d_mlp) and ``W_out`` (d_mlp, D) are transposed; ``unembed.W_U`` must
be ``embed.W_E`` transposed and ``unembed.b_U`` zero (our unembedding is tied to ``wte``).
The vocabulary is the full GPT-2 one with identity ids, as for ``hf-gpt2``.

The directory holds the state dict as ``model.safetensors`` — or, only with
``allow_pickle``, as one pickle file (``model.pt``, ``model.pth`` or ``pytorch_model.bin``,
read with ``torch.load(weights_only=True)``) — and optionally ``config.json``: the
``HookedTransformerConfig`` fields (``json.dumps(model.cfg.to_dict(), default=str)``).
Without ``config.json`` the sizes come from the tensor shapes and the rest from GPT-2's
defaults (LayerNorm eps 1e-5, tanh GELU ``gelu_new``, pre-LN "LN", learned absolute
positions, attention scale sqrt(d_head)); the import record lists what was assumed.

TL's non-parameter buffers ``blocks.{l}.attn.mask`` (its causal mask) and
``blocks.{l}.attn.IGNORE`` (the masked-score value), which ``HookedTransformer.state_dict()``
contains, are dropped: our attention is causal by construction. Every other key must be one
of the GPT-2 weights. Refused, with the key and what was expected: another activation or
normalisation (TL's ``from_pretrained`` folds LayerNorm, "LNPre", and centres the weights:
load with ``from_pretrained_no_processing``), other positional embeddings or attention
variants, an untied or biased unembedding, missing or unknown keys, shapes that disagree.

Needs neither transformers nor TransformerLens.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from headgeom.hashing import sha256_file
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT
from headgeom.model.import_errors import ModelImportError

#: Version of the tl-gpt2 conversion below; recorded in every tl-gpt2 import manifest (bump
#: on any change that could change a converted weight).
TL_CONVERSION_VERSION = 1
#: Pickle files a TL state dict may be saved as (``torch.save(model.state_dict(), ...)``).
PICKLE_NAMES = ("model.pt", "model.pth", "pytorch_model.bin")
#: TL buffers that are not weights (dropped; ``HookedTransformer.state_dict()`` holds them).
BUFFERS = ("attn.mask", "attn.IGNORE")
_PROCESSED = (
    "TransformerLens's from_pretrained folds LayerNorm into the weights and centres them; "
    "save HookedTransformer.from_pretrained_no_processing(...) instead (or fold_ln=False, "
    "center_writing_weights=False, center_unembed=False)"
)
_SIZES = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")
# config.json keys whose value must be GPT-2's (TL's default) for our GPT to compute the model
_REQUIRED: dict[str, Any] = {
    "act_fn": "gelu_new",
    "normalization_type": "LN",
    "positional_embedding_type": "standard",
    "use_attn_scale": True,
    "scale_attn_by_inverse_layer_idx": False,
    "attn_only": False,
    "gated_mlp": False,
    "parallel_attn_mlp": False,
    "final_rms": False,
    "uses_rms_norm": False,
    "layer_norm_folding": False,
    "use_local_attn": False,
    "use_qk_norm": False,
    "use_logn_attn": False,
    "post_embedding_ln": False,
    "use_normalization_before_and_after": False,
    "use_attention_sinks": False,
    "attention_dir": "causal",
    "clip_qkv": None,
    "num_experts": None,
    "load_in_4bit": False,
    "use_dynamic_ntk_rope": False,
    "use_NTK_by_parts_rope": False,
    "use_yarn_rope": False,
}
_WHY = {
    "act_fn": "our GPT computes the tanh GELU ('gelu_new') only",
    "normalization_type": "our GPT has pre-LN LayerNorms with weights and biases ('LN')",
    "layer_norm_folding": "LayerNorm was folded into the weights",
    "positional_embedding_type": "our GPT has learned absolute positions (pos_embed.W_pos)",
    "use_attn_scale": "our attention divides scores by sqrt(d_head)",
}
# keys that do not change this architecture's forward pass (hooks, devices, tokenizer, init,
# options of rotary / local / MoE variants that the keys above already exclude)
_IGNORED = frozenset(
    "device dtype model_name tokenizer_name tokenizer_prepends_bos default_prepend_bos "
    "original_architecture from_checkpoint checkpoint_index checkpoint_label_type "
    "checkpoint_value init_mode initializer_range init_weights seed n_devices n_params "
    "use_attn_result use_split_qkv_input use_hook_mlp_in use_attn_in use_hook_tokens "
    "ungroup_grouped_query_attention trust_remote_code quantization_method train_seq_length "
    "window_size experts_per_token norm_topk_prob decoder_start_token_id tie_word_embeddings "
    "relative_attention_max_distance relative_attention_num_buckets rotary_dim rotary_base "
    "rotary_base_local rotary_scaling_factor rotary_adjacent_pairs NTK_by_parts_low_freq_factor "
    "NTK_by_parts_high_freq_factor NTK_by_parts_factor NTK_original_ctx_len yarn_factor "
    "yarn_attention_factor yarn_beta_fast yarn_beta_slow yarn_original_max_position_embeddings "
    "yarn_truncate yarn_global_attn_only".split()
)
_CHECKED = frozenset(
    (*_SIZES, *_REQUIRED, "eps", "attn_scale", "attn_types", "n_key_value_heads", "d_vocab_out")
) | {"attn_scores_soft_cap", "output_logits_soft_cap"}
_LAYER_KEYS = (
    "ln1.w", "ln1.b", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.b_Q", "attn.b_K", "attn.b_V",
    "attn.W_O", "attn.b_O", "ln2.w", "ln2.b", "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out",
)  # fmt: skip
_TOP_KEYS = (
    "embed.W_E", "pos_embed.W_pos", "ln_final.w", "ln_final.b", "unembed.W_U", "unembed.b_U",
)  # fmt: skip


# --------------------------------------------------------------------------- files
def weight_file(directory: str | os.PathLike, allow_pickle: bool = False) -> Path:
    """The state-dict file of a tl-gpt2 directory: ``model.safetensors``, else — only with
    ``allow_pickle`` — the one pickle file (:data:`PICKLE_NAMES`)."""
    root = Path(directory)
    if not root.is_dir():
        raise ModelImportError(
            f"{directory}: not a directory (a TransformerLens state-dict directory needed)"
        )
    if (root / "model.safetensors").exists():
        return root / "model.safetensors"
    pickles = [root / n for n in PICKLE_NAMES if (root / n).exists()]
    if len(pickles) > 1:
        raise ModelImportError(f"{root}: several pickle state dicts {[p.name for p in pickles]}")
    if pickles:
        if not allow_pickle:
            raise ModelImportError(
                f"{root}: only pickle weights ({pickles[0].name}); refused because loading a "
                "pickle can execute arbitrary code. Convert them to model.safetensors, or opt "
                "in with import.allow_pickle: true if you trust the file"
            )
        return pickles[0]
    raise ModelImportError(
        f"{root}: no model.safetensors (the TransformerLens state dict; pickle "
        f"{'/'.join(PICKLE_NAMES)} only with import.allow_pickle)"
    )


def import_files(directory: str | os.PathLike, allow_pickle: bool = False) -> list[Path]:
    """Every file a tl-gpt2 import reads: ``config.json`` (if present) and the weights."""
    root = Path(directory)
    weights = weight_file(root, allow_pickle)
    return [root / "config.json"] * (root / "config.json").exists() + [weights]


def read_tl_config(directory: str | os.PathLike) -> dict[str, Any] | None:
    """``config.json`` of a tl-gpt2 directory (None if absent), every key known."""
    path = Path(directory) / "config.json"
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ModelImportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ModelImportError(f"{path}: not a JSON object of HookedTransformerConfig fields")
    unknown = sorted(set(config) - _CHECKED - _IGNORED)
    if unknown:
        raise ModelImportError(
            f"{path}: HookedTransformerConfig keys this import does not know: {unknown} "
            "(remove them if they hold TransformerLens's default)"
        )
    return config


def _load(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a state-dict file (safetensors, or a pickle read weights-only)."""
    try:
        if file.suffix == ".safetensors":
            state = load_file(str(file))
        else:
            try:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
                state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is named the same way
        raise ModelImportError(f"{file}: not readable weights ({err})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelImportError(f"{file}: not a state dict (name -> tensor)")
    return state


def _shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a state-dict file (a safetensors file's header only)."""
    if file.suffix != ".safetensors":
        return {k: tuple(v.shape) for k, v in _load(file).items()}
    try:
        with safe_open(str(file), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as err:
        raise ModelImportError(f"{file}: not readable weights ({err})") from None


# --------------------------------------------------------------------------- architecture
def _n_layers(keys) -> int:
    layers = {int(m.group(1)) for k in keys if (m := re.match(r"blocks\.(\d+)\.", k))}
    if layers != set(range(len(layers))):
        raise ModelImportError(f"state dict blocks are not 0..L-1: {sorted(layers)}")
    return len(layers)


def _check_keys(shapes: dict[str, tuple[int, ...]], n_layers: int, where: str) -> list[str]:
    """Missing / unknown keys refused; returns the TL buffers present (to be dropped)."""
    expected = [*_TOP_KEYS] + [f"blocks.{i}.{k}" for i in range(n_layers) for k in _LAYER_KEYS]
    buffers = [f"blocks.{i}.{b}" for i in range(n_layers) for b in BUFFERS]
    if n_layers and "blocks.0.ln1.w" not in shapes and "blocks.0.ln1.b" not in shapes:
        raise ModelImportError(
            f"{where}: no blocks.0.ln1.w / ln1.b: LayerNorm weights are folded (normalization "
            f"'LNPre'); {_PROCESSED}"
        )
    if "pos_embed.W_pos" not in shapes:
        raise ModelImportError(
            f"{where}: no pos_embed.W_pos: positional embeddings are not TL's 'standard' "
            "(learned absolute), which is the only kind our GPT has"
        )
    missing = [k for k in expected if k not in shapes]
    if missing:
        raise ModelImportError(f"{where}: state dict lacks {missing[:8]} (a GPT-2 needs all)")
    extra = sorted(set(shapes) - set(expected) - set(buffers))
    if extra:
        raise ModelImportError(
            f"{where}: state dict keys our GPT-2 has no place for: {extra[:8]}"
            f"{' ...' if len(extra) > 8 else ''}"
        )
    return [b for b in buffers if b in shapes]


def _sizes_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    V, D = shapes["embed.W_E"]
    n_heads, _, d_head = shapes["blocks.0.attn.W_Q"]
    return {
        "n_layers": _n_layers(shapes), "d_model": D, "n_heads": n_heads, "d_head": d_head,
        "d_mlp": shapes["blocks.0.mlp.W_in"][1], "d_vocab": V,
        "n_ctx": shapes["pos_embed.W_pos"][0],
    }  # fmt: skip


def _expected_shapes(s: dict[str, int]) -> dict[str, tuple[int, ...]]:
    V, D, H, d, M = s["d_vocab"], s["d_model"], s["n_heads"], s["d_head"], s["d_mlp"]
    per = {
        "ln1.w": (D,), "ln1.b": (D,), "ln2.w": (D,), "ln2.b": (D,),
        "attn.W_Q": (H, D, d), "attn.W_K": (H, D, d), "attn.W_V": (H, D, d),
        "attn.b_Q": (H, d), "attn.b_K": (H, d), "attn.b_V": (H, d),
        "attn.W_O": (H, d, D), "attn.b_O": (D,),
        "mlp.W_in": (D, M), "mlp.b_in": (M,), "mlp.W_out": (M, D), "mlp.b_out": (D,),
    }  # fmt: skip
    out = {
        "embed.W_E": (V, D), "pos_embed.W_pos": (s["n_ctx"], D), "ln_final.w": (D,),
        "ln_final.b": (D,), "unembed.W_U": (D, V), "unembed.b_U": (V,),
    }  # fmt: skip
    for i in range(s["n_layers"]):
        out.update({f"blocks.{i}.{k}": v for k, v in per.items()})
    return out


def architecture(
    config: dict[str, Any] | None, shapes: dict[str, tuple[int, ...]], where: str
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(model config dict, provenance of its values, TL buffers to drop) of a tl-gpt2 state
    dict with tensor ``shapes``, every check done.

    ``config`` is ``config.json`` (or None). Sizes missing from it come from the shapes
    (listed in ``sizes_from_shapes``); every other missing value that matters is GPT-2's
    default, listed with its value in ``assumed``."""
    cfg = dict(config or {})
    assumed: dict[str, Any] = {}
    for key, value in _REQUIRED.items():
        if key not in cfg and key in ("act_fn", "normalization_type", "positional_embedding_type"):
            assumed[key] = value
        got = cfg.get(key, value)
        if got != value:
            hint = _WHY.get(key, "our GPT does not compute it")
            if (key == "normalization_type" and got == "LNPre") or key == "layer_norm_folding":
                hint = f"{hint}; {_PROCESSED}"
            raise ModelImportError(f"{where}: {key} is {got!r}, expected {value!r} ({hint})")
    dropped = _check_keys(shapes, _n_layers(shapes), where)
    if _n_layers(shapes) == 0:
        raise ModelImportError(f"{where}: state dict has no blocks.0.* (no layer)")
    from_shapes = _sizes_from_shapes(shapes)
    sizes, measured = {}, []
    for key in _SIZES:
        if cfg.get(key) is None:
            sizes[key] = from_shapes[key]
            measured.append(key)
        else:
            sizes[key] = cfg[key]
            if not isinstance(sizes[key], int) or isinstance(sizes[key], bool):
                raise ModelImportError(f"{where}: config.json {key} = {cfg[key]!r} is no integer")
    if sizes["n_layers"] != from_shapes["n_layers"]:
        raise ModelImportError(
            f"{where}: config.json n_layers is {sizes['n_layers']}, but the state dict has "
            f"{from_shapes['n_layers']} blocks"
        )
    if "eps" not in cfg:
        assumed["eps"] = 1e-5
    eps = float(cfg.get("eps", 1e-5))
    H, d, D = sizes["n_heads"], sizes["d_head"], sizes["d_model"]
    scale = cfg.get("attn_scale")
    if scale is None:
        assumed["attn_scale"] = math.sqrt(d)  # sqrt(d_head)
    elif not math.isclose(float(scale), math.sqrt(d), rel_tol=1e-9):
        raise ModelImportError(
            f"{where}: attn_scale is {scale!r}, expected sqrt(d_head) = {math.sqrt(d)} (our "
            "attention divides scores by sqrt(d_head))"
        )
    if any(t != "global" for t in cfg.get("attn_types") or ()):
        raise ModelImportError(
            f"{where}: attn_types is {cfg['attn_types']!r}, expected global attention only"
        )
    if cfg.get("n_key_value_heads") not in (None, H):
        raise ModelImportError(
            f"{where}: n_key_value_heads is {cfg['n_key_value_heads']!r}, expected {H} "
            "(n_heads: our GPT has no grouped-query attention)"
        )
    if cfg.get("d_vocab_out") not in (None, -1, sizes["d_vocab"]):
        raise ModelImportError(
            f"{where}: d_vocab_out is {cfg['d_vocab_out']!r}, expected d_vocab "
            f"{sizes['d_vocab']} (our unembedding is tied to the embedding)"
        )
    for key in ("attn_scores_soft_cap", "output_logits_soft_cap"):
        if float(cfg.get(key, -1.0)) > 0:
            raise ModelImportError(
                f"{where}: {key} is {cfg[key]!r}, expected -1.0 (off: our GPT has no soft cap)"
            )
    expected = _expected_shapes(sizes)
    wrong = {k: (shapes[k], v) for k, v in expected.items() if shapes[k] != v}
    if wrong:
        name = next(iter(wrong))
        raise ModelImportError(
            f"{where}: {name} has shape {wrong[name][0]}, expected {wrong[name][1]} from "
            f"{'config.json' if config else 'the other tensors'}"
            + (f" ({len(wrong) - 1} more differ)" if len(wrong) > 1 else "")
        )
    if H * d != D:
        raise ModelImportError(
            f"{where}: n_heads·d_head = {H}·{d} != d_model {D}; our GPT-2 form needs them equal"
        )
    model_cfg = ModelConfig(
        n_vocab=sizes["d_vocab"],
        n_ctx=sizes["n_ctx"],
        n_layer=sizes["n_layers"],
        n_head=H,
        d_model=D,
        d_head=d,
        d_mlp=sizes["d_mlp"],
        geometry="learned",
        ln_eps=eps,
    ).to_dict()
    return model_cfg, {"assumed": assumed, "sizes_from_shapes": measured}, dropped


def model_config(directory: str | os.PathLike, allow_pickle: bool = False) -> dict[str, Any]:
    """The ``learned`` model config of a tl-gpt2 directory (reads config.json and the tensor
    shapes only: cheap enough for the workflow to call when it builds the DAG)."""
    root = Path(directory)
    file = weight_file(root, allow_pickle)
    return architecture(read_tl_config(root), _shapes(file), str(root))[0]


# --------------------------------------------------------------------------- conversion
def convert_state_dict(tl: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """TL GPT-2 weights (checked keys and shapes) → our names and axes."""
    w = {k: v.to(torch.float32) for k, v in tl.items()}
    if not torch.equal(w["unembed.W_U"], w["embed.W_E"].T):
        raise ModelImportError(
            f"unembed.W_U is not embed.W_E transposed: our unembedding is tied to the "
            f"embedding (GPT-2's is). {_PROCESSED}"
        )
    if torch.count_nonzero(w["unembed.b_U"]):
        raise ModelImportError(
            "unembed.b_U is not zero: our unembedding has no bias (GPT-2's has none)"
        )
    out = {"wte.weight": w["embed.W_E"], "wpe.weight": w["pos_embed.W_pos"]}
    for i in range(n_layers):
        tl_, ours = f"blocks.{i}.", f"blocks.{i}."
        H, D, d = w[f"{tl_}attn.W_Q"].shape
        out[f"{ours}attn.reader.ln_1.weight"] = w[f"{tl_}ln1.w"]
        out[f"{ours}attn.reader.ln_1.bias"] = w[f"{tl_}ln1.b"]
        out[f"{ours}attn.reader.c_attn.weight"] = torch.cat(
            [w[f"{tl_}attn.W_{X}"].transpose(1, 2).reshape(H * d, D) for X in "QKV"]
        )  # (3Hd, D): rows q | k | v, head-major
        out[f"{ours}attn.reader.c_attn.bias"] = torch.cat(
            [w[f"{tl_}attn.b_{X}"].reshape(H * d) for X in "QKV"]
        )
        out[f"{ours}attn.writer.c_proj.weight"] = (
            w[f"{tl_}attn.W_O"].permute(2, 0, 1).reshape(D, H * d)
        )
        out[f"{ours}attn.writer.c_proj.bias"] = w[f"{tl_}attn.b_O"]
        out[f"{ours}ln_2.weight"] = w[f"{tl_}ln2.w"]
        out[f"{ours}ln_2.bias"] = w[f"{tl_}ln2.b"]
        out[f"{ours}mlp.c_fc.weight"] = w[f"{tl_}mlp.W_in"].T
        out[f"{ours}mlp.c_fc.bias"] = w[f"{tl_}mlp.b_in"]
        out[f"{ours}mlp.c_proj.weight"] = w[f"{tl_}mlp.W_out"].T
        out[f"{ours}mlp.c_proj.bias"] = w[f"{tl_}mlp.b_out"]
    out["ln_f.weight"], out["ln_f.bias"] = w["ln_final.w"], w["ln_final.b"]
    return {k: v.contiguous() for k, v in out.items()}


def import_tl_gpt2(
    directory: str | os.PathLike, allow_pickle: bool = False
) -> tuple[GPT, np.ndarray, dict[str, Any]]:
    """(model, identity GPT-2 vocabulary, import record) of a tl-gpt2 directory.

    The record holds ``format``, ``conversion_version``, ``tl_config`` (config.json or
    None), ``assumed`` (GPT-2 defaults used for values config.json does not give),
    ``sizes_from_shapes`` (sizes read from the tensor shapes), ``dropped_buffers`` (TL's
    mask / IGNORE buffers found), ``files_sha256`` (file name → SHA-256 of every file
    read) and ``pickle``."""
    root = Path(directory)
    files = import_files(root, allow_pickle)
    config, weights = read_tl_config(root), files[-1]
    state = _load(weights)
    model_cfg, origin, dropped = architecture(
        config, {k: tuple(v.shape) for k, v in state.items()}, str(root)
    )
    cfg = ModelConfig.from_dict(model_cfg)
    try:
        converted = convert_state_dict(
            {k: v for k, v in state.items() if k not in dropped}, cfg.n_layer
        )
    except ModelImportError as err:
        raise ModelImportError(f"{weights}: {err}") from None
    model = GPT(cfg)
    model.load_state_dict(converted, strict=True)
    record = {
        "format": "tl-gpt2",
        "conversion_version": TL_CONVERSION_VERSION,
        "tl_config": config,
        **origin,
        "dropped_buffers": dropped,
        "files_sha256": {f.name: sha256_file(f) for f in files},
        "pickle": weights.suffix != ".safetensors",
    }
    return model.eval(), np.arange(cfg.n_vocab, dtype=np.int64), record
