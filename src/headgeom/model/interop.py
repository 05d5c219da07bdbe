"""A `learned` checkpoint as a Hugging Face ``GPT2LMHeadModel`` or a TransformerLens
``HookedTransformer``, so researchers can cross-check our numbers with their own tools.

Only the ``learned`` geometry has GPT-2's exact parameterisation (shared LN_1 → fused
W_{Q,K,V}, learned W_O with b_O, tanh-GELU MLP, tied unembedding); every other geometry
(frozen writes, block readers, value adapters, routed heads, multiscreen) has no faithful
GPT-2 form and is refused with an error that says so.

* :func:`export_hf` writes a ``transformers`` model directory (``config.json`` +
  ``model.safetensors``) without importing ``transformers``: the vocabulary is the
  checkpoint's *model* vocabulary (compact ids); ``headgeom.json`` beside them maps model
  id i to GPT-2 id ``gpt2_ids[i]`` and names the checkpoint it came from.
* :func:`to_transformer_lens` builds a TransformerLens 3.9 ``HookedTransformer`` from a
  ``HookedTransformerConfig`` and loads our weights with plain ``load_state_dict``: no
  LayerNorm folding, no W_O/writing-weight centring, no unembedding centring, no
  refactoring of factored attention matrices (those change the read subspaces the study
  measures). TransformerLens and transformers are dev/benchmark dependencies only; they
  are imported inside the functions that need them, never by the study's code path.

Weight layouts (D = d_model, H heads of width d, ours → GPT-2 (Conv1D: x @ W) / TL):
``c_attn.weight`` (3Hd, D) → ``c_attn.weight`` (D, 3Hd) / ``W_Q,W_K,W_V`` (H, D, d);
``c_proj.weight`` (D, Hd) → (Hd, D) / ``W_O`` (H, d, D); MLP weights are transposed;
``wte`` (V, D) is both the embedding and (transposed) the unembedding ``W_U`` (D, V).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import save_file

from headgeom.hashing import canonical_json
from headgeom.model import registry
from headgeom.model.gpt import GPT

if TYPE_CHECKING:  # dev-only peers
    from transformer_lens import HookedTransformer  # optional: the [dev] extra
    from transformers import GPT2LMHeadModel

GPT2_EOT_ID = 50256  # <|endoftext|>


def require_learned(model: torch.nn.Module, where: str = "model") -> None:
    """Refuse any model whose geometry has no GPT-2 form (the registry's ``gpt2_form``:
    only ``learned``, free readers and a learned W_O)."""
    arch = registry.architecture_of(model)
    if arch is None or not registry.geometry_of(model.cfg).gpt2_form:
        what = (
            f"geometry {model.cfg.geometry!r} (architecture {arch.name!r})"
            if arch is not None
            else f"model type {type(model).__name__!r}"
        )
        raise ValueError(
            f"{where}: {what} cannot be exported to "
            "GPT-2 / TransformerLens; only the 'learned' geometry has GPT-2's parameterisation "
            "(frozen writes, block readers, value adapters, routed and multiscreen models have "
            "no faithful GPT-2 form)"
        )
    cfg = model.cfg
    if cfg.n_head * cfg.d_head != cfg.d_model:
        raise ValueError(
            f"{where}: GPT-2 needs n_head·d_head == d_model, got {cfg.n_head}·{cfg.d_head} "
            f"!= {cfg.d_model}"
        )


def _weights(model: GPT) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- transformers
def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under ``GPT2LMHeadModel`` names (the tied ``lm_head`` is omitted)."""
    require_learned(model)
    w = _weights(model)
    out = {"transformer.wte.weight": w["wte.weight"], "transformer.wpe.weight": w["wpe.weight"]}
    for layer in range(model.cfg.n_layer):
        ours, hf = f"blocks.{layer}.", f"transformer.h.{layer}."
        for name, key, transpose in (
            ("ln_1", "attn.reader.ln_1", False),
            ("attn.c_attn", "attn.reader.c_attn", True),
            ("attn.c_proj", "attn.writer.c_proj", True),
            ("ln_2", "ln_2", False),
            ("mlp.c_fc", "mlp.c_fc", True),
            ("mlp.c_proj", "mlp.c_proj", True),
        ):
            weight = w[f"{ours}{key}.weight"]
            out[f"{hf}{name}.weight"] = weight.T if transpose else weight  # Conv1D: (in, out)
            out[f"{hf}{name}.bias"] = w[f"{ours}{key}.bias"]
    out["transformer.ln_f.weight"] = w["ln_f.weight"]
    out["transformer.ln_f.bias"] = w["ln_f.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(model: GPT, vocab: np.ndarray) -> dict[str, Any]:
    """``config.json`` of the ``GPT2LMHeadModel`` equal to ``model`` (dropout 0, tanh GELU,
    tied unembedding, vocabulary = the model's compact vocabulary)."""
    require_learned(model)
    cfg = model.cfg
    eot = np.flatnonzero(np.asarray(vocab) == GPT2_EOT_ID)
    eot_id = int(eot[0]) if len(eot) else None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.n_vocab,
        "n_positions": cfg.n_ctx,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.d_mlp,
        "activation_function": "gelu_new",  # the tanh approximation (docs §4.1)
        "layer_norm_epsilon": cfg.ln_eps,
        "initializer_range": cfg.init_std,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def export_hf(
    model: GPT,
    vocab: np.ndarray,
    out_dir: str | os.PathLike,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write ``out_dir`` = {config.json, model.safetensors, headgeom.json} for
    ``GPT2LMHeadModel.from_pretrained(out_dir)``.

    The directory appears complete or not at all: it is written under a temporary name
    beside ``out_dir`` and renamed (an existing ``out_dir`` is replaced). ``headgeom.json``
    holds ``gpt2_ids`` (model id → GPT-2 id) and ``provenance`` (e.g. checkpoint and
    manifest hashes).
    """
    require_learned(model, str(out_dir))
    vocab = np.asarray(vocab, dtype=np.int64)
    if vocab.shape != (model.cfg.n_vocab,):
        raise ValueError(
            f"{out_dir}: vocabulary map has shape {vocab.shape}, the model has "
            f"{model.cfg.n_vocab} ids"
        )
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = json.dumps(hf_config(model, vocab), indent=2, sort_keys=True) + "\n"
        (tmp / "config.json").write_text(config, encoding="utf-8")
        record = {"gpt2_ids": vocab.tolist(), "provenance": provenance or {}}
        (tmp / "headgeom.json").write_bytes(canonical_json(record))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            f.chmod(0o644)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def to_hf(model: GPT, vocab: np.ndarray | None = None) -> GPT2LMHeadModel:
    """The in-memory ``GPT2LMHeadModel`` (eval, fp32) equal to ``model`` (needs transformers)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # optional: the [hf] extra

    vocab = np.arange(model.cfg.n_vocab) if vocab is None else vocab
    config = {k: v for k, v in hf_config(model, vocab).items() if k != "architectures"}
    hf = GPT2LMHeadModel(GPT2Config(**config))
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"GPT-2 weight names do not match: {missing=} {unexpected=}")
    hf.tie_weights()
    return hf.eval()


# --------------------------------------------------------------------------- TransformerLens
def tl_config(model: GPT):
    """The ``HookedTransformerConfig`` of ``model``: pre-LN ("LN", not the folded "LNPre"),
    learned absolute positions, tanh GELU ("gelu_new"), attention scale sqrt(d_head)."""
    from transformer_lens import HookedTransformerConfig  # optional: the [dev] extra

    require_learned(model)
    cfg = model.cfg
    return HookedTransformerConfig(
        n_layers=cfg.n_layer,
        d_model=cfg.d_model,
        n_ctx=cfg.n_ctx,
        d_head=cfg.d_head,
        n_heads=cfg.n_head,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.n_vocab,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=cfg.ln_eps,
        positional_embedding_type="standard",
        default_prepend_bos=False,
        original_architecture="GPT2LMHeadModel",
        device="cpu",
        dtype=torch.float32,
    )


def tl_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under HookedTransformer names and axes (no folding or centring)."""
    require_learned(model)
    cfg = model.cfg
    H, d, D = cfg.n_head, cfg.d_head, cfg.d_model
    w = _weights(model)
    out = {
        "embed.W_E": w["wte.weight"],
        "pos_embed.W_pos": w["wpe.weight"],
        "ln_final.w": w["ln_f.weight"],
        "ln_final.b": w["ln_f.bias"],
        "unembed.W_U": w["wte.weight"].T,
        "unembed.b_U": torch.zeros(cfg.n_vocab),
    }
    for layer in range(cfg.n_layer):
        ours, tl = f"blocks.{layer}.", f"blocks.{layer}."
        qkv_w = w[f"{ours}attn.reader.c_attn.weight"].view(3, H, d, D)
        qkv_b = w[f"{ours}attn.reader.c_attn.bias"].view(3, H, d)
        for i, X in enumerate("QKV"):
            out[f"{tl}attn.W_{X}"] = qkv_w[i].transpose(1, 2)  # (H, D, d)
            out[f"{tl}attn.b_{X}"] = qkv_b[i]
        out[f"{tl}attn.W_O"] = w[f"{ours}attn.writer.c_proj.weight"].view(D, H, d).permute(1, 2, 0)
        out[f"{tl}attn.b_O"] = w[f"{ours}attn.writer.c_proj.bias"]
        out[f"{tl}ln1.w"] = w[f"{ours}attn.reader.ln_1.weight"]
        out[f"{tl}ln1.b"] = w[f"{ours}attn.reader.ln_1.bias"]
        out[f"{tl}ln2.w"] = w[f"{ours}ln_2.weight"]
        out[f"{tl}ln2.b"] = w[f"{ours}ln_2.bias"]
        out[f"{tl}mlp.W_in"] = w[f"{ours}mlp.c_fc.weight"].T
        out[f"{tl}mlp.b_in"] = w[f"{ours}mlp.c_fc.bias"]
        out[f"{tl}mlp.W_out"] = w[f"{ours}mlp.c_proj.weight"].T
        out[f"{tl}mlp.b_out"] = w[f"{ours}mlp.c_proj.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def to_transformer_lens(model: GPT) -> HookedTransformer:
    """A TransformerLens ``HookedTransformer`` equal to ``model`` (eval, fp32, CPU), built
    from :func:`tl_config` and loaded with plain ``load_state_dict`` (strict: every weight
    name must match; TL's own buffers are kept)."""
    from transformer_lens import HookedTransformer  # optional: the [dev] extra

    with warnings.catch_warnings():  # 3.9 announces HookedTransformer's removal in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        tl = HookedTransformer(tl_config(model))
    state = tl.state_dict()
    weights = tl_state_dict(model)
    unknown = set(weights) - set(state)
    if unknown:
        raise RuntimeError(f"TransformerLens has no parameters {sorted(unknown)}")
    state.update(weights)
    tl.load_state_dict(state, strict=True)
    return tl.eval()
