"""Tiny models the unit tests share: random GPTs of every zoo geometry (the patching
engines' sizes; the edge tests take them in float64 with a larger init), the multiscreen
controls, a learned GPT with large random weights (interop and imports), and the zoo's own
two-layer sizing models."""

from __future__ import annotations

import torch

from headgeom.model import registry, zoo
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT
from headgeom.model.multiscreen import MultiscreenConfig
from tests.weights import large_random_weights

TINY = dict(n_layer=3, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
TINY_ROUTED = dict(n_layer=3, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16)
N_VOCAB = 29


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random trainable weights large enough that every head moves the answer."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 0:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if "ln" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.startswith(("wte", "wpe")):
                p.copy_(noise)
            else:
                p.copy_(0.3 * noise)
    return model.eval()


def zoo_model(
    geometry: str, seed: int = 0, *, init_std: float | None = None, dtype=None
) -> torch.nn.Module:
    """A random model of ``geometry`` at the tiny sizes, weights :func:`perturbed`; the edge
    tests ask for ``init_std=0.5`` and float64."""
    torch.manual_seed(seed)
    arch = dict(TINY_ROUTED if geometry.startswith("write-routed") else TINY)
    if init_std is not None:
        arch["init_std"] = init_std
    model = registry.build_model(zoo.derive_model_config(geometry, arch, {}), N_VOCAB)
    model = perturbed(model, seed)
    return model if dtype is None else model.to(dtype)


def multiscreen_model(geometry: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = MultiscreenConfig(
        n_vocab=N_VOCAB, n_ctx=24, n_layer=3, n_head=4, d_model=32, d_head=8, d_key=4,
        geometry=geometry, window_init_max=8.0, mipe_threshold=16.0,
    )  # fmt: skip
    return registry.build_model(cfg.to_dict()).eval()


#: The GPTs of the geometry, patching, dynamics, interop and import tests (width 32).
LEARNED_VOCAB, L, H, D, DH, M, CTX = 40, 3, 4, 32, 8, 64, 16


def small_gpt(
    geometry: str = "learned",
    seed: int = 0,
    n_vocab: int = LEARNED_VOCAB,
    weights: str = "large",
    **params,
) -> GPT:
    """A width-32 GPT of ``geometry`` whose weights are either ``large``
    (:func:`tests.weights.large_random_weights`: every head and LayerNorm matters) or
    ``normal`` (every parameter drawn from N(0, 0.3²) after the seeded init)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_vocab=n_vocab, n_ctx=CTX, n_layer=L, n_head=H, d_model=D, d_head=DH,
                      d_mlp=M, geometry=geometry, geometry_params=params)  # fmt: skip
    model = GPT(cfg)
    if weights == "large":
        large_random_weights(model)
    elif weights == "normal":
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
    else:
        raise ValueError(f"weights must be 'large' or 'normal', got {weights!r}")
    return model.eval()


def learned_model(seed: int = 0) -> GPT:
    """The learned GPT of the interop and import tests."""
    return small_gpt("learned", seed)


#: The zoo's sizing tests: two layers, where every GPT geometry exists (Kerdock D = 16).
ZOO_TINY = dict(n_layer=2, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
ZOO_TINY_ROUTED = dict(n_layer=2, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16)
V_TINY = 29
GPT_GEOMETRIES = registry.geometry_names("gpt")


def tiny_arch(geometry: str) -> dict:
    return ZOO_TINY_ROUTED if geometry.startswith("write-routed") else ZOO_TINY


def tiny_model(geometry: str, seed: int = 0, **params) -> GPT:
    torch.manual_seed(seed)
    return registry.build_model(
        zoo.derive_model_config(geometry, tiny_arch(geometry), params), V_TINY
    )
