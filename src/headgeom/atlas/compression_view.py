"""The compression view of one model: which compressed variants the atlas scores, and how.

A :class:`Variant` is a method (``original``, ``int8``, ``int4``, ``int2``, ``low_rank``,
``prune``, ``mixed``) applied to a tensor group (``embedding``, ``ple_table``, ``attention``,
``mlp``, or ``all``: every one of those the model has), with a human-readable setting and its
size in bytes beside the group's size at 16 bits (the article's bf16 count). Its weights are
built only when it is scored (:meth:`Variant.build`), one variant in memory at a time.

:class:`Scorer` keeps the original model's next-token distributions on the scored windows
(:class:`~headgeom.atlas.measures.Reference`, once) and which probe items it gets right, then
scores whatever weights are loaded: full forwards (a compressed embedding changes layer 0's
input, so no clean prefix is reused), KL(original ‖ compressed), Δ top-1 and retention, the
sweep's measures (:mod:`headgeom.atlas.measures`).

Mixed precision (:func:`layer_sensitivity`): each layer's tensors of the compressed groups
alone at the base bits (a PLE table: that layer's slice), scored by KL on the sensitivity
corpus; the most sensitive layers keep the higher bits. Its rows are scored on every other
corpus (:func:`headgeom.atlas.compression.mixed_precision` refuses the same corpus).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.atlas import compression as comp
from headgeom.atlas import probes
from headgeom.atlas.blocks import AtlasModel
from headgeom.atlas.measures import (
    EffectSums,
    effects,
    mean_retention,
    probe_correct,
    reference,
    retention,
)
from headgeom.atlas.tensor_groups import Weights, family_and_module, stored_tensors

#: The groups the view compresses, in table order; ``all`` is every one of them present.
GROUPS = ("embedding", "ple_table", "attention", "mlp")
ALL = "all"
METHODS = ("original", "int8", "int4", "int2", "low_rank", "prune", "mixed")
BITS_METHODS = {8: "int8", 4: "int4", 2: "int2"}


# ------------------------------------------------------------------ variants
@dataclass(frozen=True)
class Variant:
    """One compressed model: ``build()`` gives (its weights, bytes, bytes at 16 bits);
    ``skip_corpus``: a corpus it is not scored on (mixed precision's sensitivity corpus)."""

    method: str
    group: str
    setting: str
    build: Callable[[], comp.Compression]
    skip_corpus: str | None = None


def present(weights: Weights, groups: Sequence[str]) -> list[str]:
    """The ``groups`` (``all`` expanded) that the model has tables or matrices in, in
    :data:`GROUPS` order."""
    unknown = sorted(set(groups) - set(GROUPS) - {ALL})
    if unknown:
        raise ValueError(f"unknown tensor groups {unknown}; known: {', '.join(GROUPS)}, {ALL}")
    wanted = set(GROUPS) if ALL in groups else set(groups)
    has = {weights.roles[n].group for n in weights.names(lambda r: r.kind in comp.MATRIX_KINDS)}
    return [g for g in GROUPS if g in wanted and g in has]


def dense_bytes_of(weights: Weights, groups: Sequence[str]) -> int:
    """Bytes of the groups' tables and matrices at 16 bits (the article's bf16 count)."""
    return sum(comp.dense_bytes(weights.tensors[n].shape) for g in groups
               for n in comp._matrices(weights, g))  # fmt: skip


def quantized(
    weights: Weights, groups: Sequence[str], bits: int, layer_bits: Mapping[int, int] | None = None
) -> comp.Compression:
    """Every group of ``groups`` quantised to ``bits`` (``layer_bits``: layers kept at other
    bits), the groups' bytes summed."""
    w, names, nbytes, dense = weights, (), 0, 0
    for g in groups:
        c = comp.quantize_group(w, g, bits, layer_bits=layer_bits)
        w, names = c.weights, names + c.names
        nbytes, dense = nbytes + c.nbytes, dense + c.dense_nbytes
    return comp.Compression(w, names, nbytes, dense)


def quantize_layer(weights: Weights, groups: Sequence[str], layer: int, bits: int) -> Weights:
    """Only ``layer``'s tables and matrices of ``groups`` quantised (a PLE table: its slice
    of that layer); everything else as it was."""
    changed = {}
    for g in groups:
        for name in comp._matrices(weights, g):
            role, w = weights.roles[name], weights.tensors[name]
            if role.group == "ple_table":
                cols = comp.ple_slices(weights, name)[layer]
                out = w.clone()
                out[:, cols] = comp.quantize(w[:, cols], bits).values
                changed[name] = out
            elif role.layer == layer:
                changed[name] = comp.quantize(w, bits).values
    return weights.replace(changed)


def _bits_name(bits: int) -> str:
    return f"int{bits}" if bits < comp.DENSE_BITS else "16-bit"


def variants(weights: Weights, cfg: Mapping, counts: np.ndarray | None) -> Iterator[Variant]:
    """The variants of the config block ``compression`` (workflow/schemas/atlas.schema.yaml)
    except mixed precision (:func:`mixed_variants`: it needs the sensitivities first).
    ``counts``: token counts of the counting corpus (vocabulary pruning)."""
    everything = dense_bytes_of(weights, present(weights, [ALL]))
    yield Variant("original", ALL, "as loaded, counted at 16 bits",
                  lambda: comp.Compression(weights, (), everything, everything))  # fmt: skip
    groups = present(weights, cfg["groups"])
    for bits in cfg["bits"]:
        for g in groups:
            yield Variant(BITS_METHODS[bits], g, f"int{bits}, groups of {comp.GROUP}, min-max",
                          lambda g=g, bits=bits: quantized(weights, [g], bits))  # fmt: skip
        if len(groups) > 1:
            yield Variant(BITS_METHODS[bits], ALL, f"int{bits}, groups of {comp.GROUP}, min-max",
                          lambda bits=bits: quantized(weights, groups, bits))  # fmt: skip
    lr = cfg["low_rank"]
    for g in present(weights, lr["groups"]):
        side = min(min(weights.tensors[n].shape[-2:]) for n in comp._matrices(weights, g))
        ks = [k for k in lr["ks"] if k <= side]  # a larger k is no approximation
        # one SVD per table for every k (a 49,152 × 576 table: about a minute on one thread)
        every_k = functools.cache(lambda g=g, ks=tuple(ks): comp.low_rank_group(weights, g, ks))
        for k in ks:
            yield Variant("low_rank", g, f"rank {k}", lambda k=k, every_k=every_k: every_k()[k])
    pr = cfg["prune"]
    for g in present(weights, pr["groups"]):
        (name,) = [n for n in comp._matrices(weights, g)]  # a vocabulary group is one table
        for n_keep in pr["ns"]:
            for bits in pr["bits"]:
                setting = (f"{n_keep:,} most frequent tokens of {pr['counting_corpus']}, "
                           f"{_bits_name(bits)}, the rest read the mean row")  # fmt: skip
                yield Variant("prune", g, setting, lambda name=name, n_keep=n_keep, bits=bits:
                              _pruned(weights, name, counts, n_keep, bits))  # fmt: skip


def _pruned(weights: Weights, name: str, counts, n_keep: int, bits: int) -> comp.Compression:
    rows = int(weights.tensors[name].shape[0])
    if counts is None or not 0 < n_keep <= rows:
        raise ValueError(f"compression.prune.ns: cannot keep {n_keep:,} of {name}'s {rows:,} rows")
    keep = comp.most_frequent(counts[:rows], n_keep)
    return comp.prune_vocabulary(weights, name, keep, bits=bits)


def mixed_variants(
    weights: Weights, cfg: Mapping, scores: Mapping[int, float], scored_on: Sequence[str]
) -> Iterator[Variant]:
    """Mixed precision: every group of ``cfg['groups']`` at ``mixed.bits``, the
    ``n_sensitive`` layers of largest ``scores`` at ``mixed.high_bits``, for each n."""
    mx = cfg["mixed"]
    groups = present(weights, cfg["groups"])
    for n in mx["n_sensitive"]:
        layer_bits = {}
        for corpus in scored_on:  # refuses the sensitivity corpus among the scored ones
            layer_bits = comp.mixed_precision(
                scores, n, mx["high_bits"], chosen_on=mx["sensitivity_corpus"], scored_on=corpus
            )
        kept = ", ".join(f"L{layer}" for layer in layer_bits) or "none"
        setting = (f"int{mx['bits']}, the {n} layers most sensitive on "
                   f"{mx['sensitivity_corpus']} at int{mx['high_bits']} ({kept})")  # fmt: skip
        yield Variant("mixed", ALL if len(groups) > 1 else groups[0], setting,
                      lambda lb=layer_bits: quantized(weights, groups, mx["bits"], lb),
                      skip_corpus=mx["sensitivity_corpus"])  # fmt: skip


# ------------------------------------------------------------------ scoring
def state_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the model's stored tensors (names, dtypes, shapes, bytes): the same before
    and after the view means the original weights are back."""
    _, module = family_and_module(model)
    h = hashlib.sha256()
    for name, t in stored_tensors(module).items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class _Batch:
    inputs: torch.Tensor
    ref: object  # measures.Reference


class Scorer:
    """The original model's distributions on the scored windows and its probe answers, kept
    once; :meth:`score` measures the weights loaded now against them."""

    @torch.no_grad()
    def __init__(
        self,
        model: AtlasModel,
        corpora: Mapping[str, torch.Tensor],
        skills: Sequence[probes.Skill],
        batch_size: int,
        kl_chunk: int,
        probe_rows: int,
    ):
        self.model, self.kl_chunk = model, kl_chunk
        self.batches: dict[str, list[_Batch]] = {}
        for name, windows in corpora.items():
            self.batches[name] = []
            for start in range(0, len(windows), batch_size):
                ids = windows[start : start + batch_size].to(model.device)
                inputs, targets = ids[:, :-1], ids[:, 1:]
                self.batches[name].append(_Batch(inputs, reference(model.logits(inputs), targets)))
        self.skills = [(s, probes.skill_batches(model, s, probe_rows)) for s in skills]
        self.base = {s.name: probes.base_correct(b) for s, b in self.skills}

    @torch.no_grad()
    def kl(self, corpus: str) -> float:
        """Mean KL(original ‖ now) on one corpus (the sensitivity pass)."""
        total = EffectSums()
        for b in self.batches[corpus]:
            total.add(effects(b.ref, self.model.logits(b.inputs), self.kl_chunk))
        return total.mean_kl

    @torch.no_grad()
    def score(self, skip_corpus: str | None = None) -> tuple[dict[str, EffectSums], dict]:
        """(corpus -> its KL and top-1 sums, skill -> retention) of the weights loaded now."""
        sums = {}
        for name, batches in self.batches.items():
            if name == skip_corpus:
                continue
            sums[name] = EffectSums()
            for b in batches:
                sums[name].add(effects(b.ref, self.model.logits(b.inputs), self.kl_chunk))
        kept = {}
        for skill, batches in self.skills:
            now = np.zeros(len(skill), dtype=bool)
            for b in batches:
                logits = self.model.logits(b.clean.ids, last_only=True)
                now[b.items] = probe_correct(logits, b.candidates, b.answer).cpu().numpy()
            kept[skill.name] = retention(self.base[skill.name], now)
        return sums, kept


def rows_of(variant: Variant, c: comp.Compression, sums: Mapping[str, EffectSums],
            kept: Mapping[str, float]) -> list[dict]:  # fmt: skip
    """The variant's rows: one per scored corpus and ``mean`` (each corpus weighs the same),
    each with the mean retention over skills (each capped at 1)."""
    common = {"method": variant.method, "group": variant.group, "setting": variant.setting,
              "bytes": int(c.nbytes), "bytes_original": int(c.dense_nbytes),
              "retention": mean_retention(kept)}  # fmt: skip
    rows = [{**common, "corpus": name, "kl": s.mean_kl, "delta_top1": s.delta_top1_points}
            for name, s in sums.items()]  # fmt: skip
    rows.append({**common, "corpus": "mean",
                 "kl": float(np.mean([r["kl"] for r in rows])),
                 "delta_top1": float(np.mean([r["delta_top1"] for r in rows]))})  # fmt: skip
    return rows


@torch.no_grad()
def layer_sensitivity(
    model: AtlasModel, weights: Weights, scorer: Scorer, groups: Sequence[str], bits: int,
    corpus: str,
) -> dict[int, float]:  # fmt: skip
    """Layer -> KL on ``corpus`` with only that layer's tensors of ``groups`` at ``bits``.
    Leaves the original weights loaded."""
    scores = {}
    try:
        for layer in weights.layers():
            quantize_layer(weights, groups, layer, bits).load_into(model.hf)
            scores[layer] = scorer.kl(corpus)
    finally:
        weights.load_into(model.hf)
    return scores


@torch.no_grad()
def run(
    model: AtlasModel,
    weights: Weights,
    todo: Sequence[Variant],
    scorer: Scorer,
    progress: Callable[[Variant], object] | None = None,
) -> list[dict]:
    """The rows of every variant, each loaded, scored and followed by the original weights."""
    rows = []
    try:
        for v in todo:
            c = v.build()
            c.weights.load_into(model.hf)
            sums, kept = scorer.score(v.skip_corpus)
            rows += rows_of(v, c, sums, kept)
            del c
            if progress is not None:
                progress(v)
    finally:
        weights.load_into(model.hf)
    return rows
