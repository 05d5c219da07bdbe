"""What an edit costs, and the per-layer profile (the article's measurements; ATLAS.md
"Per-layer profile", "Effects of an edit").

Effects, per corpus and averaged over corpora:

* KL(original ‖ edited) of next-token distributions, Σ_v p_v (log p_v − log q_v) of float64
  log-softmaxes (:func:`headgeom.divergence.kl_of_logp`), averaged over positions;
* Δ top-1: the change in next-token accuracy on the text, in percentage points;
* skill retention: the share of a skill's probe items the original model gets right that
  the edited model still gets right (:func:`retention`); for a skill scored as an accuracy
  ratio (raw text), edited ÷ original accuracy (:func:`accuracy_ratio`); the summary is the
  mean over skills, each capped at 1 (:func:`mean_retention`).

The profile, per layer (positions t ≥ 1, as the means of Average; :class:`ProfileSums`):

* write size = RMS(write) / RMS(stream entering the layer);
* constant part = ‖mean write‖² / mean ‖write‖² (1: a fixed vector; ``headgeom.writes``);
* volume knob = RMS of the block's post-norm gain, where the write is a norm's output;
* old state carried = RMS(in) / RMS(in + the layer's writes), ``in`` the stream entering the
  layer (before Gemma 4's layer scalar; Gemma 3n: the active stream, while its PLE write
  lands on the other streams, so there the ratio is approximate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from headgeom.atlas.blocks import AtlasModel, Block
from headgeom.divergence import kl_of_logp
from headgeom.writes import constant_from

#: Positions the profile averages over.
PROFILE_POSITIONS = "t >= 1 of each window (position 0 excluded)"


# ----------------------------------------------------------------------------- effects
@dataclass
class EffectSums:
    """Running sums of one edit on one corpus: Σ KL over positions, top-1 hits of the
    original and the edited model, positions."""

    kl: float = 0.0
    top1_base: int = 0
    top1_edited: int = 0
    n: int = 0

    def add(self, other: EffectSums) -> None:
        self.kl += other.kl
        self.top1_base += other.top1_base
        self.top1_edited += other.top1_edited
        self.n += other.n

    @property
    def mean_kl(self) -> float:
        return self.kl / self.n if self.n else float("nan")

    @property
    def delta_top1_points(self) -> float:
        """Edited − original next-token accuracy, in percentage points."""
        return 100.0 * (self.top1_edited - self.top1_base) / self.n if self.n else float("nan")


@dataclass(frozen=True)
class Reference:
    """The original model's next-token distributions at N positions, kept once for every
    edit scored against them: log p and p (N, V) float64 (16·N·V bytes), the next tokens
    (N,) and the original's top-1 hits."""

    logp: torch.Tensor
    p: torch.Tensor
    targets: torch.Tensor
    top1: int


@torch.no_grad()
def reference(base_logits: torch.Tensor, targets: torch.Tensor) -> Reference:
    """The :class:`Reference` of logits (..., V) and their next tokens (...)."""
    if base_logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(base_logits.shape)} and targets {tuple(targets.shape)} do not "
            "describe the same positions"
        )
    flat = base_logits.reshape(-1, base_logits.shape[-1])
    logp = torch.log_softmax(flat.double(), -1)
    t = targets.reshape(-1).to(flat.device)
    return Reference(logp, logp.exp(), t, int((flat.argmax(-1) == t).sum()))


@torch.no_grad()
def effects(ref: Reference, edited_logits: torch.Tensor, chunk: int) -> EffectSums:
    """KL(original ‖ edited) summed over the reference's positions and both models' top-1
    hits, from the edited logits (..., V) of the same positions, ``chunk`` positions at a
    time (a float64 log-softmax of chunk × V each)."""
    edited = edited_logits.reshape(-1, edited_logits.shape[-1])
    if edited.shape != ref.logp.shape:
        raise ValueError(
            f"edited logits {tuple(edited_logits.shape)} do not describe the reference's "
            f"{tuple(ref.logp.shape)} positions"
        )
    out = EffectSums(top1_base=ref.top1, n=len(ref.targets))
    for start in range(0, len(edited), chunk):
        s = slice(start, start + chunk)
        logq = torch.log_softmax(edited[s].double(), -1)
        out.kl += float(kl_of_logp(ref.logp[s], logq, ref.p[s]).sum())
        out.top1_edited += int((edited[s].argmax(-1) == ref.targets[s]).sum())
    return out


def next_token_effects(
    base_logits: torch.Tensor, edited_logits: torch.Tensor, targets: torch.Tensor, chunk: int
) -> EffectSums:
    """:func:`effects` of one edit, its :func:`reference` made here."""
    if base_logits.shape != edited_logits.shape:
        raise ValueError(
            f"logits {tuple(base_logits.shape)} and {tuple(edited_logits.shape)} do not "
            "describe the same positions"
        )
    return effects(reference(base_logits, targets), edited_logits, chunk)


def corpus_summary(per_corpus: Mapping[str, EffectSums]) -> dict[str, float]:
    """KL and Δ top-1 averaged over corpora (each corpus weighs the same, whatever its
    length), beside each corpus's own."""
    out: dict[str, float] = {}
    for name, sums in per_corpus.items():
        out[f"kl_{name}"] = sums.mean_kl
        out[f"delta_top1_{name}"] = sums.delta_top1_points
    kls = [s.mean_kl for s in per_corpus.values()]
    deltas = [s.delta_top1_points for s in per_corpus.values()]
    out["kl"] = float(np.mean(kls)) if kls else float("nan")
    out["delta_top1"] = float(np.mean(deltas)) if deltas else float("nan")
    return out


# ----------------------------------------------------------------------------- retention
def probe_correct(last_logits: torch.Tensor, candidates: torch.Tensor, answer: torch.Tensor):
    """(N,) bool: item n is right when its answer ``answer[n]`` has the largest logit among
    its candidate tokens ``candidates[n]`` (N, K) at the final position (``last_logits``
    (N, V)); a tie is wrong."""
    picked = last_logits.gather(-1, candidates.to(last_logits.device))
    best = picked.gather(-1, answer.to(picked.device)[:, None])[:, 0]
    others = picked.clone()
    others.scatter_(-1, answer.to(picked.device)[:, None], -math.inf)
    return best > others.amax(-1)


def retention(base_correct: np.ndarray, edited_correct: np.ndarray) -> float:
    """The share of the items the original model gets right that the edited model still
    gets right; NaN when the original gets none right."""
    base, edited = np.asarray(base_correct, bool), np.asarray(edited_correct, bool)
    if base.shape != edited.shape:
        raise ValueError(f"retention: {base.shape} original and {edited.shape} edited items")
    right = int(base.sum())
    return float((base & edited).sum() / right) if right else float("nan")


def accuracy_ratio(base_accuracy: float, edited_accuracy: float) -> float:
    """Edited ÷ original accuracy (the article's retention of induction and raw text); NaN
    when the original's is 0."""
    return edited_accuracy / base_accuracy if base_accuracy > 0 else float("nan")


def mean_retention(per_skill: Mapping[str, float]) -> float:
    """The mean over skills of each skill's retention capped at 1; skills without a defined
    retention (NaN: the original model gets none of its items right) are left out."""
    values = [min(v, 1.0) for v in per_skill.values() if not math.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


# ----------------------------------------------------------------------------- profile
@dataclass
class _Write:
    sum_w: torch.Tensor | float = 0.0
    sum_sq: float = 0.0


@dataclass
class ProfileSums:
    """Streamed moments of unedited forwards: per layer Σ‖in‖², Σ‖in + Σ_k w_k‖² and the
    position count, per block Σ w and Σ‖w‖²."""

    n_layer: int
    stream_sq: np.ndarray = field(init=False)
    after_sq: np.ndarray = field(init=False)
    count: np.ndarray = field(init=False)
    writes: dict[Block, _Write] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stream_sq = np.zeros(self.n_layer)
        self.after_sq = np.zeros(self.n_layer)
        self.count = np.zeros(self.n_layer, dtype=np.int64)

    def add_layer(self, layer: int, stream: torch.Tensor, writes: Mapping[str, torch.Tensor]):
        """One layer's stream entering it (..., D) and its blocks' writes (..., D) at the same
        positions (t ≥ 1 already selected)."""
        x = stream.double().reshape(-1, stream.shape[-1])
        total = x.clone()
        for kind, w in writes.items():
            w = w.double().reshape(-1, w.shape[-1])
            if w.shape != x.shape:
                raise ValueError(
                    f"L{layer}.{kind}: write {tuple(w.shape)}, stream {tuple(x.shape)}"
                )
            acc = self.writes.setdefault(Block(layer, kind), _Write())
            acc.sum_w = acc.sum_w + w.sum(dim=0)
            acc.sum_sq += float(w.pow(2).sum())
            total += w
        self.stream_sq[layer] += float(x.pow(2).sum())
        self.after_sq[layer] += float(total.pow(2).sum())
        self.count[layer] += len(x)

    def write_size(self, block: Block) -> float:
        den = self.stream_sq[block.layer]
        return math.sqrt(self.writes[block].sum_sq / den) if den > 0 else float("nan")

    def constant_part(self, block: Block) -> float:
        acc = self.writes[block]
        return constant_from(acc.sum_w, acc.sum_sq, int(self.count[block.layer]))

    def carried(self, layer: int) -> float:
        den = self.after_sq[layer]
        return math.sqrt(self.stream_sq[layer] / den) if den > 0 else float("nan")


def knob_rms(model: AtlasModel, block: Block) -> float:
    """RMS of the block's post-norm gain (the volume knob); NaN where it has none."""
    gain = model.knob(block)
    return float(gain.double().pow(2).mean().sqrt()) if gain is not None else float("nan")


@torch.no_grad()
def profile(model: AtlasModel, windows: torch.Tensor, batch_size: int) -> list[dict]:
    """One row per block: layer, kind, write size, constant part, volume knob, and the
    layer's old state carried, from unedited forwards of ``windows`` (n, T), positions t ≥ 1."""
    sums = ProfileSums(model.n_layer)
    seen: dict[int, dict] = {}

    def enter(layer: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[layer] = {"in": model.stream(hidden)[:, 1:]}

        return hook

    def write(block: Block):
        def hook(module, args, out):
            seen[block.layer][block.kind] = out[:, 1:]

        return hook

    def leave(layer: int):
        def hook(module, args, kwargs, out):
            got = seen.pop(layer)
            sums.add_layer(layer, got.pop("in"), got)

        return hook

    handles = []
    try:
        for layer, module in enumerate(model.layers):
            handles.append(module.register_forward_pre_hook(enter(layer), with_kwargs=True))
            handles.append(module.register_forward_hook(leave(layer), with_kwargs=True))
        for block in model.blocks():
            handles.append(model.write_module(block).register_forward_hook(write(block)))
        for start in range(0, len(windows), batch_size):
            ids = windows[start : start + batch_size].to(model.device)
            model.logits(ids, last_only=True)
    finally:
        for handle in handles:
            handle.remove()
    return [
        {
            "layer": b.layer,
            "block": b.kind,
            "label": b.label,
            "write_size": sums.write_size(b),
            "constant_part": sums.constant_part(b),
            "knob_rms": knob_rms(model, b),
            "old_state_carried": sums.carried(b.layer),
        }
        for b in model.blocks()
    ]
