"""The two-checkpoint views scored: each variant's weights (a blend, a graft, a partial change
of :mod:`headgeom.atlas.checkpoints`) loaded into one model and measured against both ends.

:class:`PairScorer` keeps A's and B's next-token distributions on the scored windows
(:class:`~headgeom.atlas.measures.Reference`, each kept once: 16 · N · V bytes for N scored
positions and a vocabulary of V) and which probe items A gets right, then scores whatever
weights it is given (:meth:`PairScorer.score`): per corpus KL(A ‖ variant), KL(B ‖ variant)
and the variant's top-1 accuracy; per skill each item's answer (the candidate with the
largest logit at the prompt's final position), whether it is right, and its lead (the right
candidate's logit minus the best other candidate's). Every forward is a full one (a blend
changes every layer). :func:`scored_rows` folds a variant's scores into rows: one per corpus
and a ``mean`` (each corpus weighs the same), retention (of A's right items) and accuracy
over skills beside each.

The variants: :func:`graft_variants` (each tensor group, and each layer's norms or linear
weights, both ways), :func:`lowrank_variants` (top-k, random k-slice, fraction, minus top-k)
and the blend at each α (:func:`headgeom.atlas.checkpoints.blend`); :func:`drift_rows` needs no
forward.

The model is our GPT (any geometry) or a ``transformers`` causal LM the atlas knows
(:class:`LogitModel`); its own weights are put back after scoring
(:meth:`PairScorer.restore`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from headgeom.atlas import checkpoints as ck
from headgeom.atlas.blocks import AtlasModel, anatomy_of
from headgeom.atlas.measures import EffectSums, effects, mean_retention, reference, retention
from headgeom.atlas.model_source import load_module
from headgeom.atlas.probes import Skill
from headgeom.atlas.tensor_groups import Weights
from headgeom.model.gpt import GPT


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class LogitModel:
    """A model whose weights the views swap (``module``: what
    :meth:`~headgeom.atlas.tensor_groups.Weights.load_into` takes) and whose logits they read
    (``logits(ids, last_only)``: (B, T, V), or (B, V) at the final position)."""

    module: nn.Module
    logits: Callable[[torch.Tensor, bool], torch.Tensor]

    @classmethod
    def of(cls, module: nn.Module) -> LogitModel:
        """Our GPT, or a ``transformers`` causal LM (read as the atlas reads its blocks)."""
        if isinstance(module, GPT):
            return cls(module, lambda ids, last: module(ids, last_only=last))
        atlas = AtlasModel(module)
        return cls(atlas.hf, lambda ids, last: atlas.logits(ids, last_only=last))

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def context(self) -> int | None:
        """The longest input the model takes (None: not recorded)."""
        if isinstance(self.module, GPT):
            return int(self.module.cfg.n_ctx)
        cfg = self.module.config
        value = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        return None if value is None else int(value)


class PairError(ValueError):
    """Two checkpoints the views cannot compare (another family, a tensor missing or of
    another shape: named in the message)."""


def load_pair(cfg: Mapping, device: torch.device) -> tuple[LogitModel, Weights, Weights, dict]:
    """(A as the model the views load weights into, A's and B's weights, both source
    records) of a pair config (``AtlasStudy.pair_config``); our checkpoints are read as our
    GPT (any geometry), verified. Two checkpoints of different architectures are refused,
    naming the tensor."""
    a_module, a_record = load_module(cfg["a"], device, convert=False, known=anatomy_of)
    b_module, b_record = load_module(cfg["b"], device, convert=False, known=anatomy_of)
    a, b = Weights.of(a_module), Weights.of(b_module)
    try:
        ck.check_same_architecture(a, b)
    except ValueError as err:
        raise PairError(f"pair {cfg['name']}: A and B differ in architecture: {err}") from None
    return LogitModel.of(a_module), a, b, {"a": a_record, "b": b_record}


# ----------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class Answers:
    """One skill's items under one model: the answer's candidate index, right or not, and
    the lead of the right candidate over the best other one (each (N,))."""

    answer: np.ndarray
    correct: np.ndarray
    lead: np.ndarray


@dataclass(frozen=True)
class Scores:
    """One variant: per corpus (KL to A, KL to B; the variant's top-1 hits in both) and per
    skill its :class:`Answers`."""

    corpora: dict[str, tuple[EffectSums, EffectSums]]
    skills: dict[str, Answers]


@torch.no_grad()
def answers(last_logits: torch.Tensor, candidates: torch.Tensor, right: torch.Tensor) -> Answers:
    """The :class:`Answers` of items from their final-position logits (N, V), candidate
    tokens (N, K) and right candidate indices (N,): a tie is wrong (``measures.probe_correct``)."""
    picked = last_logits.double().gather(-1, candidates.to(last_logits.device))
    best = picked.gather(-1, right.to(picked.device)[:, None])[:, 0]
    others = picked.clone()
    others.scatter_(-1, right.to(picked.device)[:, None], -torch.inf)
    lead = best - others.amax(-1)
    return Answers(picked.argmax(-1).cpu().numpy(), (lead > 0).cpu().numpy(),
                   lead.cpu().numpy())  # fmt: skip


def _length_batches(skill: Skill, rows: int) -> Iterator[np.ndarray]:
    lengths = np.array([len(p) for p in skill.prompts])
    for length in sorted(set(lengths.tolist())):
        index = np.flatnonzero(lengths == length)
        for start in range(0, len(index), rows):
            yield index[start : start + rows]


class PairScorer:
    """A's and B's distributions on ``corpora`` (name -> scored windows (n, T), each scored
    at its T − 1 input positions) and the probe items of ``skills``, kept once; :meth:`score`
    measures other weights against them. Loads A and B into ``model`` to do so; call
    :meth:`restore` to put the model's own weights back."""

    @torch.no_grad()
    def __init__(
        self,
        model: LogitModel,
        a: Weights,
        b: Weights,
        corpora: Mapping[str, torch.Tensor],
        skills: Sequence[Skill],
        batch_size: int,
        kl_chunk: int,
        probe_rows: int,
    ):
        ck.check_same_architecture(a, b)
        self.model, self.a, self.b, self.kl_chunk = model, a, b, kl_chunk
        self.own = Weights.of(model.module)
        longest = max([w.shape[1] - 1 for w in corpora.values()]
                      + [len(p) for s in skills for p in s.prompts])  # fmt: skip
        if model.context is not None and longest > model.context:
            raise ValueError(
                f"inputs of {longest} tokens exceed the model's context of {model.context}: "
                f"set windows.n_ctx to at most {model.context + 1}"
            )
        self.batches: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for name, windows in corpora.items():
            if windows.ndim != 2 or windows.shape[1] < 2:
                raise ValueError(
                    f"corpus {name!r}: windows {tuple(windows.shape)}, need (n, T ≥ 2)"
                )
            self.batches[name] = [
                (w[:, :-1].to(model.device), w[:, 1:].to(model.device))
                for w in windows.split(batch_size)
            ]
        self.skills = [
            (s, [(items, torch.as_tensor(np.stack([s.prompts[i] for i in items])),
                  torch.as_tensor(s.candidates[items]), torch.as_tensor(s.answer[items]))
                 for items in _length_batches(s, probe_rows)])
            for s in skills
        ]  # fmt: skip
        self.refs = {}
        for end, weights in (("a", a), ("b", b)):
            weights.load_into(model.module)
            self.refs[end] = {
                name: [reference(model.logits(x, False), y) for x, y in batches]
                for name, batches in self.batches.items()
            }
        self.base_correct = {n: s.correct for n, s in self.score(a).skills.items()}

    @torch.no_grad()
    def score(self, weights: Weights) -> Scores:
        """The :class:`Scores` of ``weights`` (left loaded)."""
        weights.load_into(self.model.module)
        per_corpus = {}
        for name, batches in self.batches.items():
            to_a, to_b = EffectSums(), EffectSums()
            for i, (x, _) in enumerate(batches):
                logits = self.model.logits(x, False)
                to_a.add(effects(self.refs["a"][name][i], logits, self.kl_chunk))
                to_b.add(effects(self.refs["b"][name][i], logits, self.kl_chunk))
            per_corpus[name] = (to_a, to_b)
        per_skill = {}
        for skill, batches in self.skills:
            n = len(skill)
            out = Answers(np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n))
            for items, ids, cand, right in batches:
                got = answers(self.model.logits(ids.to(self.model.device), True), cand, right)
                out.answer[items] = got.answer
                out.correct[items] = got.correct
                out.lead[items] = got.lead
            per_skill[skill.name] = out
        return Scores(per_corpus, per_skill)

    def restore(self) -> None:
        """Put the model's own weights back."""
        self.own.load_into(self.model.module)


def scored_rows(
    scores: Scores, base_correct: Mapping[str, np.ndarray], keys: Mapping
) -> list[dict]:
    """One row per corpus and a ``mean`` row (each corpus weighs the same): ``keys``, KL to A
    and to B, top-1, and over skills retention (of A's right items, each capped at 1) and
    accuracy, the same on every row."""
    kept = {n: retention(base_correct[n], s.correct) for n, s in scores.skills.items()}
    accuracy = [float(s.correct.mean()) for s in scores.skills.values()]
    common = {**keys, "retention": mean_retention(kept),
              "accuracy": float(np.mean(accuracy)) if accuracy else float("nan")}  # fmt: skip
    rows = [{**common, "corpus": name, "kl_to_a": to_a.mean_kl, "kl_to_b": to_b.mean_kl,
             "top1": to_a.top1_edited / to_a.n}
            for name, (to_a, to_b) in scores.corpora.items()]  # fmt: skip
    mean = {q: float(np.mean([r[q] for r in rows])) for q in ("kl_to_a", "kl_to_b", "top1")}
    return [*rows, {**common, "corpus": "mean", **mean}]


def probe_rows(
    scores: Scores, skills: Sequence[Skill], decode: Callable[[Sequence[int]], str], keys: Mapping
) -> list[dict]:
    """One row per probe item: ``keys``, skill, item, its label, prompt and right candidate
    as text, the answer's text, right or not, the lead."""
    rows = []
    for skill in skills:
        got = scores.skills[skill.name]
        for i, prompt in enumerate(skill.prompts):
            cand = skill.candidates[i]
            rows.append({
                **keys, "skill": skill.name, "item": i, "probe": f"{skill.name} {i}",
                "prompt": decode(prompt.tolist()),
                "expected": decode([int(cand[skill.answer[i]])]),
                "answer": decode([int(cand[got.answer[i]])]),
                "correct": bool(got.correct[i]), "lead": float(got.lead[i]),
            })  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- variants
def graft_variants(
    a: Weights, b: Weights, groups: bool, layers: bool
) -> Iterator[tuple[dict, Weights]]:
    """(keys, weights) of every graft: for each direction (``b_into_a``: A with B's tensors,
    ``a_into_b``: B with A's), each tensor group whole (``groups``) and each layer's norms
    and linear weights (``layers``)."""
    for direction, base, donor in (("b_into_a", a, b), ("a_into_b", b, a)):
        if groups:
            for group, names in ck.group_grafts(base).items():
                keys = {"direction": direction, "group": group, "layer": -1, "part": "group",
                        "n_tensors": len(names)}  # fmt: skip
                yield keys, ck.graft(base, donor, names)
        if layers:
            for (layer, part), names in ck.layer_grafts(base).items():
                keys = {"direction": direction, "group": "layer", "layer": layer, "part": part,
                        "n_tensors": len(names)}  # fmt: skip
                yield keys, ck.graft(base, donor, names)


def delta_share(a: Weights, b: Weights, w: Weights) -> float:
    """Σ‖W − W_A‖² / Σ‖W_B − W_A‖² over the linear layers (NaN when none moved)."""
    kept = moved = 0.0
    for name in a.names(lambda role: role.kind == "linear"):
        x = a.tensors[name].double()
        kept += float((w.tensors[name].double() - x).pow(2).sum())
        moved += float((b.tensors[name].double() - x).pow(2).sum())
    return kept / moved if moved > 0 else float("nan")


def lowrank_variants(
    a: Weights, b: Weights, ks: Sequence[int], fractions: Sequence[float], minus_top: bool,
    seed: int,
) -> Iterator[tuple[dict, Weights]]:  # fmt: skip
    """(keys, weights) of the partial changes (:func:`headgeom.atlas.checkpoints.partial_change`):
    top-k and random k-slice for each k, each fraction, and B minus its top-k (``minus_top``)."""
    todo = [("top", k, None) for k in ks] + [("random", k, None) for k in ks]
    todo += [("fraction", None, f) for f in fractions]
    todo += [("minus_top", k, None) for k in ks] if minus_top else []
    for mode, k, f in todo:
        w = ck.partial_change(a, b, mode, k=k, fraction=f, seed=seed)
        yield {"mode": mode, "k": k, "fraction": f, "delta_share": delta_share(a, b, w)}, w


def drift_rows(a: Weights, b: Weights) -> pd.DataFrame:
    """One row per tensor: its name, group, kind, layer (-1 outside the layers), ‖W_A‖,
    ‖W_B − W_A‖ and the drift (:func:`headgeom.atlas.checkpoints.drift`)."""
    drift = ck.drift(a, b)
    rows = []
    for name, x in a.tensors.items():
        role = a.roles[name]
        rows.append({
            "tensor": name, "group": role.group, "kind": role.kind,
            "layer": -1 if role.layer is None else role.layer,
            "norm_a": float(torch.linalg.vector_norm(x.double())),
            "norm_delta": float(torch.linalg.vector_norm(b.tensors[name].double() - x.double())),
            "drift": drift[name],
        })  # fmt: skip
    return pd.DataFrame(rows)
