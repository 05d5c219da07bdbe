"""Sparse upcycling (SAMOE §6, paper App. A.3): the step-0 MoE of one variant from a dense
GPT's state dict and a training seed, its init manifest (SAMOE §2), and the K3 checks.

1. The shared and all E routed experts of layer l start as copies of the dense ``mlp`` of l;
   the shared expert stays an unchanged copy.
2. Per routed expert, each entry of each weight tensor of rank ≥ 2 is selected with
   probability ``drop_prob`` and replaced by a Gaussian draw with the dense tensor's mean and
   (unbiased) standard deviation; biases are never re-initialised.
3. Routers: ``kaiming_uniform_(W, a=router_init_a)`` on the full matrix, no bias; write
   heads: zeros; everything else (embeddings, attention, norms) copied.

Seeding [CHOICE §2]: every draw comes from its own generator, seeded by a stable hash of
``(seed, "upcycle", layer, expert, tensor)`` or ``(seed, "router", layer)``, never from the
global RNG, so the experts are byte-identical across a seed's three variants and no draw
depends on what ran before.

Ordinary versus state routers [CHOICE, ``MoEConfig.router_x_init``]: one kaiming draw W of
shape (E, d + r) per (seed, layer) serves all three variants; the state routers take
W^x = W[:, :d], W^s = W[:, d:] (fan-in d + r, normative). The Ordinary router has fan-in d:

* ``own_fan_in`` (default, normative fan-ins): W^x_ord = sqrt((d + r)/d) · W[:, :d], the same
  draw rescaled to the fan-in-d bound. Step-0 Ordinary logits are then a positive multiple
  of the state variants' (same Top-k sets, different gates).
* ``state_block``: W^x_ord = W[:, :d], byte-identical to the state routers' W^x, so with
  s = 0 all three variants compute bitwise the same step-0 logits and outputs (the Ordinary
  router's init bound is then sqrt(3/(d + r))·gain instead of sqrt(3/d)·gain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import combinations

import torch
from torch import nn

from headgeom.hashing import content_hash, sha256_bytes
from headgeom.model.config import ModelConfig
from headgeom.samoe import checks
from headgeom.samoe.config import STATE_VARIANTS, MoEConfig, check_variant
from headgeom.samoe.hub import HubSource, empty_model
from headgeom.samoe.model import PARAM_KINDS, MoEModel, param_kind


def stable_generator(*parts: object) -> torch.Generator:
    """A CPU generator seeded by the first 63 bits of the content hash of ``parts``."""
    g = torch.Generator()
    g.manual_seed(int(content_hash(list(parts))[:16], 16) >> 1)
    return g


def partially_reinitialised(
    w: torch.Tensor, drop_prob: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w with each entry replaced with probability ``drop_prob`` by N(mean(w), std(w)²),
    the boolean mask of replaced entries) — SAMOE §6 step 3, for one tensor of rank ≥ 2."""
    mean, std = w.mean(), w.std()  # the dense tensor's own statistics
    mask = torch.rand(w.shape, generator=generator, dtype=w.dtype) < drop_prob
    draw = torch.randn(w.shape, generator=generator, dtype=w.dtype) * std + mean
    return torch.where(mask, draw, w), mask


def router_weights(
    seed: int, layer: int, d_model: int, moe: MoEConfig, variant: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W^x (E, d), W^s (E, r) or None) of the router of ``layer`` (module text)."""
    E, r = moe.n_experts, moe.state_dim
    full = torch.empty(E, d_model + r)  # fan-in d + r
    nn.init.kaiming_uniform_(full, a=moe.router_init_a,
                             generator=stable_generator(seed, "router", layer))  # fmt: skip
    if variant in STATE_VARIANTS:
        return full[:, :d_model].clone(), full[:, d_model:].clone()
    if moe.router_x_init == "state_block":
        return full[:, :d_model].clone(), None
    # Bound ∝ 1/sqrt(fan-in): the same draw at fan-in d.
    return full[:, :d_model] * math.sqrt((d_model + r) / d_model), None


def upcycle(
    dense_state: Mapping[str, torch.Tensor],
    source: ModelConfig | HubSource,
    moe: MoEConfig,
    variant: str,
    seed: int,
) -> MoEModel:
    """The step-0 SA-MoE ``variant`` upcycled from ``dense_state`` (a ``GPT(cfg)`` state
    dict, or a Hub model's) with training seed ``seed`` (SAMOE §6; module text)."""
    check_variant(variant)
    model = empty_model(source, moe, variant)  # shapes only: nothing drawn, nothing to overwrite
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, p in model.state_dict(keep_vars=True).items():
        kind, parts = param_kind(name), name.split(".")
        if kind == "router":
            layer = int(parts[1])
            d_model = model.blocks[layer].moe.router.W_x.shape[1]
            w_x, w_s = router_weights(seed, layer, d_model, moe, variant)
            state[name] = w_x if parts[-1] == "W_x" else w_s
            continue
        if kind == "write":
            state[name] = torch.zeros(p.shape, dtype=p.dtype)
            continue
        src = model.dense_name(name)
        if src not in dense_state:
            raise KeyError(f"upcycle: dense state dict has no {src!r} (needed for {name!r})")
        used.add(src)
        w = dense_state[src].detach().clone()
        if w.shape != p.shape:
            raise ValueError(f"upcycle: dense {src!r} has shape {tuple(w.shape)}, {name!r} "
                             f"needs {tuple(p.shape)}")  # fmt: skip
        if kind == "routed" and w.dim() >= 2:
            layer, expert, tensor = int(parts[1]), int(parts[4]), ".".join(parts[5:])
            g = stable_generator(seed, "upcycle", layer, expert, tensor)
            w, _ = partially_reinitialised(w, moe.drop_prob, g)
        state[name] = w
    unused = set(dense_state) - used
    if unused:
        raise KeyError(f"upcycle: dense entries {sorted(unused)} have no place in the MoE")
    model.load_state_dict(state, strict=True, assign=True)
    return model


# --------------------------------------------------------------------------- manifest
def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's exact bytes (contiguous, CPU, its own dtype)."""
    return sha256_bytes(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


def init_manifest(model: MoEModel) -> dict:
    """SHA-256 of every initialised tensor, grouped by ``PARAM_KINDS`` (SAMOE §2), and the
    content hash of that record."""
    groups: dict[str, dict[str, str]] = {k: {} for k in PARAM_KINDS}
    for name, t in model.state_dict().items():
        groups[param_kind(name)][name] = tensor_sha256(t)
    return {"tensors": groups, "content_sha256": content_hash(groups)}


def expert_hashes(manifest: Mapping) -> dict[str, str]:
    """The shared and routed expert entries of an init manifest."""
    return {**manifest["tensors"]["shared"], **manifest["tensors"]["routed"]}


# --------------------------------------------------------------------------- K3
def reinit_fraction_tolerance(n: int, drop_prob: float) -> float:
    """4 binomial standard deviations of the re-initialised fraction of n entries (§6:
    0.55 ± 4·sqrt(0.2475/n) at drop_prob = 0.55)."""
    return 4.0 * math.sqrt(drop_prob * (1.0 - drop_prob) / n)


def check_upcycling(dense_state: Mapping[str, torch.Tensor], model: MoEModel) -> dict:
    """K3 on one upcycled model (SAMOE §6 [CHECK]); raises ``CheckFailed``, else returns
    the logged keys: the largest re-init fraction deviation (each tensor against its own
    tolerance; logged with the tightest one), shared/bias mismatches, identical pairs."""
    moe = model.moe_cfg
    state = model.state_dict()
    worst, tightest, mismatches, equal_pairs = 0.0, math.inf, 0, 0
    for layer, block in enumerate(model.blocks):
        for name, t in block.moe.shared.state_dict().items():
            mismatches += not torch.equal(t, dense_state[model.dense_mlp(layer) + name])
        for e in range(moe.n_experts):
            for name, t in block.moe.experts[e].state_dict().items():
                dense = dense_state[model.dense_mlp(layer) + name]
                if t.dim() < 2:  # biases are copies
                    mismatches += not torch.equal(t, dense)
                    continue
                deviation = abs((t != dense).double().mean().item() - moe.drop_prob)
                tol = reinit_fraction_tolerance(t.numel(), moe.drop_prob)
                checks.enforce("K3.fraction", deviation, tol,
                               what=f"layer {layer} expert {e} {name}: |re-init fraction − "
                                    f"{moe.drop_prob}|")  # fmt: skip
                worst, tightest = max(worst, deviation), min(tightest, tol)
        prefix = f"blocks.{layer}.moe.experts."
        flat = [
            torch.cat([state[k].flatten() for k in state if k.startswith(f"{prefix}{e}.")])
            for e in range(moe.n_experts)
        ]
        equal_pairs += sum(torch.equal(a, b) for a, b in combinations(flat, 2))
    return {
        **checks.record("K3.fraction", worst, tightest),
        **checks.enforce("K3.copies", mismatches, 0, "count",
                         what="shared expert or routed bias differs from the dense MLP"),
        **checks.enforce("K3.distinct", equal_pairs, 0, "count",
                         what="pairs of identical routed experts in one layer"),
    }  # fmt: skip


def check_experts_agree(manifests: Mapping[str, Mapping]) -> dict:
    """K3 across a seed's variants (SAMOE §2 [CHECK]): every expert hash agrees."""
    hashes = [expert_hashes(m) for m in manifests.values()]
    differing = sum(any(h[k] != hashes[0][k] for h in hashes) for k in hashes[0])
    what = f"expert tensors whose hash differs across {list(manifests)}"
    return checks.enforce("K3.variants", differing, 0, "count", what=what)
