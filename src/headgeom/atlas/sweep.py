"""The single-model atlas: every edit of a list, scored on every corpus and every skill.

Per corpus, windows run in batches: one clean run per batch (its layers' outputs kept, its
next-token distributions kept once as the :class:`~headgeom.atlas.measures.Reference`), then
each edit resumed at its first layer (:mod:`headgeom.atlas.prefix`) and scored against the
reference: KL(original ‖ edited) and top-1 hits at every input position. Per skill, the
prompts run the same way at their final position (:mod:`headgeom.atlas.probes`).

Two long tables come out (:func:`sweep`): ``effects``, one row per (edit, corpus) — KL (mean
over the corpus's positions, nats), Δ top-1 (points), positions; and ``retention``, one row
per (edit, skill) — items the original gets right, of those still right, retention.
:func:`summary` folds them into one row per edit: KL and Δ top-1 averaged over corpora (each
corpus weighs the same) and the mean retention over skills, each capped at 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from headgeom.atlas import prefix, probes
from headgeom.atlas.blocks import AtlasModel, Block
from headgeom.atlas.edits import Edit, applied
from headgeom.atlas.measures import EffectSums, effects, mean_retention, reference, retention

Progress = Callable[[int], object] | None


def _edit_columns(edit: Edit) -> dict:
    return {
        "edit": edit.label,
        "kind": edit.kind,
        "target": edit.target,
        "layer": -1 if edit.layer is None else edit.layer,  # -1: every layer, or the table
    }


@torch.no_grad()
def sweep(
    model: AtlasModel,
    edit_list: Sequence[Edit],
    corpora: Mapping[str, torch.Tensor],
    skills: Sequence[probes.Skill],
    means: Mapping[Block, torch.Tensor] | None,
    tables: Mapping[str, torch.Tensor] | None,
    batch_size: int,
    kl_chunk: int,
    probe_rows: int,
    progress: Progress = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(effects, retention) of every edit (module docstring). ``corpora``: name -> scored
    windows (n, T), each scored at its T − 1 input positions; ``batch_size`` windows per
    clean run; ``kl_chunk`` positions per float64 log-softmax; ``probe_rows`` prompts per
    skill batch. ``progress(k)`` after k more edits of a batch or skill."""
    edit_list = list(edit_list)
    sums: dict[tuple[Edit, str], EffectSums] = {}
    for name, windows in corpora.items():
        if windows.ndim != 2 or windows.shape[1] < 2:
            raise ValueError(f"corpus {name!r}: windows {tuple(windows.shape)}, need (n, T ≥ 2)")
        for start in range(0, len(windows), batch_size):
            ids = windows[start : start + batch_size].to(model.device)
            inputs, targets = ids[:, :-1], ids[:, 1:]
            clean = prefix.clean_run(model, inputs)
            ref = reference(clean.logits, targets)
            for edit in edit_list:
                with applied(model, edit, means, tables):
                    logits = prefix.resumed_logits(model, clean, edit.start)
                sums.setdefault((edit, name), EffectSums()).add(effects(ref, logits, kl_chunk))
                if progress is not None:
                    progress(1)
            del clean, ref
    effect_rows = [
        {**_edit_columns(edit), "corpus": name, "kl": s.mean_kl,
         "delta_top1": s.delta_top1_points, "top1_base": s.top1_base / s.n, "n_positions": s.n}
        for (edit, name), s in sums.items()
    ]  # fmt: skip
    kept_rows = []
    for skill in skills:
        batches = probes.skill_batches(model, skill, probe_rows)
        base = probes.base_correct(batches)
        for edit in edit_list:
            with applied(model, edit, means, tables):
                now = probes.correct_under(model, batches, edit.start)
            kept_rows.append({
                **_edit_columns(edit), "skill": skill.name, "n_items": len(skill),
                "n_base_correct": int(base.sum()), "n_kept": int((base & now).sum()),
                "retention": retention(base, now),
            })  # fmt: skip
            if progress is not None:
                progress(1)
    return pd.DataFrame(effect_rows), pd.DataFrame(kept_rows)


def summary(effect_rows: pd.DataFrame, kept_rows: pd.DataFrame) -> pd.DataFrame:
    """One row per edit: KL and Δ top-1 averaged over corpora (each corpus weighs the
    same), and the mean retention over skills, each capped at 1 (NaN: no skill)."""
    keys = ["edit", "kind", "target", "layer"]
    out = effect_rows.groupby(keys, sort=False)[["kl", "delta_top1"]].mean().reset_index()
    if kept_rows.empty:
        return out.assign(mean_retention=np.nan)
    mean = {
        edit: mean_retention(dict(zip(part["skill"], part["retention"], strict=True)))
        for edit, part in kept_rows.groupby("edit", sort=False)
    }
    return out.assign(mean_retention=out["edit"].map(mean))
