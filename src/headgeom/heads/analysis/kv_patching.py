"""Key/value-head patching of grouped-query models, and query-input patching per head.

Head patching (:mod:`headgeom.heads.analysis.patching`) replaces a query head's output z. In a
grouped-query model the query heads ``cfg.kv_groups[j]`` share key/value head j, so the
question "what does this key/value head carry?" is asked at the head's *inputs*:

* **key/value head j of layer l**: the j-th head's slices of the layer's key and value
  projection outputs (the sites ``blocks.{l}.attn.hook_k`` and ``attn.hook_v``, axes (batch,
  position, kv_head, d_head): ``k_proj``/``v_proj``, or the k and v parts of a fused qkv
  projection, biases included) are replaced at **every** position of the clean prompt by
  their values on the reference prompt; everything downstream recomputes. The patched values
  are *projection outputs*: what the model then does to a key still happens to the patched
  one — Qwen3's and Gemma 3's k-norm (an RMSNorm over d_head) acts on it, then the rotary
  turns it at its own position (clean and reference prompts have equal length, so it is the
  reference key's own position too). Both act position by position, so patching after them
  would give the same keys: the effect does not depend on that choice. Values have neither.
  The query heads ``cfg.kv_groups[j]`` of layer l read the patched head; no other head of
  layer l sees any change.
* **query input of head h of layer l**: its slice of the query projection output (the site
  ``attn.hook_q``; Qwen3's/Gemma 3's q-norm and the rotary act after it), likewise.

The per-example drop is d(x) = LD_clean(x) − LD_patched(x) at the final position, correct and
incorrect answers those of the clean prompt, as for heads (docs §10.1). Where every query head
has its own key/value head (``n_kv_head == n_head``), patching the query input and key/value
head h together gives head h exactly its reference z, so it equals the head's z patch
(``tests/unit/test_kv_patching.py``).

Engines (same batching as head patching: equal-length batches, :func:`patch_in_batches`):
``fast`` resumes from the clean residual entering layer l (registry ``fast_patching``),
stacks (head × example) rows, recomputes only positions ≥ the batch's first difference p
against the clean keys/values before it (``prefix_reuse``; before p the reference values are
the clean ones, so the patch is a no-op there) and computes the two answer logits only;
``plain`` is one full forward per (layer, head) on every example of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from headgeom.heads.analysis.batching import first_difference, patch_in_batches
from headgeom.heads.analysis.patching import logit_difference, supports_fast, supports_prefix_reuse
from headgeom.model import registry

Progress = Callable[[int], object] | None

#: The sites patched together, by what is patched.
KV = ("attn.hook_k", "attn.hook_v")
QUERY = ("attn.hook_q",)
ENGINES = ("fast", "plain")


def _site(layer: int, name: str) -> str:
    return f"blocks.{layer}.{name}"


def units(model: torch.nn.Module, sites: Sequence[str]) -> int:
    """How many heads the sites ``sites`` have (their head axis, from the registry: ``head``
    → ``cfg.n_head``, ``kv_head`` → ``cfg.n_kv_head``); all of them must have the same."""
    arch = registry.architecture_of(model)
    if arch is None:
        raise ValueError(f"the registry knows no architecture of {type(model).__name__}")
    sizes = set()
    for name in sites:
        if name not in arch.sites:
            raise ValueError(f"{arch.name} models have no site {name!r}")
        axis = arch.sites[name][2]  # (batch, position, head | kv_head, d_head)
        sizes.add(model.cfg.n_kv_head if axis == "kv_head" else model.cfg.n_head)
    if len(sizes) != 1:
        raise ValueError(f"sites {list(sites)} have different head counts {sorted(sizes)}")
    return sizes.pop()


def _swap_rows(ref: torch.Tensor, heads: torch.Tensor, b: int) -> Callable:
    """Hook for a (G·b, S, U, d) site: row g·b + e takes head ``heads[g]`` of example e from
    ``ref`` (b, S, U, d)."""
    G = len(heads)

    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)
        t.view(G, b, *t.shape[1:])[torch.arange(G), :, :, heads] = ref[:, :, heads].permute(
            2, 0, 1, 3
        )
        return t

    return fn


@torch.no_grad()
def patch_inputs_batch(
    model: torch.nn.Module,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    sites: Sequence[str] = KV,
    engine: str = "fast",
    *,
    max_rows: int,
    progress: Progress = None,
    prefix_reuse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean LD (B,) and patched LD (B, L, U) of one batch of equal-length prompts (B, T):
    head u of ``sites`` (all positions, reference values) patched in layer l. ``progress(U)``
    after each layer. A model without ``fast_patching`` runs the plain engine."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    L, U = model.cfg.n_layer, units(model, sites)
    names = [_site(layer, s) for layer in range(L) for s in sites]
    _, ref_cache = model.run_with_cache(ref, names, last_only=True)
    fast = engine == "fast" and supports_fast(model)
    reuse = fast and prefix_reuse and supports_prefix_reuse(model)
    B, T = clean.shape
    patched = torch.empty(B, L, U, dtype=torch.float64, device=clean.device)
    if not fast:
        clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
        for layer in range(L):
            for u in range(U):
                head = torch.full((1,), u, device=clean.device)
                hooks = {_site(layer, s): _swap_rows(ref_cache[_site(layer, s)], head, B)
                         for s in sites}  # fmt: skip
                with model.hooks(hooks):
                    logits = model(clean, last_only=True)
                patched[:, layer, u] = logit_difference(logits, correct, incorrect)
            if progress is not None:
                progress(U)
        return clean_ld, patched

    cached = [_site(layer, "hook_resid_pre") for layer in range(L)]
    cached += [_site(layer, f"attn.hook_{x}") for layer in range(L) for x in "kv"] if reuse else []
    logits, clean_cache = model.run_with_cache(clean, cached, last_only=True)
    clean_ld = logit_difference(logits, correct, incorrect)
    differ = (clean != ref).any(dim=0).nonzero()
    p = min(int(differ[0]) if len(differ) else T, T - 1) if reuse else 0
    step = max(1, int(max_rows))
    n_ex = min(B, step)  # examples per forward, then as many heads as fit
    n_heads = max(1, step // n_ex)
    for layer in range(L):
        for e0 in range(0, B, n_ex):
            ex = slice(e0, min(B, e0 + n_ex))
            b = ex.stop - ex.start
            for u0 in range(0, U, n_heads):
                heads = torch.arange(u0, min(U, u0 + n_heads), device=clean.device)
                G = len(heads)
                hooks = {_site(layer, s): _swap_rows(ref_cache[_site(layer, s)][ex, p:], heads, b)
                         for s in sites}  # fmt: skip
                x = clean_cache[_site(layer, "hook_resid_pre")][ex, p:]
                x = x.expand(G, *x.shape).flatten(0, 1)  # row g·b + e: head g, example e
                with model.hooks(hooks):
                    x = _layer(model, clean_cache, layer, x, ex, p, reuse)
                for j in range(layer + 1, L):
                    x = _layer(model, clean_cache, j, x, ex, p, reuse)
                answers = torch.stack([correct[ex], incorrect[ex]], dim=1).repeat(G, 1)
                lg = model.answer_logits(x, answers).double()
                patched[ex, layer, u0 : u0 + G] = (lg[:, 0] - lg[:, 1]).view(G, b).T
        if progress is not None:
            progress(U)
    return clean_ld, patched


def _layer(model, clean_cache, j, x, ex: slice, p: int, reuse: bool) -> torch.Tensor:
    """Block j on the rows ``x`` (positions p.. against the clean prefix's keys/values when
    ``reuse``, else whole sequences); the last block at the final position only."""
    if not reuse:
        return model.blocks[j](x)
    past_k = clean_cache[_site(j, "attn.hook_k")][ex, :p]  # (b, p, H_kv, d), shared by rows
    past_v = clean_cache[_site(j, "attn.hook_v")][ex, :p]
    last = j == model.cfg.n_layer - 1
    return model.blocks[j].forward_suffix(x, past_k, past_v, last_only=last)[0]


def patch_inputs(
    model: torch.nn.Module,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    sites: Sequence[str] = KV,
    engine: str = "fast",
    progress: Progress = None,
    *,
    max_rows: int,
    prefix_reuse: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Patching of every head of ``sites`` (:data:`KV`: key/value heads; :data:`QUERY`:
    query inputs) in every layer on every example: ``(clean_ld (N,), patched_ld (N, L, U))``
    float64 in input order, the drop ``clean_ld[:, None, None] - patched_ld``. Arguments as
    ``patching.patch_all_heads``; ``progress(k)`` reports k more heads done."""

    def run(model, clean, ref, correct, incorrect, progress):
        return patch_inputs_batch(
            model, clean, ref, correct, incorrect, sites, engine,
            max_rows=max_rows, progress=progress, prefix_reuse=prefix_reuse,
        )  # fmt: skip

    def order(clean_ids, ref_ids):
        return [first_difference(c, r) for c, r in zip(clean_ids, ref_ids, strict=True)]

    shape = (model.cfg.n_layer, units(model, sites))
    return patch_in_batches(
        model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, run,
        order=order if prefix_reuse else None, shape=shape,
    )  # fmt: skip


def patch_kv_heads(model, clean_ids, ref_ids, correct, incorrect, batch_size, **kwargs):
    """:func:`patch_inputs` of the key/value heads: patched LD (N, L, n_kv_head); the query
    heads that read key/value head j are ``model.cfg.kv_groups[j]``."""
    return patch_inputs(model, clean_ids, ref_ids, correct, incorrect, batch_size, KV, **kwargs)


def has_kv_heads(model: torch.nn.Module) -> bool:
    """Whether the model's architecture has key/value heads of their own (its ``attn.hook_k``
    site's head axis is ``kv_head``; ``cfg.n_kv_head`` and ``cfg.kv_groups`` say how many
    and which query heads read each). Our GPTs have one key and value per query head."""
    arch = registry.architecture_of(model)
    return arch is not None and arch.sites.get("attn.hook_k", (None,) * 4)[2] == "kv_head"


def is_grouped_query(model: torch.nn.Module) -> bool:
    """Whether query heads share key/value heads (``n_kv_head < n_head``)."""
    return has_kv_heads(model) and model.cfg.n_kv_head < model.cfg.n_head
