"""The two-checkpoint views as the pair stages score them (headgeom.atlas.pair_views,
headgeom.atlas.pair_report), on our tiny GPTs (learned, and write-common with its frozen basis)
and a tiny Llama, each B a moved copy of A: the blend at α = 0 and 1 scores as A and B
exactly, a graft of every group is B, A + all of ΔW is B, the scores equal a naive state-dict
blend and hand-written KL, drift and its group sums on a hand-built pair, answers and leads on
hand-built logits, and where the probes switch on a hand-built table."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.atlas import checkpoints as ck
from headgeom.atlas import pair_report
from headgeom.atlas import pair_views as views
from headgeom.atlas.measures import EffectSums
from headgeom.atlas.probes import Skill
from headgeom.atlas.tensor_groups import Weights
from headgeom.heads.analysis.tolerance import rounding_tolerance
from tests.helpers import atlas_weights as aw
from tests.helpers.models import zoo_model
from tests.tolerances import largest

transformers = pytest.importorskip("transformers", reason="a [dev] extra")
KINDS = ("gpt", "gpt-frozen", "llama")


def _pair(kind: str):
    a = {"gpt": lambda: zoo_model("learned", 0), "gpt-frozen": lambda: zoo_model("write-common", 1),
         "llama": lambda: aw.tiny_llama(0)}[kind]()  # fmt: skip
    return a, aw.moved(a, seed=7, buffers=False)


def _vocab(model) -> int:
    return int(model.get_input_embeddings().weight.shape[0]) if hasattr(
        model, "get_input_embeddings") else model.cfg.n_vocab  # fmt: skip


def _inputs(n_vocab: int, seed: int = 0):
    """Two corpora of scored windows (n, 9) and one skill of prompts of lengths 5 and 7 with
    three candidates each."""
    g = torch.Generator().manual_seed(seed)
    corpora = {c: torch.randint(0, n_vocab, (3, 9), generator=g) for c in ("x", "y")}
    rng = np.random.default_rng(seed)
    prompts = tuple(rng.integers(0, n_vocab, 5 + 2 * (i % 2)) for i in range(6))
    skill = Skill("s", prompts, rng.integers(0, n_vocab, (6, 3)), rng.integers(0, 3, 6))
    return corpora, [skill]


def _scorer(kind: str):
    a, b = _pair(kind)
    corpora, skills = _inputs(_vocab(a))
    model = views.LogitModel.of(copy.deepcopy(a))
    scorer = views.PairScorer(model, Weights.of(a), Weights.of(b), corpora, skills,
                              batch_size=2, kl_chunk=5, probe_rows=2)  # fmt: skip
    return a, b, corpora, skills, scorer


def _kl_sums(scores: views.Scores, end: int) -> list[float]:
    return [pair[end].kl for pair in scores.corpora.values()]


@pytest.mark.parametrize("kind", KINDS)
def test_the_blend_ends_score_as_the_checkpoints_exactly(kind):
    _, _, _, _, scorer = _scorer(kind)
    a, b = scorer.a, scorer.b
    at_a, at_b = scorer.score(ck.blend(a, b, 0.0)), scorer.score(ck.blend(a, b, 1.0))
    assert _kl_sums(at_a, 0) == [0.0, 0.0] and _kl_sums(at_b, 1) == [0.0, 0.0]
    assert min(_kl_sums(at_a, 1)) > 1e-3  # A and B differ, so the identity says something
    assert np.array_equal(at_a.skills["s"].correct, scorer.base_correct["s"])
    rows = views.scored_rows(at_a, scorer.base_correct, {"alpha": 0.0})
    assert [r["corpus"] for r in rows] == ["x", "y", "mean"]
    kept = rows[-1]["retention"]
    assert rows[-1]["kl_to_a"] == 0.0 and (kept == 1.0 or math.isnan(kept))


@pytest.mark.parametrize("kind", KINDS)
def test_a_graft_of_every_group_is_b(kind):
    _, _, _, _, scorer = _scorer(kind)
    a, b = scorer.a, scorer.b
    grafts = list(views.graft_variants(a, b, groups=True, layers=True))
    whole = [(k, w) for k, w in grafts if k["part"] == "group" and k["direction"] == "b_into_a"]
    assert sum(k["n_tensors"] for k, _ in whole) == len(a.tensors)
    every = [n for names in ck.group_grafts(a).values() for n in names]
    assert _kl_sums(scorer.score(ck.graft(a, b, every)), 1) == [0.0, 0.0]
    layers = {(k["layer"], k["part"]) for k, _ in grafts if k["group"] == "layer"}
    assert layers == {(la, p) for la in a.layers() for p in ("norms", "linear")}


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_all_of_the_change_is_b_and_shares_are_the_singular_values(kind):
    _, _, _, _, scorer = _scorer(kind)
    a, b = scorer.a, scorer.b
    full = max(min(t.shape[-2:]) for t in a.tensors.values() if t.ndim >= 2)
    variants = views.lowrank_variants(a, b, [1, full], [0.5, 1.0], True, seed=3)
    out = {(k["mode"], k["k"], k["fraction"]): (k, w) for k, w in variants}
    keys, whole = out[("fraction", None, 1.0)]
    assert keys["delta_share"] == 1.0 and _kl_sums(scorer.score(whole), 1) == [0.0, 0.0]
    keys, top = out[("top", full, None)]
    for name in a.names(lambda r: r.kind == "linear"):
        tol = rounding_tolerance(torch.float32, largest(a.tensors[name], b.tensors[name]), 4)
        torch.testing.assert_close(top.tensors[name], b.tensors[name], atol=tol, rtol=0)
    assert keys["delta_share"] == pytest.approx(1.0, rel=1e-5)
    assert out[("fraction", None, 0.5)][0]["delta_share"] == pytest.approx(0.25, rel=1e-5)
    # top-1: the largest singular value of each layer's ΔW, squared, over ‖ΔW‖²
    top1 = total = 0.0
    for name in a.names(lambda r: r.kind == "linear"):
        delta = (b.tensors[name].double() - a.tensors[name].double()).numpy()
        s = np.linalg.svd(delta.reshape(-1, *delta.shape[-2:]), compute_uv=False)
        top1, total = top1 + float((s[..., 0] ** 2).sum()), total + float((s**2).sum())
    assert out[("top", 1, None)][0]["delta_share"] == pytest.approx(top1 / total, rel=1e-4)
    assert out[("minus_top", 1, None)][0]["delta_share"] == pytest.approx(
        1 - top1 / total, rel=1e-3
    )


@torch.no_grad()
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_scores_equal_a_naive_blend(kind):
    a, b, corpora, skills, scorer = _scorer(kind)
    sa, sb = a.state_dict(), b.state_dict()
    for alpha in (0.4, 1.5):
        naive = copy.deepcopy(a)
        naive.load_state_dict({n: (1 - alpha) * sa[n] + alpha * sb[n] for n in sa})
        got = scorer.score(ck.blend(scorer.a, scorer.b, alpha))

        def logits(model, ids):
            out = model(ids)
            return (out if torch.is_tensor(out) else out.logits).double()

        for name, windows in corpora.items():
            x, y = windows[:, :-1], windows[:, 1:]
            for end, ref in enumerate((a, b)):
                lp, lq = logits(ref, x).log_softmax(-1), logits(naive, x).log_softmax(-1)
                kl = float((lp.exp() * (lp - lq)).sum())
                tol = rounding_tolerance(torch.float32, 1.0, 8) * lp.shape[0] * lp.shape[1]
                assert got.corpora[name][end].kl == pytest.approx(kl, abs=tol, rel=1e-5)
            hits = int((logits(naive, x).argmax(-1) == y).sum())
            assert got.corpora[name][0].top1_edited == hits
        skill = skills[0]
        for i, prompt in enumerate(skill.prompts):
            last = logits(naive, torch.as_tensor(prompt)[None])[0, -1]
            cand = last[torch.as_tensor(skill.candidates[i])]
            right = int(skill.answer[i])
            lead = float(cand[right] - torch.cat([cand[:right], cand[right + 1 :]]).max())
            assert got.skills["s"].lead[i] == pytest.approx(lead, abs=1e-4)
            assert got.skills["s"].answer[i] == int(cand.argmax())
            assert got.skills["s"].correct[i] == (lead > 0)


def test_answers_on_hand_built_logits():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 5.0, 0.0, 0.0], [1.0, 0.0, 4.0, 2.0]])
    candidates = torch.tensor([[1, 3], [0, 1], [3, 2]])
    right = torch.tensor([1, 0, 0])
    got = views.answers(logits, candidates, right)
    assert got.answer.tolist() == [0, 0, 1]  # a tie picks the first candidate ...
    assert got.correct.tolist() == [False, False, False]  # ... but a tie is wrong
    assert got.lead.tolist() == [-1.0, 0.0, -2.0]


def test_scored_rows_by_hand():
    corpora = {"x": (EffectSums(kl=2.0, top1_base=3, top1_edited=1, n=4),
                     EffectSums(kl=4.0, top1_base=2, top1_edited=1, n=4)),
               "y": (EffectSums(kl=1.0, top1_base=1, top1_edited=2, n=2),
                     EffectSums(kl=0.0, top1_base=1, top1_edited=2, n=2))}  # fmt: skip
    right = {"s": np.array([1, 0, 1, 1], bool), "t": np.array([0, 1], bool)}
    skills = {
        k: views.Answers(np.zeros(len(v), int), v, np.zeros(len(v))) for k, v in right.items()
    }
    base = {"s": np.array([1, 1, 0, 1], bool), "t": np.array([0, 0], bool)}
    rows = views.scored_rows(views.Scores(corpora, skills), base, {"pair": "p"})
    x, y, mean = rows
    assert (x["kl_to_a"], x["kl_to_b"], x["top1"]) == (0.5, 1.0, 0.25)
    assert (y["kl_to_a"], y["kl_to_b"], y["top1"]) == (0.5, 0.0, 1.0)
    assert (mean["corpus"], mean["kl_to_a"], mean["kl_to_b"], mean["top1"]) == (
        "mean",
        0.5,
        0.5,
        0.625,
    )
    # s keeps 2 of A's 3 right items; t has none right under A (no retention): mean 2/3
    assert all(r["retention"] == pytest.approx(2 / 3) for r in rows)
    assert all(r["accuracy"] == pytest.approx((3 / 4 + 1 / 2) / 2) for r in rows)


def test_drift_on_a_hand_built_pair():
    a = zoo_model("write-common", 2)
    b = copy.deepcopy(a)
    change = torch.zeros_like(b.blocks[0].mlp.c_fc.weight)
    change[0, 0], change[1, 2] = 3.0, 4.0  # ‖ΔW‖ = 5
    with torch.no_grad():
        b.wte.weight.mul_(3.0)
        b.blocks[0].mlp.c_fc.weight.add_(change)
    rows = views.drift_rows(Weights.of(a), Weights.of(b)).set_index("tensor")
    wte = rows.loc["wte.weight"]
    assert wte["norm_delta"] == pytest.approx(2 * wte["norm_a"], rel=1e-6)
    assert wte["drift"] == pytest.approx(2.0, rel=1e-6) and wte["layer"] == -1
    fc = rows.loc["blocks.0.mlp.c_fc.weight"]
    assert fc["norm_delta"] == pytest.approx(5.0, rel=1e-6) and fc["layer"] == 0
    assert fc["kind"] == "linear" and fc["group"] == "mlp"
    others = rows.drop(index=["wte.weight", "blocks.0.mlp.c_fc.weight"])
    assert (others["norm_delta"] == 0).all() and (others["drift"] == 0).all()
    assert (others.loc[others["kind"] == "frozen", "norm_a"] > 0).all()
    groups = pair_report.group_drift(rows.reset_index()).set_index("group")["drift"]
    mlp = a.state_dict()
    mlp_norm = math.sqrt(sum(float(mlp[n].double().pow(2).sum()) for n in rows.index
                             if rows.loc[n, "group"] == "mlp"))  # fmt: skip
    assert groups["mlp"] == pytest.approx(5.0 / mlp_norm, rel=1e-6)
    assert groups["embedding"] == pytest.approx(2.0, rel=1e-6) and groups["norms"] == 0.0


def test_where_the_probes_switch():
    alphas = [-0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5]
    answers = {0: "xxxyyyy", 1: "xxyxyyx", 2: "xxyxxxx", 3: "yyyyyyy"}
    rows = [{"skill": "s", "item": i, "alpha": al, "answer": ans[j], "correct": ans[j] == "y"}
            for i, ans in answers.items() for j, al in enumerate(alphas)]  # fmt: skip
    probes = pd.DataFrame(rows)
    items = pair_report.item_switches(probes).set_index("item")["switch_alpha"].to_dict()
    assert items == {0: 0.5, 1: 0.75}  # item 2 ends as it started; item 3 never changes
    (row,) = pair_report.switches(probes).to_dict("records")
    assert (row["switching"], row["switch_median"], row["switch_min"], row["switch_max"]) == (
        2, 0.625, 0.5, 0.75)  # fmt: skip
    # accuracy over α = 0, 0.25, …, 1: 1/4, 3/4, 2/4, 3/4, 3/4; the midpoint of A's 1/4 and
    # B's 3/4 is 1/2, first reached between α = 0 and 0.25: at 0.125
    assert (row["accuracy_a"], row["accuracy_b"]) == (0.25, 0.75)
    assert row["accuracy_crossing"] == 0.125


def test_the_accuracy_crossing_interpolates():
    alphas = np.array([0.0, 0.5, 1.0])
    assert pair_report._crossing(alphas, np.array([1.0, 0.75, 0.0])) == pytest.approx(0.5 + 0.5 / 3)
    assert math.isnan(pair_report._crossing(alphas, np.array([0.5, 0.1, 0.5])))
