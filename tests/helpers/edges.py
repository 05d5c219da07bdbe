"""The edge tests' reference: an independent naive float64 edge KL through the model's named
sites, the float32 rounding floor derived from eps and the logit scale, and the exactness
bound the engine is held to (docs §15.1); the edge tests' models."""

from __future__ import annotations

import copy

import numpy as np
import torch
from scipy.special import rel_entr

from headgeom.heads.analysis import edges as E
from headgeom.model import registry
from tests.helpers.models import zoo_model

#: Every geometry of an architecture with Q/K/V readers and the KV-prefix forward.
EDGE_GEOMETRIES = sorted(
    g
    for arch in registry.ARCHITECTURES.values()
    if arch.edge_patching
    for g in registry.geometry_names(arch.name)
)


def edge_model(geometry: str, seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    """A tiny random model for the edge tests: float64 by default, init_std 0.5."""
    return zoo_model(geometry, seed, init_std=0.5, dtype=dtype)


def _softmax(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), -1).numpy()


@torch.no_grad()
def naive_edge_kl(model, clean_ids, ref_ids, edges: E.Edges):
    """(KL, S) (N, E) in float64 by the definition, through the model's named sites only:
    δ_i = (attention output with writer i's z from the reference) − (clean attention output);
    the reader's q/k/v on x + δ_i are read off a forward whose ``hook_resid_pre`` at l' is
    replaced by x + δ_i; then a clean forward with head h' of ``attn.hook_{x}`` at l' set to
    that value. KL = Σ rel_entr(p, q) of the softmax probabilities (scipy).
    S = ‖q − p‖₁ + Σ_v p_v |log(p_v/q_v) − KL| is the KL's first-order sensitivity to
    logit errors (for the float32 floor)."""
    model = copy.deepcopy(model).double()
    L = model.cfg.n_layer
    kl = np.full((len(clean_ids), len(edges)), np.nan)
    sens = np.full_like(kl, np.nan)
    lengths = np.array([len(c) for c in clean_ids])
    for T in np.unique(lengths):
        rows = np.flatnonzero(lengths == T)
        clean = torch.as_tensor(np.stack([clean_ids[i] for i in rows]))
        ref = torch.as_tensor(np.stack([ref_ids[i] for i in rows]))
        names = [
            f"blocks.{lay}.{s}" for lay in range(L) for s in ("hook_resid_pre", "hook_attn_out")
        ]
        logits, cc = model.run_with_cache(clean, names, last_only=True)
        p = _softmax(logits)
        _, rc = model.run_with_cache(ref, [f"blocks.{lay}.attn.hook_z" for lay in range(L)])
        deltas, reads = {}, {}
        for n, (wl, wh, rl, rh, x) in enumerate(
            zip(*(a.tolist() for a in edges.arrays()), strict=True)
        ):
            if (wl, wh) not in deltas:

                def from_ref(z, wl=wl, wh=wh, rc=rc):
                    z = z.clone()
                    z[:, :, wh] = rc[f"blocks.{wl}.attn.hook_z"][:, :, wh]
                    return z

                out = f"blocks.{wl}.hook_attn_out"
                with model.hooks({f"blocks.{wl}.attn.hook_z": from_ref}):
                    _, c2 = model.run_with_cache(clean, [out])
                deltas[(wl, wh)] = c2[out] - cc[out]
            if (wl, wh, rl) not in reads:
                moved = cc[f"blocks.{rl}.hook_resid_pre"] + deltas[(wl, wh)]
                qkv = [f"blocks.{rl}.attn.hook_{s}" for s in "qkv"]
                with model.hooks({f"blocks.{rl}.hook_resid_pre": lambda t, m=moved: m}):
                    _, c3 = model.run_with_cache(clean, qkv)
                reads[(wl, wh, rl)] = [c3[s] for s in qkv]
            value = reads[(wl, wh, rl)][x]

            def swap(t, value=value, rh=rh):
                t = t.clone()
                t[:, :, rh] = value[:, :, rh]
                return t

            with model.hooks({f"blocks.{rl}.attn.hook_{'qkv'[x]}": swap}):
                q = _softmax(model(clean, last_only=True))
            k = rel_entr(p, q).sum(-1)
            kl[rows, n] = k
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(p > 0, np.log(p / q), 0.0)
            sens[rows, n] = np.abs(q - p).sum(-1) + (p * np.abs(r - k[:, None])).sum(-1)
    return kl, sens


def float32_floor(model, sens: np.ndarray) -> np.ndarray:
    """|KL₃₂ − KL| ≤ δ·S + 2δ² + 1e-13 per (example, edge), derived here:

    * δ bounds the float32 rounding of a logit b_v = w_v·h. Its scale is ‖h‖·max‖w_v‖ ≥ |b_v|
      (Cauchy–Schwarz), ‖h‖ ≤ √D·max|γ| + ‖β‖ (final LayerNorm, ‖normalised x‖ ≤ √D); each
      of the L blocks and the unembedding adds a few eps of that scale (LayerNorm
      renormalises, so errors add rather than compound): δ = 4·(L + 1)·eps₃₂·scale (measured
      ≤ 3.1·eps₃₂·scale on these models, so a 5× margin);
    * to first order KL moves by δ·S (∂KL/∂b = q − p, ∂KL/∂a = p ⊙ (log p/q − KL)), and where
      P = Q by ½·Var_p(α − β) ≤ 2δ²; 1e-13 covers both sides' float64 summation."""
    ln, w = model.ln_f, model.wte.weight.detach().double()
    gamma, beta = ln.weight.detach().double(), ln.bias.detach().double()
    h_norm = model.cfg.d_model**0.5 * gamma.abs().max() + beta.norm()
    scale = float(h_norm * w.norm(dim=-1).max())
    delta = 4 * (model.cfg.n_layer + 1) * np.finfo(np.float32).eps * scale
    return delta * sens + 2 * delta**2 + 1e-13


def assert_exact(fast: np.ndarray, ref: np.ndarray) -> None:
    """Relative error ≤ 1e-3 where the reference KL ≥ 1e-9, absolute ≤ 1e-12 below."""
    big = ref >= 1e-9
    np.testing.assert_array_less(np.abs(fast - ref)[big], 1e-3 * ref[big])
    np.testing.assert_array_less(np.abs(fast - ref)[~big], 1e-12)
