"""The atlas's measures (headgeom.atlas.measures) on hand-computed cases: KL(original ‖
edited), Δ top-1 in points, probe items right, retention and its capped mean, the profile's
ratios on hand-built streams and writes, and the profile of tiny models against their
layers' own inputs and outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import measures as M  # noqa: E402
from headgeom.atlas.blocks import AtlasModel, Block  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402


# ----------------------------------------------------------------------------- effects
def test_kl_and_top1_by_hand():
    """Two positions over a 2-token vocabulary: p = (½, ½), q = (¼, ¾) at the first (KL =
    ½ ln 2 + ½ ln ⅔), p = q at the second (KL 0); the edited model's top-1 moves from
    token 0 to token 1 at the first (the original's argmax of a tie is token 0)."""
    base = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64))
    edit = torch.log(torch.tensor([[0.25, 0.75], [0.9, 0.1]], dtype=torch.float64)) + 3.0
    targets = torch.tensor([1, 0])
    for chunk in (1, 2, 5):
        sums = M.next_token_effects(base, edit, targets, chunk)
        kl = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
        assert sums.kl == pytest.approx(kl, abs=1e-12)
        assert sums.mean_kl == pytest.approx(kl / 2, abs=1e-12)
        assert (sums.top1_base, sums.top1_edited, sums.n) == (1, 2, 2)
        assert sums.delta_top1_points == pytest.approx(50.0)
    with pytest.raises(ValueError, match="same positions"):
        M.next_token_effects(base, edit[:1], targets, 1)


def test_one_reference_for_many_edits():
    """The original's distributions kept once: each edit's effects equal a KL written out
    here, Σ_v p_v (log p_v − log q_v) per position."""
    base, targets = torch.randn(4, 6, 13), torch.randint(0, 13, (4, 6))
    ref = M.reference(base, targets)
    logp = torch.log_softmax(base.double(), -1)
    for seed in range(3):
        edited = base + torch.randn(base.shape, generator=torch.Generator().manual_seed(seed))
        logq = torch.log_softmax(edited.double(), -1)
        hand = float((logp.exp() * (logp - logq)).sum())
        assert M.effects(ref, edited, chunk=5).kl == pytest.approx(hand, rel=1e-12)
    with pytest.raises(ValueError, match="reference's"):
        M.effects(ref, base[:2], chunk=5)
    with pytest.raises(ValueError, match="same positions"):
        M.reference(base, targets[:2])


def test_effects_of_identical_logits_are_zero():
    logits = torch.randn(3, 5, 11)
    sums = M.next_token_effects(logits, logits.clone(), torch.zeros(3, 5, dtype=torch.long), 4)
    assert sums.kl == 0.0 and sums.delta_top1_points == 0.0 and sums.n == 15


def test_corpus_summary_weighs_corpora_equally():
    a = M.EffectSums(kl=1.0, top1_base=5, top1_edited=4, n=10)  # KL 0.1, −10 points
    b = M.EffectSums(kl=3.0, top1_base=1, top1_edited=1, n=10)  # KL 0.3, 0 points
    b.add(M.EffectSums(kl=3.0, top1_base=0, top1_edited=0, n=10))  # KL 0.3 over 20
    out = M.corpus_summary({"code": a, "prose": b})
    assert out["kl_code"] == pytest.approx(0.1) and out["kl_prose"] == pytest.approx(0.3)
    assert out["kl"] == pytest.approx(0.2)
    assert out["delta_top1_code"] == pytest.approx(-10.0)
    assert out["delta_top1"] == pytest.approx(-5.0)


# ----------------------------------------------------------------------------- retention
def test_probe_items_by_hand():
    logits = torch.tensor([[0.0, 2.0, 1.0, 5.0], [3.0, 1.0, 3.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    candidates = torch.tensor([[1, 2], [0, 2], [0, 1]])
    answer = torch.tensor([0, 1, 0])
    # item 0: token 1 (2.0) beats 2 (1.0); item 1: a tie is wrong; item 2: token 0 < token 1
    assert M.probe_correct(logits, candidates, answer).tolist() == [True, False, False]
    three = M.probe_correct(logits, torch.tensor([[0, 1, 3]] * 3), torch.tensor([2, 0, 2]))
    assert three.tolist() == [True, True, True]


def test_retention_by_hand():
    base = np.array([True, True, False, True, True])
    edit = np.array([True, False, True, True, False])
    assert M.retention(base, edit) == pytest.approx(2 / 4)  # the third item does not count
    assert math.isnan(M.retention(np.zeros(3, bool), np.ones(3, bool)))
    with pytest.raises(ValueError, match="items"):
        M.retention(base, edit[:3])
    assert M.accuracy_ratio(0.4, 0.5) == pytest.approx(1.25)
    assert math.isnan(M.accuracy_ratio(0.0, 0.5))
    # each skill capped at 1 (raw text's ratio 1.25 counts as 1), undefined skills left out
    per_skill = {"sva": 0.5, "raw_text": 1.25, "quote": float("nan"), "plural": 0.75}
    assert M.mean_retention(per_skill) == pytest.approx((0.5 + 1.0 + 0.75) / 3)


# ----------------------------------------------------------------------------- profile
def test_profile_ratios_by_hand():
    """Stream x at two positions, x = (3, 0) and (0, 4): ‖x‖² sums to 25. Attention writes
    (1, 0) at both (a fixed vector: constant part 1, Σ‖w‖² = 2), the MLP (0, 1) and (0, −1)
    (mean 0: constant part 0). x + writes = (4, 1), (1, 3): Σ‖·‖² = 27."""
    sums = M.ProfileSums(n_layer=1)
    x = torch.tensor([[[3.0, 0.0], [0.0, 4.0]]])
    writes = {"attn": torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]),
              "mlp": torch.tensor([[[0.0, 1.0], [0.0, -1.0]]])}  # fmt: skip
    # in two batches: the moments add up
    sums.add_layer(0, x[:, :1], {k: w[:, :1] for k, w in writes.items()})
    sums.add_layer(0, x[:, 1:], {k: w[:, 1:] for k, w in writes.items()})
    attn, mlp = Block(0, "attn"), Block(0, "mlp")
    assert sums.write_size(attn) == pytest.approx(math.sqrt(2 / 25))
    assert sums.write_size(mlp) == pytest.approx(math.sqrt(2 / 25))
    assert sums.constant_part(attn) == pytest.approx(1.0)
    assert sums.constant_part(mlp) == pytest.approx(0.0)
    assert sums.carried(0) == pytest.approx(math.sqrt(25 / 27))
    with pytest.raises(ValueError, match="L0.attn: write"):
        sums.add_layer(0, x, {"attn": torch.ones(1, 3, 2)})


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).sum(-1).mean().sqrt())


@pytest.mark.parametrize("name", ["llama", "gemma4"])
def test_profile_of_a_model_against_its_layers(name):
    """The profile of a tiny model from its own tensors, captured by plain hooks: write
    size and constant part from the writes and layer inputs (positions t ≥ 1); old state
    carried from the layer's own output, which is input + writes (times Gemma 4's layer
    scalar), so RMS(in + writes) is RMS(out) / |scalar|; the knob is the post-norm's RMS."""
    model = AtlasModel(tiny.BUILDERS[name]())
    windows = tiny.ids(3, 9, seed=2)
    rows = {(r["layer"], r["block"]): r for r in M.profile(model, windows, batch_size=2)}
    assert len(rows) == len(model.blocks())
    seen = tiny.capture(model, windows)
    for block in model.blocks():
        row = rows[(block.layer, block.kind)]
        x, w = seen[("in", block.layer)][:, 1:], seen[block][:, 1:]
        assert row["write_size"] == pytest.approx(_rms(w) / _rms(x), rel=1e-6)
        flat = w.double().reshape(-1, w.shape[-1])
        constant = float(flat.mean(0).pow(2).sum() / flat.pow(2).sum(-1).mean())
        assert row["constant_part"] == pytest.approx(constant, rel=1e-6)
        out = seen[("out", block.layer)][:, 1:]
        scalar = model.layer_scalar(block.layer)
        scale = 1.0 if scalar is None else float(scalar.abs())
        assert row["old_state_carried"] == pytest.approx(_rms(x) * scale / _rms(out), rel=1e-5)
        knob = model.knob(block)
        if knob is None:
            assert math.isnan(row["knob_rms"])
        else:
            assert row["knob_rms"] == pytest.approx(float(knob.pow(2).mean().sqrt()), rel=1e-6)
    if name == "gemma4":
        weight = model.layers[0].post_per_layer_input_norm.weight.detach()
        assert M.knob_rms(model, Block(0, "ple")) == pytest.approx(
            math.sqrt(float(weight.pow(2).mean())), rel=1e-6
        )
