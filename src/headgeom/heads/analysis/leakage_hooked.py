"""The one pass of the leakage analysis (docs §11.2–11.6) through a model's hook sites
alone: whole forwards of the model's own code, nothing resumed, for architectures without
the KV-prefix forward (any ``transformers`` causal LM, ``headgeom.model.hf``).

Per batch of equal-length prompts: one clean forward caches every layer's residual, q, k, v,
z and attention output; one reference forward caches z. For each source layer l, the δ of
every head (``Heads.write_maps``, docs §11.2) and ONE forward of the H·B rows "head g patched
on example b" (row g·B + b) in which

* ``blocks.{l}.attn.hook_z`` swaps head g's z for the reference one (the real patch);
* ``blocks.{l}.hook_attn_out`` measures check C8 (the patched attention output minus the
  clean one against δ_g) and then returns clean + δ_g, so the rest of the forward is the
  δ-patched forward of check C9 and of §11.5–11.6;
* ``attn.hook_q``/``hook_k``/``hook_v`` of every later layer j give Δ_total (the patched
  value minus the clean one) at the positions ≥ p, the batch's first clean/reference
  difference (both responses are zero before it), and the reader re-run on the clean
  residual entering j plus δ (``Heads.read``) gives Δ_direct; a key/value head's response
  is attributed to every query head of its group;
* where a head's attention is softmax(q·k/√d) of its sites (``Heads.attention_from_sites``)
  the four TV conditions of §11.6 at the final position;

and the final logits give the drops C9 compares with the stored effects.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from headgeom.heads.analysis.leakage_sums import (
    TV_CONDITIONS,
    Sums,
    attention_final,
    total_variation,
)
from headgeom.heads.analysis.patching import head_perturbations, logit_difference
from headgeom.model.geometries import READ_TYPES
from headgeom.model.heads import Heads, kv_head_of

_KINDS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
          "hook_attn_out")  # fmt: skip


def _name(layer: int, kind: str) -> str:
    return f"blocks.{layer}.{kind}"


@torch.no_grad()
def hooked_pass(model, heads: Heads, clean, ref, correct, incorrect, U, acc: Sums) -> tuple:
    """Drops (B, L, H), the C8 residual, the largest |attention output| and |logit| of one
    batch (the module docstring); the sums go into ``acc``."""
    L, H = heads.n_layer, heads.n_head
    names = [_name(layer, kind) for layer in range(L) for kind in _KINDS]
    logits, cc = model.run_with_cache(clean, names, last_only=True)
    clean_ld = logit_difference(logits, correct, incorrect)
    _, rc = model.run_with_cache(ref, [_name(layer, "attn.hook_z") for layer in range(L)], True)
    B, T = clean.shape
    differ = (clean != ref).any(dim=0).nonzero()
    p = min(int(differ[0]) if len(differ) else T, T - 1)
    owner = torch.tensor(kv_head_of(heads.kv_groups), device=clean.device)
    rows = torch.arange(H * B, device=clean.device)
    head_of_row = torch.arange(H, device=clean.device).repeat_interleave(B)
    ids = clean.repeat(H, 1)  # row g·B + b: example b with head g patched
    good, bad = correct.repeat(H), incorrect.repeat(H)
    drops = torch.empty(B, L, H, dtype=torch.float64, device=clean.device)
    state = {"c8": 0.0}
    attn_scale, logit_scale = 0.0, float(logits.abs().max())

    def cached(layer: int, kind: str) -> torch.Tensor:
        return cc[_name(layer, kind)]

    for layer in range(L):
        z, z_ref = cached(layer, "attn.hook_z"), rc[_name(layer, "attn.hook_z")]
        delta = head_perturbations(heads.write_maps(layer), z, z_ref)  # (B, T, H, D) float64
        acc.add_energies(layer, delta, U[layer])
        out_clean = cached(layer, "hook_attn_out")
        attn_scale = max(attn_scale, float(out_clean.abs().max()))
        d_rows = delta.permute(2, 0, 1, 3).flatten(0, 1)  # (H·B, T, D): row g·B + b
        z_ref_rows = z_ref.permute(2, 0, 1, 3).flatten(0, 1)  # (H·B, T, d): head g's z_ref

        def swap(zz: torch.Tensor, z_ref_rows=z_ref_rows) -> torch.Tensor:
            zz = zz.clone()
            zz[rows, :, head_of_row] = z_ref_rows
            return zz

        def check_and_add(out: torch.Tensor, out_clean=out_clean, d_rows=d_rows) -> torch.Tensor:
            base = out_clean.double().repeat(H, 1, 1)
            state["c8"] = max(state["c8"], float((out.double() - base - d_rows).abs().max()))
            return (base + d_rows).to(out.dtype)

        fns: dict[str, Callable] = {
            _name(layer, "attn.hook_z"): swap,
            _name(layer, "hook_attn_out"): check_and_add,
        }
        for j in range(layer + 1, L):
            fns.update(_response_hooks(heads, cached, delta, layer, j, p, owner, acc))
        with model.hooks(fns):
            patched = model(ids, last_only=True)
        ld = logit_difference(patched, good, bad)
        drops[:, layer] = clean_ld[:, None] - ld.view(H, B).T
    return drops, state["c8"], attn_scale, logit_scale


def _response_hooks(heads: Heads, cached, delta, layer, j, p, owner, acc: Sums) -> dict:
    """Hooks on reader layer j's q, k, v sites in the δ-patched forward of source ``layer``:
    Δ_total against the clean values, Δ_direct from the reader re-run on the clean residual
    plus δ (computed once, at the first of the three sites to fire), their sums, and the TV
    conditions once all three have been seen."""
    H = heads.n_head
    B, T = delta.shape[:2]
    S = T - p
    seen: dict[str, torch.Tensor] = {}
    direct: list[torch.Tensor] = []

    def direct_values() -> list[torch.Tensor]:
        if not direct:
            x_j = cached(j, "hook_resid_pre")[:, p:]  # (B, S, D)
            shifted = (x_j.double() + delta[:, p:].permute(2, 0, 1, 3)).to(x_j.dtype)
            direct.extend(heads.read(j, shifted.flatten(0, 1)))  # 3 × (H·B, S, n, d)
        return direct

    def per_query_head(t: torch.Tensor, X: str) -> torch.Tensor:
        """(…, n, d) -> (…, H, d): a key/value head's values at every query head it serves."""
        return t if X == "Q" or t.shape[-2] == H else t[..., owner, :]

    def hook(c: int, X: str) -> Callable:
        def fn(t: torch.Tensor) -> None:
            clean_x = cached(j, f"attn.hook_{X.lower()}")[:, p:].double()  # (B, S, n, d)
            shape = (H, B, S, *clean_x.shape[2:])
            d_t = t[:, p:].double().reshape(shape) - clean_x
            d_d = direct_values()[c].double().reshape(shape) - clean_x
            acc.add_responses(layer, j, c, per_query_head(d_d, X), per_query_head(d_t, X))
            seen[X] = t[:, p:].clone() if heads.attention_from_sites else None
            if len(seen) == len(READ_TYPES) and heads.attention_from_sites:
                _add_tv(cached, seen, direct_values(), layer, j, p, H, acc)

        return fn

    return {_name(j, f"attn.hook_{X.lower()}"): hook(c, X) for c, X in enumerate(READ_TYPES)}


def _add_tv(cached, seen, direct, layer, j, p, H, acc: Sums) -> None:
    """The four attention TV conditions of docs §11.6 at reader layer j's final position
    (query and keys from the clean residual plus δ, or from the patched forward, ``seen``
    at the positions ≥ p; keys of positions < p are the clean ones), summed over examples."""
    q_clean, k_clean = cached(j, "attn.hook_q")[:, -1], cached(j, "attn.hook_k")
    B = q_clean.shape[0]
    a = attention_final(q_clean, k_clean)  # (B, H', T)

    def keys(suffix: torch.Tensor) -> torch.Tensor:
        prefix = k_clean[:, :p].expand(H, *k_clean[:, :p].shape)
        return torch.cat([prefix, suffix.reshape(H, B, -1, *k_clean.shape[2:])], dim=2)

    def final_query(q: torch.Tensor) -> torch.Tensor:
        return q.reshape(H, B, -1, *q_clean.shape[1:])[:, :, -1]

    q_d, k_d = final_query(direct[0]), keys(direct[1])
    q_t, k_t = final_query(seen["Q"]), keys(seen["K"])
    conditions = {
        "query": attention_final(q_d, k_clean.expand(H, *k_clean.shape)),
        "keys": attention_final(q_clean.expand(H, *q_clean.shape), k_d),
        "direct": attention_final(q_d, k_d),
        "total": attention_final(q_t, k_t),
    }
    for c, name in enumerate(TV_CONDITIONS):
        tv = total_variation(conditions[name], a[None]).sum(dim=1)  # (H, H')
        acc.tv[layer, :, j, :, c] += tv.cpu().numpy()
