"""The single-model sweep (headgeom.atlas.sweep) and its skills (headgeom.atlas.probes) on
tiny Llama and Gemma 4 models, against a naive loop written here: one full forward per edit,
window and prompt (no clean prefix, no batching by length), the KL and the items right
computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import edits as E  # noqa: E402
from headgeom.atlas import probes, sweep  # noqa: E402
from headgeom.atlas.blocks import AtlasModel  # noqa: E402
from headgeom.data.task_files import TaskSplits  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402


def _skill(name: str, seed: int, n: int = 7) -> probes.Skill:
    """Random prompts of lengths 3..6 (several length groups), 3 candidates each."""
    g = torch.Generator().manual_seed(seed)
    prompts = tuple(torch.randint(0, tiny.V, (3 + i % 4,), generator=g).numpy() for i in range(n))
    candidates = torch.randint(0, tiny.V, (n, 3), generator=g).numpy()
    answer = torch.randint(0, 3, (n,), generator=g).numpy()
    return probes.Skill(name, prompts, candidates, answer)


def _naive(model, edit, means, tables, corpora, skills):
    """KL mean and top-1 hits per corpus; items right per skill: full forwards, one window
    and one prompt at a time."""
    out = {}
    for name, windows in corpora.items():
        kl, hits_base, hits_edit, n = 0.0, 0, 0, 0
        for w in windows:
            inputs, targets = w[None, :-1], w[1:]
            base = model.logits(inputs)[0].double()
            with E.applied(model, edit, means, tables):
                edited = model.logits(inputs)[0].double()
            logp, logq = torch.log_softmax(base, -1), torch.log_softmax(edited, -1)
            kl += float((logp.exp() * (logp - logq)).sum())
            hits_base += int((base.argmax(-1) == targets).sum())
            hits_edit += int((edited.argmax(-1) == targets).sum())
            n += len(targets)
        out[name] = (kl / n, 100.0 * (hits_edit - hits_base) / n)
    for skill in skills:
        right = []
        for prompt, cand, ans in zip(skill.prompts, skill.candidates, skill.answer, strict=True):
            ids = torch.as_tensor(prompt)[None]
            pair = []
            for e in (None, edit):
                with E.applied(model, e, means, tables):
                    logits = model.logits(ids)[0, -1]
                picked = logits[torch.as_tensor(cand)]
                pair.append(bool(picked[ans] > np.delete(picked.numpy(), ans).max()))
            right.append(pair)
        right = np.array(right)
        out[skill.name] = (int(right[:, 0].sum()), int((right[:, 0] & right[:, 1]).sum()))
    return out


@pytest.mark.parametrize("name", ["llama", "gemma4"])
def test_sweep_equals_a_naive_loop(name):
    model = AtlasModel(tiny.BUILDERS[name]())
    corpora = {"a": tiny.ids(3, 9, seed=4), "b": tiny.ids(2, 7, seed=5)}
    skills = [_skill("s1", 0), _skill("s2", 1)]
    means = E.write_means(model, tiny.ids(3, 9, seed=6), batch_size=3)
    edit_list = [E.Edit("zero", "attn", 1), E.Edit("average", "mlp", 2),
                 E.Edit("rows_mean", "embed"), E.Edit("skip", "layer", None)]  # fmt: skip
    if name == "gemma4":
        edit_list += [E.Edit("rows_mean", "ple", 3), E.Edit("flatten_keys", "keys", 0)]
    tables = E.needed_tables(model, edit_list)
    steps = []
    effects, kept = sweep.sweep(model, edit_list, corpora, skills, means, tables,
                                batch_size=2, kl_chunk=5, probe_rows=2,
                                progress=steps.append)  # fmt: skip
    # batches of 2 windows: corpus a in 2 batches, b in 1; then each skill once, per edit
    assert sum(steps) == len(edit_list) * (2 + 1 + len(skills))
    assert len(effects) == 2 * len(edit_list) and len(kept) == 2 * len(edit_list)
    for edit in edit_list:
        naive = _naive(model, edit, means, tables, corpora, skills)
        for corpus in corpora:
            row = effects[(effects["edit"] == edit.label) & (effects["corpus"] == corpus)]
            assert row["kl"].item() == pytest.approx(naive[corpus][0], rel=1e-5, abs=1e-9)
            assert row["delta_top1"].item() == pytest.approx(naive[corpus][1])
            assert row["n_positions"].item() == corpora[corpus][:, 1:].numel()
        for skill in skills:
            row = kept[(kept["edit"] == edit.label) & (kept["skill"] == skill.name)]
            base, still = naive[skill.name]
            assert (row["n_base_correct"].item(), row["n_kept"].item()) == (base, still)
            expected = still / base if base else float("nan")
            assert row["retention"].item() == pytest.approx(expected, nan_ok=True)
    assert effects["kl"].min() > 0


def test_summary_by_hand():
    keys = {"kind": "zero", "target": "attn", "layer": 0}
    effects = pd.DataFrame([
        {"edit": "zero L0.attn", **keys, "corpus": "a", "kl": 0.1, "delta_top1": -2.0},
        {"edit": "zero L0.attn", **keys, "corpus": "b", "kl": 0.3, "delta_top1": 0.0},
    ])  # fmt: skip
    kept = pd.DataFrame([
        {"edit": "zero L0.attn", "skill": "sva", "retention": 0.5},
        {"edit": "zero L0.attn", "skill": "text", "retention": 1.5},
        {"edit": "zero L0.attn", "skill": "none", "retention": float("nan")},
    ])  # fmt: skip
    row = sweep.summary(effects, kept).iloc[0]
    assert row["kl"] == pytest.approx(0.2) and row["delta_top1"] == pytest.approx(-1.0)
    assert row["mean_retention"] == pytest.approx(0.75)
    assert math.isnan(sweep.summary(effects, pd.DataFrame()).iloc[0]["mean_retention"])


def test_skill_from_a_task_file():
    frame = pd.DataFrame({
        "clean_ids": [np.array([5, 6, 7]), np.array([8, 9])],
        "correct_id": [11, 12], "incorrect_id": [21, 22],
    })  # fmt: skip
    task = TaskSplits(frame, pa.schema([]), "d", "f", "sva")
    skill = probes.skill_from_task(task, 0)
    assert skill.name == "sva" and len(skill) == 2
    assert skill.candidates.tolist() == [[11, 21], [12, 22]] and skill.answer.tolist() == [0, 0]
    assert len(probes.skill_from_task(task, 1)) == 1
    with pytest.raises(ValueError, match="no items"):
        probes.Skill("empty", (), np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(ValueError, match="K ≥ 2"):
        probes.Skill("one", (np.array([1]),), np.array([[3]]), np.array([0]))
    with pytest.raises(ValueError, match="outside"):
        probes.Skill("bad", (np.array([1]),), np.array([[3, 4]]), np.array([2]))
