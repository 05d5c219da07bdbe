"""Single-head activation patching and the real patch perturbation (docs §10.1, §11.2).

Patching head (l, h) replaces its output z^{l,h}_t (the site ``blocks.{l}.attn.hook_z``,
axes (batch, position, head, d_head)) at **every** position t of the clean prompt by the
value it takes on the reference prompt; everything downstream recomputes. The per-example
drop is

    d_{l,h}(x) = LD_clean(x) − LD_patched(x),   LD = logit(correct) − logit(incorrect)

at the final position, correct/incorrect always those of the clean prompt.

Because the attention output is linear in z, the patch adds exactly

    δ_{l,h,t} = W_O^{l,h} (z^ref_{l,h,t} − z_{l,h,t})  ∈ Im W_O^{l,h}

to the residual stream after layer l (docs §11.2). :func:`perturbation_check` (check C8)
and :func:`delta_patched_ld` (the independent route for check C9) verify this.

Prompts are sequences of *model* ids; clean and reference prompts of one example have equal
length, lengths may differ between examples. Batches group equal lengths
(:func:`length_batches`), so no padding ever enters a forward pass. Forward passes run in
float32 on the model's device; logit differences and perturbations are float64.

Engines, all with the same arguments and ``(clean_ld (N,), patched_ld (N, L, H))`` result:

* :func:`patch_all_heads` — plain: one full clean forward per head (the reference);
* :func:`patch_all_heads_fast` — exact and fast: layer resumption, clean-prefix KV reuse,
  stacked heads, answer logits only (equal to the plain engine within float32 round-off);
* :func:`attribution_patch` — APPROXIMATE first-order estimate (2 forwards + 1 backward per
  batch), a pre-filter only.

Ablation modes (docs §10.1): the plain and fast engines take an optional
``replacement`` (L, H, d_head): head (l, h)'s z is then replaced at every position by the
fixed vector ``replacement[l, h]`` (its mean over held-out validation positions: ``mean``
ablation; zeros: ``zero`` ablation) instead of its reference-prompt value. ``None`` (the
default, ``resample``) is exactly today's computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from headgeom.heads.analysis.batching import (
    first_difference,
    model_device,
    patch_in_batches,
)
from headgeom.model import registry
from headgeom.model.gpt import GPT, site

Progress = Callable[[int], object] | None


# --------------------------------------------------------------------------- primitives
def logit_difference(
    logits: torch.Tensor, correct: torch.Tensor, incorrect: torch.Tensor
) -> torch.Tensor:
    """LD = logit(correct) − logit(incorrect), float64, for final-position ``logits`` (B, V)."""
    gathered = logits.gather(1, torch.stack([correct, incorrect], dim=1)).double()
    return gathered[:, 0] - gathered[:, 1]


def z_sites(model: GPT) -> list[str]:
    return [site(layer, "attn.hook_z") for layer in range(model.cfg.n_layer)]


def replace_head(head: int, z_ref: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hook for ``blocks.{l}.attn.hook_z`` that swaps head ``head`` for ``z_ref``.

    ``z_ref`` has shape (batch, position, d_head): the reference run's z of that head at
    every position.
    """

    def fn(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = z_ref
        return z

    return fn


def replacement_cache(
    model: GPT, replacement: torch.Tensor, shape: tuple[int, int]
) -> dict[str, torch.Tensor]:
    """What a reference forward would cache at every ``hook_z`` for an ablation mode: head
    (l, h)'s fixed value ``replacement[l, h]`` (L, H, d_head) at every one of the ``shape``
    = (batch, position) positions, as broadcast views (batch, position, head, d_head)."""
    n_layer, n_head, d_head = model.cfg.n_layer, model.cfg.n_head, model.cfg.d_head
    if tuple(replacement.shape) != (n_layer, n_head, d_head):
        raise ValueError(
            f"replacement has shape {tuple(replacement.shape)}; the model needs "
            f"(n_layer, n_head, d_head) = {(n_layer, n_head, d_head)}"
        )
    value = replacement.to(device=model_device(model), dtype=next(model.parameters()).dtype)
    return {name: value[layer].expand(*shape, n_head, d_head)
            for layer, name in enumerate(z_sites(model))}  # fmt: skip


def add_to(delta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hook that adds ``delta`` (same shape) to an activation, e.g. ``hook_attn_out``."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + delta.to(x.dtype)

    return fn


def head_perturbations(
    write_maps: torch.Tensor, z: torch.Tensor, z_ref: torch.Tensor
) -> torch.Tensor:
    """δ_{h,t} = W_O^h (z^ref_{h,t} − z_{h,t}) in float64, shape (batch, position, head, d_model).

    ``write_maps`` is ``writer.write_maps()`` (head, d_model, d_head); ``z``/``z_ref`` have
    axes (batch, position, head, d_head).
    """
    diff = z_ref.double() - z.double()
    return torch.einsum("bthk,hdk->bthd", diff, write_maps.detach().double().to(diff.device))


# --------------------------------------------------------------------------- patching
@torch.no_grad()
def patch_batch(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    progress: Progress = None,
    replacement: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean LD (B,) and patched LD (B, L, H) for one batch of equal-length prompts (B, T).

    One reference forward caches every head's z; then one clean forward per head, with that
    head's z replaced at all positions. ``progress(1)`` is called after each head.
    ``replacement`` (L, H, d_head), if given, replaces the reference forward by fixed values
    (:func:`replacement_cache`: mean or zero ablation).
    """
    names = z_sites(model)
    if replacement is None:
        _, ref_cache = model.run_with_cache(ref, names, last_only=True)
    else:
        ref_cache = replacement_cache(model, replacement, tuple(clean.shape))
    clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    patched = torch.empty(clean.shape[0], n_layer, n_head, dtype=torch.float64, device=clean.device)
    for layer, name in enumerate(names):
        for head in range(n_head):
            with model.hooks({name: replace_head(head, ref_cache[name][:, :, head])}):
                logits = model(clean, last_only=True)
            patched[:, layer, head] = logit_difference(logits, correct, incorrect)
            if progress is not None:
                progress(1)
    return clean_ld, patched


def patch_all_heads(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    progress: Progress = None,
    replacement: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Single-head patching of every head on every example (docs §10.1).

    ``clean_ids``/``ref_ids``: one sequence of model ids per example (equal length within an
    example); ``correct``/``incorrect``: model ids of the clean prompt's answers.
    Returns ``(clean_ld (N,), patched_ld (N, L, H))`` as float64, in input order; the drop is
    ``clean_ld[:, None, None] - patched_ld``. ``progress(k)`` reports k more heads done
    (``len(length_batches(...)) · L · H`` in all). ``replacement``: see
    :func:`patch_batch` (None: resample patching with the reference prompts).
    """
    if replacement is None:
        run = patch_batch
    else:

        def run(model, clean, ref, correct, incorrect, progress):
            return patch_batch(model, clean, ref, correct, incorrect, progress, replacement)

    return patch_in_batches(
        model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, run
    )


# --------------------------------------------------------------------------- fast engine
def _last_logit_difference(model: GPT) -> Callable:
    """``f(x, correct, incorrect) -> LD (R,) float64`` from the residual ``x`` (R, T, D)
    leaving the last block, computing only the two answer logits at the final position
    (``model.answer_logits``: the model's own ``forward`` after its blocks)."""

    def ld(x, correct, incorrect):
        logits = model.answer_logits(x, torch.stack([correct, incorrect], dim=1)).double()
        return logits[:, 0] - logits[:, 1]

    return ld


def supports_fast(model: torch.nn.Module) -> bool:
    """Whether :func:`patch_all_heads_fast` runs its own path (else it falls back to plain):
    the registry's ``fast_patching`` of the model's architecture (none for a model type it
    does not know)."""
    arch = registry.architecture_of(model)
    return arch is not None and arch.fast_patching


def supports_prefix_reuse(model: torch.nn.Module) -> bool:
    """Whether the fast engine can also reuse the clean prefix: the registry's
    ``prefix_reuse`` (blocks with the KV-prefix forward of ``headgeom.model.gpt``,
    ``forward_suffix`` and ``after_z``). GPT models of every zoo geometry have it, and so do
    the multiscreen controls (windows and MiPE depend on absolute positions only) and wrapped
    ``transformers`` causal LMs (their layers' own forward with the clean prefix's keys/values
    handed through the cache argument, ``headgeom.model.hf_blocks``)."""
    arch = registry.architecture_of(model)
    return supports_fast(model) and arch.prefix_reuse


def _first_differences(clean_ids: Sequence, ref_ids: Sequence) -> list[int]:
    return [first_difference(c, r) for c, r in zip(clean_ids, ref_ids, strict=True)]


@torch.no_grad()
def patch_batch_fast(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    max_rows: int,
    progress: Progress = None,
    prefix_reuse: bool = True,
    replacement: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`patch_batch` computed by resumption, prefix reuse and row-stacking (same
    results within fp32 round-off).

    One clean and one reference forward cache, per layer, the clean residual entering the
    block, the clean z, k, v and the reference z. A patch of layer l

    * resumes from the cached clean residual entering block l (nothing before l depends on
      the patch);
    * recomputes only positions t ≥ p, p the batch's first position where clean and
      reference differ: before p, z_ref = z so the patch is a no-op and, attention being
      causal, every later activation there is the clean one. Layers after l attend to the
      cached clean keys/values of positions < p (``Block.forward_suffix``), shared by all
      the heads patched in one forward, never copied per head;
    * skips layer l's attention: its q, k, v and z are the clean ones (the patch acts on
      z), so layer l is the cached clean z with one head swapped, then W_O and the MLP
      (``Block.after_z``);
    * runs the last layer's query, W_O and MLP at the final position only, and computes the
      two answer logits only.

    Patches are stacked as rows (head-major: row g·b' + b patches head g of example b), at
    most ``max_rows`` rows per forward, so memory is bounded by
    ``max_rows · (T − p) · max(d_mlp, d_model)`` floats. ``progress(H)`` after each layer.
    ``prefix_reuse=False`` (or a model without :func:`supports_prefix_reuse`) runs blocks
    l..L−1 on the whole sequence instead. ``replacement`` (L, H, d_head), if given, stands in
    for the reference forward (:func:`replacement_cache`: mean or zero ablation); the patch
    then acts at every position, so nothing of the clean prefix is reused (p = 0).
    """
    ld_fn = _last_logit_difference(model)
    reuse = prefix_reuse and supports_prefix_reuse(model)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    z_names = z_sites(model)
    resid_names = [site(layer, "hook_resid_pre") for layer in range(n_layer)]
    kv_names = [site(layer, f"attn.hook_{x}") for layer in range(n_layer) for x in "kv"]
    cached = resid_names + (z_names + kv_names if reuse else [])
    logits, clean_cache = model.run_with_cache(clean, cached, last_only=True)
    clean_ld = logit_difference(logits, correct, incorrect)
    B, T = clean.shape
    if replacement is None:
        _, ref_cache = model.run_with_cache(ref, z_names, last_only=True)
    else:
        ref_cache = replacement_cache(model, replacement, (B, T))
    patched = torch.empty(B, n_layer, n_head, dtype=torch.float64, device=clean.device)
    step = max(1, int(max_rows))
    if reuse:
        # The batch minimum, kept below T so the final position is always recomputed;
        # positions between it and an example's own first difference are recomputed,
        # harmlessly (the patch is a no-op there).
        differ = (clean != ref).any(dim=0).nonzero()
        p = min(int(differ[0]) if len(differ) else T, T - 1)
        p = 0 if replacement is not None else p  # an ablation acts at every position
        n_ex = min(B, step)  # examples per forward, then as many heads as fit
        n_heads = max(1, step // n_ex)
        for layer in range(n_layer):
            for e0 in range(0, B, n_ex):
                examples = slice(e0, min(B, e0 + n_ex))  # a view of every cache, no copy
                for h0 in range(0, n_head, n_heads):
                    heads = torch.arange(h0, min(n_head, h0 + n_heads), device=clean.device)
                    x = _patched_suffix(model, clean_cache, ref_cache, layer, p, examples, heads)
                    G = len(heads)
                    good, bad = correct[examples].repeat(G), incorrect[examples].repeat(G)
                    patched[examples, layer, h0 : h0 + G] = ld_fn(x, good, bad).view(G, -1).T
            if progress is not None:
                progress(n_head)
        return clean_ld, patched
    rows = torch.arange(B * n_head, device=clean.device)
    head_of_row, example_of_row = rows // B, rows % B
    for layer in range(n_layer):
        z_ref = ref_cache[z_names[layer]]  # (B, T, H, d)
        x_clean = clean_cache[resid_names[layer]]  # (B, T, D)
        for start in range(0, B * n_head, step):
            heads = head_of_row[start : start + step]
            examples = example_of_row[start : start + step]
            x = _patched_resume(model, layer, x_clean, examples, heads, z_ref)
            patched[examples, layer, heads] = ld_fn(x, correct[examples], incorrect[examples])
        if progress is not None:
            progress(n_head)
    return clean_ld, patched


def _patched_suffix(model, clean_cache, ref_cache, layer, p, examples: slice, heads):
    """Residual leaving the last block (G·b', 1, D) for head g of ``heads`` patched at
    ``layer`` in example b of ``examples`` (row g·b' + b), recomputing positions ≥ p only
    (see :func:`patch_batch_fast`)."""
    n_layer = model.cfg.n_layer
    last = layer == n_layer - 1
    T = clean_cache[site(layer, "hook_resid_pre")].shape[1]
    start = T - 1 if last else p  # the last layer needs the final position only
    x = clean_cache[site(layer, "hook_resid_pre")][examples, start:]  # (b', S, D)
    z_clean = clean_cache[site(layer, "attn.hook_z")][examples, start:]  # (b', S, H, d)
    z_ref = ref_cache[site(layer, "attn.hook_z")][examples, start:]
    G = len(heads)
    z = z_clean.expand(G, *z_clean.shape).clone()  # (G, b', S, H, d)
    z[torch.arange(G), :, :, heads] = z_ref[:, :, heads].permute(2, 0, 1, 3)
    # sites keep their axes (batch, position, ...): rows are (G·b'), one copy of x
    x = x.expand(G, *x.shape).flatten(0, 1)
    x = model.blocks[layer].after_z(x, z.flatten(0, 1))  # (G·b', S, D)
    for j in range(layer + 1, n_layer):
        past_k = clean_cache[site(j, "attn.hook_k")][examples, :p]  # (b', p, H, d), shared
        past_v = clean_cache[site(j, "attn.hook_v")][examples, :p]
        x, _, _ = model.blocks[j].forward_suffix(x, past_k, past_v, last_only=j == n_layer - 1)
    return x


def _patched_resume(model, layer, x_clean, examples, heads, z_ref):
    """Residual leaving the last block (R, T, D): blocks layer..L−1 on the whole sequence
    from the cached clean residual, head ``heads[r]`` of row r swapped through ``hook_z``."""
    local = torch.arange(len(heads), device=heads.device)
    replacement = z_ref[examples, :, heads]  # (R, T, d)

    def swap(z):
        z = z.clone()
        z[local, :, heads] = replacement
        return z

    x = x_clean[examples]
    with model.hooks({site(layer, "attn.hook_z"): swap}):
        for block in model.blocks[layer:]:
            x = block(x)
    return x


def patch_all_heads_fast(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    progress: Progress = None,
    *,
    max_rows: int,
    prefix_reuse: bool = True,
    replacement: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`patch_all_heads` by the fast engine (:func:`patch_batch_fast`): same
    arguments, same ``(clean_ld (N,), patched_ld (N, L, H))`` and progress total, equal
    within fp32 round-off (a few ulps of the largest logit per block, docs §2.6).

    ``batch_size`` bounds the examples and ``max_rows`` the rows (head patches × examples)
    of one forward, hence memory. Within a length group examples are sorted by their first
    differing position, so batches share long clean prefixes (``prefix_reuse``). A model
    whose architecture the registry does not declare ``fast_patching``
    (:func:`supports_fast`) runs the plain engine; one without ``prefix_reuse``
    (:func:`supports_prefix_reuse`) runs layer resumption without prefix reuse.
    ``replacement``: see :func:`patch_batch_fast` (None: resample patching).
    """
    if not supports_fast(model):
        return patch_all_heads(
            model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, replacement
        )

    def run(model, clean, ref, correct, incorrect, progress):
        return patch_batch_fast(
            model, clean, ref, correct, incorrect, max_rows, progress, prefix_reuse, replacement
        )

    return patch_in_batches(
        model,
        clean_ids,
        ref_ids,
        correct,
        incorrect,
        batch_size,
        progress,
        run,
        order=_first_differences if prefix_reuse else None,
    )


# --------------------------------------------------------------------------- attribution
def attribution_patch(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    progress: Progress = None,
    replacement: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """APPROXIMATE head patching by attribution (a first-order Taylor expansion; a
    pre-filter, never a substitute for the exact engines).

    Per batch: one reference forward (caches z), one clean forward and one backward give
    ∂LD/∂z^{l,h}_t for every head at once, and

        patched_ld ≈ clean_ld + Σ_t (z^ref_{l,h,t} − z_{l,h,t}) · ∂LD/∂z^{l,h}_t,

    so the drop is ≈ −(z_ref − z)·∂LD/∂z. Exact when LD is linear in z^{l,h} (e.g. at the
    last layer with frozen LayerNorm scale); wrong wherever the patch moves attention
    patterns, LayerNorm scales or GELUs far from the clean point. Same arguments and return
    shape as :func:`patch_all_heads`; ``progress(L·H)`` per batch. ``replacement`` (L, H,
    d_head), if given, is the mean or zero ablation's fixed z (:func:`replacement_cache`)
    in place of the reference prompt's, as in the exact engines.
    """

    def run(model, clean, ref, correct, incorrect, progress):
        return attribution_batch(model, clean, ref, correct, incorrect, progress, replacement)

    return patch_in_batches(
        model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, run
    )


def attribution_batch(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    progress: Progress = None,
    replacement: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean LD (B,) and attribution-estimated patched LD (B, L, H) for one batch (see
    :func:`attribution_patch`). The gradient is taken through a zero offset added at every
    ``hook_z``, so it is the total derivative through all later layers. ``replacement``:
    see :func:`patch_batch` (None: the reference prompts' z)."""
    names = z_sites(model)
    B, T = clean.shape
    if replacement is None:
        with torch.no_grad():
            _, ref_cache = model.run_with_cache(ref, names, last_only=True)
    else:
        ref_cache = replacement_cache(model, replacement, (B, T))
    dtype = next(model.parameters()).dtype
    offsets = {
        name: torch.zeros(B, T, model.cfg.n_head, model.cfg.d_head, dtype=dtype,
                          device=clean.device, requires_grad=True)
        for name in names
    }  # fmt: skip
    clean_z: dict[str, torch.Tensor] = {}

    def add_offset(name):
        def fn(z):
            clean_z[name] = z.detach()
            return z + offsets[name]

        return fn

    with torch.enable_grad(), model.hooks({n: add_offset(n) for n in names}):
        clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
        grads = torch.autograd.grad(clean_ld.sum(), [offsets[n] for n in names])
    clean_ld = clean_ld.detach()
    estimate = torch.stack(
        [
            torch.einsum("bthk,bthk->bh", ref_cache[n].double() - clean_z[n].double(), g.double())
            for n, g in zip(names, grads, strict=True)
        ],
        dim=1,
    )  # (B, L, H)
    if progress is not None:
        progress(len(names) * model.cfg.n_head)
    return clean_ld, clean_ld[:, None, None] + estimate


# --------------------------------------------------------------------------- perturbations
@torch.no_grad()
def patch_perturbations(
    model: GPT, clean: torch.Tensor, ref: torch.Tensor, layer: int
) -> torch.Tensor:
    """δ_{i,t} = W_O^i (z^ref_{i,t} − z_{i,t}) for every head i of ``layer`` (docs §11.2).

    ``clean``/``ref``: model ids (B, T) of equal length. Returns float64
    (batch, position, head, d_model).
    """
    name = site(layer, "attn.hook_z")
    _, clean_cache = model.run_with_cache(clean, [name], last_only=True)
    _, ref_cache = model.run_with_cache(ref, [name], last_only=True)
    write_maps = model.blocks[layer].attn.writer.write_maps()
    return head_perturbations(write_maps, clean_cache[name], ref_cache[name])


@torch.no_grad()
def perturbation_check(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    layer: int,
    delta: torch.Tensor | None = None,
) -> float:
    """Check C8: max |(patched attn out − clean attn out) − δ_i| over heads, positions, batch.

    The patched attention output comes from the real z patch through the model's own writer
    (site ``blocks.{l}.hook_attn_out``); δ from :func:`patch_perturbations` (or ``delta``).
    Its tolerance follows from the dtype and the largest |attention output| (two rounded W_O
    sums, ``analysis.tolerance``; docs §2.6, §11.2).
    """
    if delta is None:
        delta = patch_perturbations(model, clean, ref, layer)
    z_name, out_name = site(layer, "attn.hook_z"), site(layer, "hook_attn_out")
    _, ref_cache = model.run_with_cache(ref, [z_name], last_only=True)
    _, clean_cache = model.run_with_cache(clean, [out_name], last_only=True)
    worst = 0.0
    for head in range(model.cfg.n_head):
        with model.hooks({z_name: replace_head(head, ref_cache[z_name][:, :, head])}):
            _, patched_cache = model.run_with_cache(clean, [out_name], last_only=True)
        residual = (
            patched_cache[out_name].double() - clean_cache[out_name].double() - delta[:, :, head]
        )
        worst = max(worst, float(residual.abs().max()))
    return worst


@torch.no_grad()
def delta_patched_ld(
    model: GPT,
    clean: torch.Tensor,
    layer: int,
    delta: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
) -> torch.Tensor:
    """LD (B, H) when δ_h is added to layer ``layer``'s attention output, one head at a time.

    This is the patch expressed as its residual perturbation rather than a z swap; its
    drops must reproduce the z-patch effects (check C9, docs §11.2).
    """
    out_name = site(layer, "hook_attn_out")
    lds = []
    for head in range(delta.shape[2]):
        with model.hooks({out_name: add_to(delta[:, :, head])}):
            lds.append(logit_difference(model(clean, last_only=True), correct, incorrect))
    return torch.stack(lds, dim=1)


@torch.no_grad()
def delta_patch_layer(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    layer: int,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Everything leakage needs from one batch and one layer (docs §11.2).

    Returns ``(delta, drops, c8)``: δ (B, T, H, D) float64 from :func:`patch_perturbations`;
    the drops LD_clean − LD_δ-patched (B, H) of :func:`delta_patched_ld` (check C9 compares
    their mean with the stored z-patch effects); and the C8 residual of
    :func:`perturbation_check`.
    """
    delta = patch_perturbations(model, clean, ref, layer)
    c8 = perturbation_check(model, clean, ref, layer, delta)
    clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
    drops = clean_ld[:, None] - delta_patched_ld(model, clean, layer, delta, correct, incorrect)
    return delta, drops, c8
