"""The atlas's skills: probe items scored from the logits at a prompt's final position
(nothing is sampled). An item is a prompt, its candidate answer tokens and the right one; it
is right when the right candidate has the largest logit among them
(:func:`headgeom.atlas.measures.probe_correct`). The workspace's three tasks are skills with
two candidates (the correct and the incorrect answer token of a task file, built with the
model's own tokenizer by ``headgeom.data.tasks``); a user's probe set is any list of items.

Prompts of one length run as one batch, so every clean run and edited forward of a skill is
a few batched forwards resumed at the edit's layer (:mod:`headgeom.atlas.prefix`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.atlas import prefix
from headgeom.atlas.blocks import AtlasModel
from headgeom.atlas.measures import probe_correct
from headgeom.data.task_files import TaskSplits


@dataclass(frozen=True)
class Skill:
    """A probe set: ``prompts`` (each an id array), ``candidates`` (N, K) and the index of
    the right candidate ``answer`` (N,)."""

    name: str
    prompts: tuple[np.ndarray, ...]
    candidates: np.ndarray
    answer: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.prompts)
        if n == 0:
            raise ValueError(f"skill {self.name!r} has no items")
        cand, ans = np.asarray(self.candidates), np.asarray(self.answer)
        if cand.ndim != 2 or cand.shape[0] != n or cand.shape[1] < 2 or ans.shape != (n,):
            raise ValueError(
                f"skill {self.name!r}: {n} prompts need candidates (N, K ≥ 2) and answers "
                f"(N,); got {cand.shape} and {ans.shape}"
            )
        if ((ans < 0) | (ans >= cand.shape[1])).any():
            raise ValueError(f"skill {self.name!r}: an answer index is outside 0..K−1")

    def __len__(self) -> int:
        return len(self.prompts)


def skill_from_task(task: TaskSplits, n: int) -> Skill:
    """The first ``n`` examples (0: all) of a task file read with its splits: prompt
    ``clean_ids``, candidates (``correct_id``, ``incorrect_id``), the right one first. The
    file's ids must be the model's (a task built with the model's tokenizer)."""
    frame = task.frame.head(n or None)
    prompts = tuple(np.asarray(ids, dtype=np.int64) for ids in frame["clean_ids"])
    candidates = np.stack(
        [frame["correct_id"].to_numpy(np.int64), frame["incorrect_id"].to_numpy(np.int64)],
        axis=1,
    )
    return Skill(task.name, prompts, candidates, np.zeros(len(frame), dtype=np.int64))


@dataclass
class SkillBatch:
    """One batch of a skill's prompts of equal length: item indices, the clean run of their
    final position, and which items the original model gets right."""

    items: np.ndarray
    clean: prefix.CleanRun
    candidates: torch.Tensor
    answer: torch.Tensor
    base_correct: np.ndarray


def _groups(skill: Skill, max_rows: int) -> Iterator[np.ndarray]:
    lengths = np.array([len(p) for p in skill.prompts])
    for length in sorted(set(lengths.tolist())):
        index = np.flatnonzero(lengths == length)
        for start in range(0, len(index), max_rows):
            yield index[start : start + max_rows]


@torch.no_grad()
def skill_batches(model: AtlasModel, skill: Skill, max_rows: int) -> list[SkillBatch]:
    """The clean runs of a skill, prompts of one length at a time (``max_rows`` per batch)."""
    out = []
    for items in _groups(skill, max_rows):
        ids = torch.as_tensor(np.stack([skill.prompts[i] for i in items]), device=model.device)
        clean = prefix.clean_run(model, ids, last_only=True)
        cand = torch.as_tensor(skill.candidates[items], device=model.device)
        ans = torch.as_tensor(skill.answer[items], device=model.device)
        right = probe_correct(clean.logits, cand, ans).cpu().numpy()
        out.append(SkillBatch(items, clean, cand, ans, right))
    return out


@torch.no_grad()
def correct_under(model: AtlasModel, batches: Sequence[SkillBatch], start: int) -> np.ndarray:
    """Which items are right under the hooks in place now, each batch resumed at layer
    ``start`` (the edit's first layer); in the skill's item order."""
    n = sum(len(b.items) for b in batches)
    out = np.zeros(n, dtype=bool)
    for b in batches:
        logits = prefix.resumed_logits(model, b.clean, start)
        out[b.items] = probe_correct(logits, b.candidates, b.answer).cpu().numpy()
    return out


def base_correct(batches: Sequence[SkillBatch]) -> np.ndarray:
    """Which items the original model gets right, in the skill's item order."""
    n = sum(len(b.items) for b in batches)
    out = np.zeros(n, dtype=bool)
    for b in batches:
        out[b.items] = b.base_correct
    return out
