"""Clamps: patch one source head while chosen components keep their clean values
(docs §13.3, §15.3).

A **case** is a source head i = (l, h), patched as in docs §10.1 (its z at every position
from the reference prompt), and a **clamp set** C: heads whose z, and layers whose MLP
output, are held at their value in the clean run while everything else recomputes. The
source may be None (nothing patched: check C12). The result is the patched logit
difference, so the drop Δ(C) = LD_clean − LD_patched,C and its mean over examples e_C.

The engine (:func:`clamp_patch`) is exact and batched over examples and cases:

* one clean and one reference forward per batch cache, per layer, the residual entering the
  block, z, k, v, the attention output and the MLP output (the patching engine's caches);
* a case resumes from the clean residual entering the source layer l (nothing before it
  depends on the patch), and layer l is the cached clean z with the source swapped;
* with prefix reuse (the registry's ``prefix_reuse``) only positions ≥ p, the batch's first
  clean/reference difference, are recomputed: before p the patch is a no-op, so every
  activation there, clamped or not, is the clean one;
* a layer whose heads are all clamped adds its cached clean attention output (no query, key
  or value is computed); a clamped MLP adds its cached clean output (``Block.after_attn``);
  once no later layer computes attention, only the final position is carried;
* cases with the same clamp pattern per layer share forwards (rows = case × example, at most
  ``max_rows`` rows each); a partially clamped layer selects clean z per row.

Architectures with layer resumption but without prefix reuse run the same resumption on
whole sequences through the model's hook sites. Architectures without layer resumption (the
registry's ``fast_patching``: any transformers causal LM) run every case as one whole forward
of the model's own code from the token ids, the source swap and every clamp set by the hook
sites, and read the logits it returns (:func:`_whole_forward`). Whether a model has MLP
outputs to clamp is the registry's answer (its ``hook_mlp_out`` site), never a probe of the
model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.heads.analysis.batching import (
    check_pairs,
    length_batches,
    model_device,
    patch_in_batches,
    stack_rows,
)
from headgeom.heads.analysis.patching import (
    _first_differences,
    _last_logit_difference,
    logit_difference,
)
from headgeom.model import registry
from headgeom.model.gpt import site

Head = tuple[int, int]


# --------------------------------------------------------------------------- clamp sets
@dataclass(frozen=True)
class ClampSet:
    """Components held at their clean values: heads (layer, head) and MLP layers."""

    heads: frozenset[Head] = frozenset()
    mlps: frozenset[int] = frozenset()

    def __or__(self, other: ClampSet) -> ClampSet:
        return ClampSet(self.heads | other.heads, self.mlps | other.mlps)

    def without(self, head: Head) -> ClampSet:
        return ClampSet(self.heads - {head}, self.mlps)


NOTHING = ClampSet()


@dataclass(frozen=True)
class Case:
    """Patch ``source`` (None: nothing) with ``clamp`` held clean."""

    source: Head | None
    clamp: ClampSet = NOTHING


def _architecture(model: torch.nn.Module) -> registry.Architecture:
    arch = registry.architecture_of(model)
    if arch is None:
        raise ValueError(
            f"clamps need a registered architecture (its hook sites); the registry does not "
            f"declare {type(model).__name__}"
        )
    return arch


def has_mlps(model: torch.nn.Module) -> bool:
    """Whether the model's architecture has MLP outputs (the ``hook_mlp_out`` site)."""
    return "hook_mlp_out" in _architecture(model).sites


def heads_of_layers(model: torch.nn.Module, layers: Iterable[int]) -> ClampSet:
    return ClampSet(heads=frozenset((j, h) for j in layers for h in range(model.cfg.n_head)))


def later_heads(model: torch.nn.Module, layer: int) -> ClampSet:
    """Every head of the layers after ``layer`` (docs §15.3 "later heads")."""
    return heads_of_layers(model, range(layer + 1, model.cfg.n_layer))


def mlps_from(model: torch.nn.Module, layer: int) -> ClampSet:
    """Every MLP from ``layer`` on, its own included (docs §13.3, §15.3); empty for an
    architecture without MLPs."""
    if not has_mlps(model):
        return NOTHING
    return ClampSet(mlps=frozenset(range(layer, model.cfg.n_layer)))


def everything(model: torch.nn.Module) -> ClampSet:
    """Every head and every MLP (check C12)."""
    return heads_of_layers(model, range(model.cfg.n_layer)) | mlps_from(model, 0)


def same_index_later(model: torch.nn.Module, layer: int, index: int) -> ClampSet:
    """The heads of index ``index`` in the layers after ``layer`` (the lumped lane clamp)."""
    return ClampSet(heads=frozenset((j, index) for j in range(layer + 1, model.cfg.n_layer)))


def _check_case(model: torch.nn.Module, case: Case, mlps: bool) -> None:
    L, H = model.cfg.n_layer, model.cfg.n_head
    heads = list(case.clamp.heads) + ([case.source] if case.source is not None else [])
    bad = [x for x in heads if not (0 <= x[0] < L and 0 <= x[1] < H)]
    bad_mlps = [m for m in case.clamp.mlps if not 0 <= m < L]
    if bad or bad_mlps:
        raise ValueError(f"{case}: heads {bad} / MLP layers {bad_mlps} outside the {L}×{H} model")
    if case.clamp.mlps and not mlps:
        raise ValueError(f"{case}: the architecture has no MLP outputs to clamp")
    if case.source is not None and case.source in case.clamp.heads:
        raise ValueError(f"{case}: the source head cannot also be clamped")


# --------------------------------------------------------------------------- plans
_NONE, _SOME, _ALL = 0, 1, 2


def _plan(model, case: Case) -> tuple[int, tuple[tuple[int, bool], ...]]:
    """(start layer, per layer ≥ start: (head state, MLP clamped)); the batching key."""
    L, H = model.cfg.n_layer, model.cfg.n_head
    start = 0 if case.source is None else case.source[0]
    steps = []
    for j in range(start, L):
        n = sum((j, h) in case.clamp.heads for h in range(H))
        state = _NONE if n == 0 else _ALL if n == H else _SOME
        if case.source is not None and j == start:
            state = _NONE  # the source layer's z is given, its other heads are clean anyway
        steps.append((state, j in case.clamp.mlps))
    return start, tuple(steps)


def _head_mask(model, cases: Sequence[Case], layer: int, device) -> torch.Tensor:
    H = model.cfg.n_head
    mask = [[(layer, h) in c.clamp.heads for h in range(H)] for c in cases]
    return torch.tensor(mask, dtype=torch.bool, device=device)  # (G, H)


# --------------------------------------------------------------------------- the engine
class _Caches:
    """What one batch's clean and reference forwards leave for every case."""

    def __init__(self, model, clean, ref, mlps: bool, reuse: bool, prefix: bool = True):
        L = model.cfg.n_layer
        names = [site(j, n) for j in range(L) for n in ("hook_resid_pre", "attn.hook_z")]
        names += [site(j, "hook_attn_out") for j in range(L)]
        names += [site(j, "hook_mlp_out") for j in range(L)] if mlps else []
        names += [site(j, f"attn.hook_{x}") for j in range(L) for x in "kv"] if reuse else []
        self.logits, self.clean = model.run_with_cache(clean, names + ["hook_resid_final"], True)
        _, self.ref = model.run_with_cache(ref, [site(j, "attn.hook_z") for j in range(L)], True)
        T = clean.shape[1]
        if reuse and prefix:
            differ = (clean != ref).any(dim=0).nonzero()
            self.p = min(int(differ[0]) if len(differ) else T, T - 1)
        else:
            self.p = 0
        self.T = T

    def get(self, layer: int, name: str) -> torch.Tensor:
        return self.clean[site(layer, name)]


def _rows(t: torch.Tensor, G: int) -> torch.Tensor:
    """(b', ...) -> (G·b', ...): row g·b' + b holds example b (a copy)."""
    return t.expand(G, *t.shape).flatten(0, 1)


def _suffix_forward(model, caches: _Caches, start, steps, cases, examples: slice, shortcuts):
    """Residual (G·b', S', D) leaving the last block for ``cases`` (one plan) on
    ``examples``, by the prefix-reuse route (see the module docstring)."""
    L = model.cfg.n_layer
    G, device = len(cases), caches.logits.device
    p, T = caches.p, caches.T
    source = cases[0].source is not None
    steps = [(_SOME if (s == _ALL and not shortcuts) else s, m) for s, m in steps]
    computes = [not (source and k == 0) and s != _ALL for k, (s, _) in enumerate(steps)]
    # full suffix needed at a layer's input iff it or a later layer computes attention
    full_in = [any(computes[k:]) for k in range(len(steps))] + [False]
    b = examples.stop - examples.start
    x = None
    for k, (state, mlp) in enumerate(steps):
        j = start + k
        block = model.blocks[j]
        out_full = full_in[k + 1]
        span = slice(p, T) if out_full else slice(T - 1, T)
        if x is None:  # the residual entering the start layer
            x = _rows(caches.get(j, "hook_resid_pre")[examples, p if full_in[k] else T - 1 :], G)
        if source and k == 0:
            z = caches.get(j, "attn.hook_z")[examples, span]
            z = z.expand(G, *z.shape).clone()  # (G, b', S', H, d)
            heads = torch.tensor([c.source[1] for c in cases], device=device)
            z_ref = caches.ref[site(j, "attn.hook_z")][examples, span]
            z[torch.arange(G, device=device), :, :, heads] = z_ref[:, :, heads].permute(2, 0, 1, 3)
            attn_out = block.attn.writer(z.flatten(0, 1))
            x = x if out_full else x[:, -1:]
        elif state == _ALL:
            x = x if out_full else x[:, -1:]
            attn_out = _rows(caches.get(j, "hook_attn_out")[examples, span], G)
        else:
            past_k = caches.get(j, "attn.hook_k")[examples, :p]
            past_v = caches.get(j, "attn.hook_v")[examples, :p]
            x = block.hook_resid_pre(x)
            z, _, _ = block.attn.z_suffix(x, past_k, past_v, last_only=not out_full)
            if state == _SOME:
                mask = _head_mask(model, cases, j, device).repeat_interleave(b, dim=0)
                clean_z = _rows(caches.get(j, "attn.hook_z")[examples, span], G)
                z = torch.where(mask[:, None, :, None], clean_z, z)
            attn_out = block.attn.writer(z)
            x = x if out_full else x[:, -1:]
        mlp_out = _rows(caches.get(j, "hook_mlp_out")[examples, span], G) if mlp else None
        x = block.after_attn(x, attn_out, mlp_out)
    assert j == L - 1
    return x


def _clamp_hooks(model, caches: _Caches, start, steps, cases, examples: slice) -> dict:
    """The hook-site functions of one plan: the source's z swapped for the reference one,
    clamped heads' z and clamped MLP outputs put back to their clean values, rows
    (case g, example b) at g·b' + b."""
    G, device = len(cases), caches.logits.device
    b = examples.stop - examples.start
    fns: dict[str, Callable] = {}
    for k, (state, mlp) in enumerate(steps):
        j = start + k
        clean_z = _rows(caches.get(j, "attn.hook_z")[examples], G)
        if cases[0].source is not None and k == 0:
            heads = torch.tensor([c.source[1] for c in cases], device=device).repeat_interleave(b)
            ref_z = _rows(caches.ref[site(j, "attn.hook_z")][examples], G)
            rows = torch.arange(G * b, device=device)

            def swap(z, heads=heads, ref_z=ref_z, rows=rows):
                z = z.clone()
                z[rows, :, heads] = ref_z[rows, :, heads]
                return z

            fns[site(j, "attn.hook_z")] = swap
        elif state != _NONE:
            mask = _head_mask(model, cases, j, device).repeat_interleave(b, dim=0)

            def clamp_z(z, mask=mask, clean_z=clean_z):
                return torch.where(mask[:, None, :, None], clean_z, z)

            fns[site(j, "attn.hook_z")] = clamp_z
        if mlp:
            clean_mlp = _rows(caches.get(j, "hook_mlp_out")[examples], G)
            fns[site(j, "hook_mlp_out")] = lambda _, clean_mlp=clean_mlp: clean_mlp
    return fns


def _hooked_forward(model, caches: _Caches, start, steps, cases, examples: slice):
    """The same on whole sequences through the hook sites (no prefix reuse)."""
    x = _rows(caches.get(start, "hook_resid_pre")[examples], len(cases))
    with model.hooks(_clamp_hooks(model, caches, start, steps, cases, examples)):
        for block in model.blocks[start:]:
            x = block(x)
    return x


def _whole_forward(model, caches: _Caches, clean, start, steps, cases, examples: slice):
    """Final-position logits (G·b', V) of one plan by whole forwards of the model from the
    token ids, every intervention at its hook site (no layer resumption)."""
    with model.hooks(_clamp_hooks(model, caches, start, steps, cases, examples)):
        return model(_rows(clean[examples], len(cases)), last_only=True)


@torch.no_grad()
def clamp_batch(
    model,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    cases: Sequence[Case],
    max_rows: int,
    prefix_reuse: bool = True,
    shortcuts: bool = True,
    readout: Callable | None = None,
    logit_readout: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean LD (B,) and the LD of every case (B, C) for one batch of equal-length prompts.

    ``readout(x, good, bad)`` maps the residual leaving the last block (R, S, D) to one value
    per row (default: the answer logit difference at the final position); without layer
    resumption ``logit_readout(logits, good, bad)`` maps the final-position logits (R, V)
    instead (default: the same difference). ``shortcuts=False`` treats fully clamped layers
    as partially clamped (computed, then every z selected clean): check C12 runs both routes.
    """
    arch = _architecture(model)
    mlps = "hook_mlp_out" in arch.sites
    for case in cases:
        _check_case(model, case, mlps)
    reuse = arch.prefix_reuse
    caches = _Caches(model, clean, ref, mlps, reuse, prefix_reuse)
    resume = arch.fast_patching
    readout = readout or (_last_logit_difference(model) if resume else None)
    logit_readout = logit_readout or logit_difference
    clean_ld = logit_difference(caches.logits, correct, incorrect)
    B = clean.shape[0]
    out = torch.empty(B, len(cases), dtype=torch.float64, device=clean.device)
    groups: dict[tuple, list[int]] = {}
    for c, case in enumerate(cases):
        groups.setdefault((case.source is None, *_plan(model, case)), []).append(c)
    step = max(1, int(max_rows))
    n_ex = min(B, step)
    n_cases = max(1, step // n_ex)
    for (_, start, steps), members in groups.items():
        for e0 in range(0, B, n_ex):
            examples = slice(e0, min(B, e0 + n_ex))
            for c0 in range(0, len(members), n_cases):
                chunk = members[c0 : c0 + n_cases]
                group = [cases[c] for c in chunk]
                G = len(chunk)
                good, bad = correct[examples].repeat(G), incorrect[examples].repeat(G)
                if not resume:
                    logits = _whole_forward(model, caches, clean, start, steps, group, examples)
                    values = logit_readout(logits, good, bad).view(G, -1).T
                    out[examples, torch.tensor(chunk, device=clean.device)] = values.double()
                    continue
                if reuse:
                    x = _suffix_forward(model, caches, start, steps, group, examples, shortcuts)
                else:
                    x = _hooked_forward(model, caches, start, steps, group, examples)
                values = readout(x, good, bad).view(G, -1).T
                out[examples, torch.tensor(chunk, device=clean.device)] = values.double()
    return clean_ld, out


def clamp_patch(
    model,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    cases: Sequence[Case],
    batch_size: int,
    max_rows: int,
    prefix_reuse: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Every case on every example: ``(clean_ld (N,), patched_ld (N, C))`` float64 in input
    order (examples grouped by length, sorted by first difference for prefix reuse)."""

    def run(model, clean, ref, good, bad, progress):
        return clamp_batch(model, clean, ref, good, bad, cases, max_rows, prefix_reuse)

    return patch_in_batches(
        model,
        clean_ids,
        ref_ids,
        correct,
        incorrect,
        batch_size,
        None,
        run,
        order=_first_differences,
        shape=(len(cases),),
    )


# --------------------------------------------------------------------------- checks
def _vocab_logits(model, chunk: int = 4096) -> Callable:
    """Readout of every vocabulary logit at the final position (R, V), through the model's
    ``answer_logits`` in vocabulary chunks."""
    n_vocab = model.cfg.n_vocab

    def readout(x, good, bad):
        parts = []
        for v0 in range(0, n_vocab, chunk):
            ids = torch.arange(v0, min(n_vocab, v0 + chunk), device=x.device)
            parts.append(model.answer_logits(x, ids.expand(x.shape[0], -1)))
        return torch.cat(parts, dim=1)

    return readout


@torch.no_grad()
def check_c12(model, clean_ids, ref_ids, correct, incorrect, batch_size=128) -> tuple[float, float]:
    """Check C12: max |logit| difference, over examples and the whole vocabulary, between the
    clean run and every component clamped with nothing patched, by both engine routes
    (fully clamped layers shortcut, and computed then selected clean), both read out from
    the residual leaving the last block by the same ``answer_logits``. Returns the residual
    and the largest |clean logit| (the scale of its tolerance, ``analysis.tolerance``)."""
    lengths = check_pairs(clean_ids, ref_ids, correct, incorrect)
    device = model_device(model)
    arch = _architecture(model)
    case = Case(None, everything(model))
    if not arch.fast_patching:  # one route: whole forwards, their logits
        return _check_c12_whole(model, clean_ids, ref_ids, lengths, case, batch_size, device)
    readout = _vocab_logits(model)
    worst, scale = 0.0, 0.0
    good = torch.as_tensor(np.array(correct, dtype=np.int64), device=device)
    bad = torch.as_tensor(np.array(incorrect, dtype=np.int64), device=device)
    for index in length_batches(lengths, batch_size):
        clean = stack_rows(clean_ids, index, device)
        ref = stack_rows(ref_ids, index, device)
        idx = torch.as_tensor(index, device=device)
        g, b = good[idx], bad[idx]
        caches = _Caches(model, clean, ref, has_mlps(model), arch.prefix_reuse)
        expected = readout(caches.clean["hook_resid_final"], g, b)
        scale = max(scale, float(expected.abs().max()))
        for shortcuts in (True, False):
            captured = []

            def keep(x, good, bad, captured=captured):
                captured.append(readout(x, good, bad))
                return torch.zeros(x.shape[0], device=x.device)

            clamp_batch(model, clean, ref, g, b, [case], len(index), True, shortcuts, keep)
            got = torch.cat(captured)
            worst = max(worst, float((got - expected).abs().max()))
    return worst, scale


def _check_c12_whole(model, clean_ids, ref_ids, lengths, case, batch_size, device):
    """Check C12 without layer resumption: every vocabulary logit at the final position of
    the whole forward with every head and MLP clamped against the clean forward's."""
    worst, scale = 0.0, 0.0
    for index in length_batches(lengths, batch_size):
        clean = stack_rows(clean_ids, index, device)
        ref = stack_rows(ref_ids, index, device)
        caches = _Caches(model, clean, ref, has_mlps(model), False)
        start, steps = _plan(model, case)
        got = _whole_forward(model, caches, clean, start, steps, [case], slice(0, len(index)))
        scale = max(scale, float(caches.logits.abs().max()))
        worst = max(worst, float((got - caches.logits).abs().max()))
    return worst, scale


@torch.no_grad()
def direct_drops(model, clean_ids, ref_ids, correct, incorrect, sources, batch_size=128):
    """The direct term of each source (N, S) in closed form: the drop when only the source's
    own write δ_i = W_O(z_ref − z) at the final position is added to the clean residual
    leaving the last block (docs §15.3 "direct"); what both clamp conditions of check C13
    must reproduce. Without layer resumption the source's write is the change of its layer's
    attention output (``hook_attn_out``) at the final position under the z swap, and the
    drop is read from a clean whole forward with it added at ``hook_resid_final``: a norm
    after the output projection (Gemma) is then part of the write, as in the clamped
    forwards."""
    lengths = check_pairs(clean_ids, ref_ids, correct, incorrect)
    device = model_device(model)
    if not _architecture(model).fast_patching:
        return _direct_drops_whole(model, clean_ids, ref_ids, correct, incorrect, sources,
                                   lengths, batch_size, device)  # fmt: skip
    ld_fn = _last_logit_difference(model)
    out = np.empty((len(lengths), len(sources)))
    good = torch.as_tensor(np.array(correct, dtype=np.int64), device=device)
    bad = torch.as_tensor(np.array(incorrect, dtype=np.int64), device=device)
    for index in length_batches(lengths, batch_size):
        idx = torch.as_tensor(index, device=device)
        clean, ref = stack_rows(clean_ids, index, device), stack_rows(ref_ids, index, device)
        caches = _Caches(model, clean, ref, False, False)
        final = caches.clean["hook_resid_final"][:, -1:]
        clean_ld = ld_fn(final, good[idx], bad[idx])
        for s, (layer, head) in enumerate(sources):
            z = caches.get(layer, "attn.hook_z")[:, -1:].clone()
            z[:, :, head] = caches.ref[site(layer, "attn.hook_z")][:, -1:, head]
            writer = model.blocks[layer].attn.writer
            delta = writer(z) - writer(caches.get(layer, "attn.hook_z")[:, -1:])
            out[index, s] = (clean_ld - ld_fn(final + delta, good[idx], bad[idx])).cpu().numpy()
    return out


def _direct_drops_whole(model, clean_ids, ref_ids, correct, incorrect, sources, lengths,
                        batch_size, device) -> np.ndarray:  # fmt: skip
    """:func:`direct_drops` by whole forwards through the hook sites."""
    out = np.empty((len(lengths), len(sources)))
    good = torch.as_tensor(np.array(correct, dtype=np.int64), device=device)
    bad = torch.as_tensor(np.array(incorrect, dtype=np.int64), device=device)
    for index in length_batches(lengths, batch_size):
        idx = torch.as_tensor(index, device=device)
        clean, ref = stack_rows(clean_ids, index, device), stack_rows(ref_ids, index, device)
        caches = _Caches(model, clean, ref, False, False)
        clean_ld = logit_difference(caches.logits, good[idx], bad[idx])
        for s, (layer, head) in enumerate(sources):
            name_z, name_out = site(layer, "attn.hook_z"), site(layer, "hook_attn_out")
            ref_z = caches.ref[name_z][:, :, head]

            def swap(z, ref_z=ref_z, head=head):
                z = z.clone()
                z[:, :, head] = ref_z
                return z

            with model.hooks({name_z: swap}):
                _, patched = model.run_with_cache(clean, [name_out], last_only=True)
            write = patched[name_out][:, -1] - caches.get(layer, "hook_attn_out")[:, -1]  # (B, D)

            def add(x, write=write):
                x = x.clone()
                x[:, -1] += write
                return x

            with model.hooks({"hook_resid_final": add}):
                logits = model(clean, last_only=True)
            out[index, s] = (clean_ld - logit_difference(logits, good[idx], bad[idx])).cpu().numpy()
    return out
