"""§5.1 exclusivity (docs §11.3–11.6): percentiles, top-head selection, direct vs total
responses and attention total variation, against hand-computed values and naive routes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.data.task_files import PatchInputs
from headgeom.heads.analysis import exclusivity as ex
from headgeom.heads.analysis.leakage import (
    attention_final,
    leakage_table,
    pooled_response_stats,
    total_variation,
)
from headgeom.heads.analysis.patching import patch_all_heads, replace_head
from headgeom.heads.analysis.stats import effects_from_drops
from headgeom.heads.analysis.tolerance import model_dtype, rounding_tolerance
from headgeom.model.config import ModelConfig
from headgeom.model.gpt import GPT, site
from tests.weights import large_random_weights


# ----------------------------------------------------------------------------- percentiles
def test_midrank_percentile_counts_ties_half_and_includes_the_value():
    assert ex.midrank_percentile([1, 2, 2, 3], 2) == pytest.approx(100 * (1 + 0.5 * 2) / 4)
    assert ex.midrank_percentile([5, 1, 2], 5) == pytest.approx(100 * (2 + 0.5) / 3)
    assert ex.midrank_percentile([4.0], 4.0) == 50.0
    assert math.isnan(ex.midrank_percentile([], 1.0))


def _leak_rows():
    """One source (0, 0) of a 3-layer, 2-head model; readers in layers 1 and 2, X = Q."""
    L = {(1, 0): 0.1, (1, 1): 0.4, (2, 0): 0.3, (2, 1): 0.2}
    return pd.DataFrame(
        [
            dict(model="m", seed=1, task="t", source_layer=0, source_head=0, reader_layer=rl,
                 reader_head=rh, read_type="Q", leakage=v)
            for (rl, rh), v in L.items()
        ]
    )  # fmt: skip


def test_percentiles_all_later_and_layer_matched_reference_sets():
    out = ex.add_percentiles(_leak_rows()).set_index(["reader_layer", "reader_head"])
    # all later readers {0.1, 0.4, 0.3, 0.2}: ranks 1, 4, 3, 2 -> 100 (r − ½)/4
    expected_all = {(1, 0): 12.5, (1, 1): 87.5, (2, 0): 62.5, (2, 1): 37.5}
    # same layer only: two readers each, the larger at 75, the smaller at 25
    expected_layer = {(1, 0): 25.0, (1, 1): 75.0, (2, 0): 75.0, (2, 1): 25.0}
    for key in expected_all:
        assert out.loc[key, "percentile_all_later"] == pytest.approx(expected_all[key])
        assert out.loc[key, "percentile_same_layer"] == pytest.approx(expected_layer[key])
        reference = _leak_rows()["leakage"].to_numpy()
        assert out.loc[key, "percentile_all_later"] == pytest.approx(
            ex.midrank_percentile(reference, out.loc[key, "leakage"])
        )


# ----------------------------------------------------------------------------- selection
def test_top_heads_signed_and_abs_and_ordered_pairs():
    e = np.array([[0.1, -5.0, 0.3], [2.0, 0.0, 0.2], [0.3, 1.0, -0.1]])
    assert ex.top_heads(e) == [(1, 0), (2, 1), (0, 2)]  # ties (0.3) in row-major order
    assert ex.top_heads(e, by="abs") == [(0, 1), (1, 0), (2, 1)]
    assert ex.top_pairs([(1, 0), (2, 1), (1, 2)]) == [((1, 0), (2, 1)), ((1, 2), (2, 1))]


def test_discovery_reselection_reproduces_a_planted_set():
    n_layer, n_head = 3, 3
    rng = np.random.default_rng(0)
    planted_eval, planted_disc = [(2, 1), (0, 0), (1, 2)], [(2, 1), (1, 2), (0, 1)]
    rows = []
    for split, planted in (("evaluation", planted_eval), ("discovery", planted_disc)):
        e = rng.uniform(-0.1, 0.1, (n_layer, n_head))
        for rank, (ly, h) in enumerate(planted):
            e[ly, h] = 3.0 - rank
        rows += [dict(model="m", seed=1, task="t", split=split, layer=ly, head=h, e=e[ly, h])
                 for ly in range(n_layer) for h in range(n_head)]  # fmt: skip
    heads = pd.DataFrame(rows)
    leak = pd.DataFrame(
        [
            dict(model="m", seed=1, task="t", split="evaluation", source_layer=ly,
                 source_head=h, reader_layer=rl, reader_head=rh, read_type=X,
                 leakage=rng.uniform(), rho=rng.uniform(), leakage_over_rho=1.0,
                 response_cosine=1.0, response_norm_ratio=1.0, response_projection=1.0,
                 tv_query=rng.uniform(), tv_keys=0.0, tv_direct=0.0, tv_total=0.0)
            for ly in range(n_layer) for h in range(n_head) for rl in range(ly + 1, n_layer)
            for rh in range(n_head) for X in "QKV"
        ]
    )  # fmt: skip
    out = ex.exclusivity_tables(leak, heads, {("m", 1): "learned"}, "evaluation")
    chosen = out.heads[out.heads["selection"] == "discovery"].sort_values("rank")
    assert list(zip(chosen["layer"], chosen["head"], strict=True)) == planted_disc
    summary = out.summary.set_index("quantity")
    assert summary.loc["discovery_heads_matching", "value"] == 2  # (2, 1) and (1, 2)
    # discovery pairs: l_i < l_j among the planted discovery heads, × 3 read types
    disc = out.pairs[out.pairs["selection"] == "discovery"]
    assert len(disc) == 3 * len(ex.top_pairs(planted_disc))


# ----------------------------------------------------------------------------- responses, TV
def test_projection_coefficient_is_cosine_times_norm_ratio():
    rng = np.random.default_rng(1)
    d, t = rng.normal(size=(50, 7)), rng.normal(size=(50, 7)) + 0.5
    dot, dd, tt = float(np.sum(d * t)), float(np.sum(d * d)), float(np.sum(t * t))
    cosine, ratio, projection = pooled_response_stats(dot, dd, tt)
    assert cosine == pytest.approx(dot / math.sqrt(dd * tt))
    assert ratio == pytest.approx(math.sqrt(dd / tt))
    assert projection == pytest.approx(cosine * ratio)
    assert all(np.isnan(v) for v in pooled_response_stats(0.0, 0.0, 0.0))


def test_tv_is_zero_without_a_perturbation_and_matches_the_two_key_closed_form():
    q = torch.tensor([[[1.0, 0.0]]])  # (B=1, H=1, d=2)
    k = torch.tensor([[[[0.5, 1.0]], [[-1.0, 2.0]]]])  # (B, T=2, H, d)
    a = attention_final(q, k)
    assert float(total_variation(a, attention_final(q.clone(), k.clone()))) == 0.0
    q2 = torch.tensor([[[0.2, 1.5]]])
    s = lambda q_: (q_[0, 0] @ k[0, :, 0].T) / math.sqrt(2)  # noqa: E731
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    s1, s2 = s(q), s(q2)
    # two keys: a_1 = σ(s_1 − s_2); TV = |a_1 − a'_1|
    expected = abs(sigmoid(float(s1[0] - s1[1])) - sigmoid(float(s2[0] - s2[1])))
    assert float(total_variation(attention_final(q2, k), a)) == pytest.approx(expected)


def _model(n_layer=2, zero_mlp0=False, seed=0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_vocab=23, n_ctx=16, n_layer=n_layer, n_head=3, d_model=24, d_head=8,
                      d_mlp=48, geometry="learned")  # fmt: skip
    model = GPT(cfg)
    large_random_weights(model)
    with torch.no_grad():
        if zero_mlp0:
            model.blocks[0].mlp.c_proj.weight.zero_()
            model.blocks[0].mlp.c_proj.bias.zero_()
    return model.eval()


def _inputs(seed=0, n=10, T=7) -> PatchInputs:
    rng = np.random.default_rng(seed)
    clean = [rng.integers(0, 23, T) for _ in range(n)]
    ref = []
    for c in clean:
        r = c.copy()
        r[2:] = rng.integers(0, 23, T - 2)  # differ from position 2 on
        ref.append(r)
    return PatchInputs(clean, ref, rng.integers(0, 23, n), rng.integers(0, 23, n))


def _run(model, inputs):
    clean_ld, patched = patch_all_heads(model, inputs.clean_ids, inputs.ref_ids,
                                        inputs.correct, inputs.incorrect, 4)  # fmt: skip
    e = effects_from_drops(clean_ld[:, None, None] - patched)
    return leakage_table(model, inputs, e, 4, torch.device("cpu"), "effects").table


def test_direct_equals_total_when_nothing_lies_between_source_and_reader():
    """Layer 0's MLP writes nothing: the patched residual entering layer 1 is x + δ exactly."""
    model = _model(zero_mlp0=True)
    table = _run(model, _inputs())
    assert len(table) and table["response_cosine"].notna().all()
    # The two routes to the reader's input round differently at the attention output, the
    # residual sum with δ and the reader (LN and projection): 3 stages, at scale 1 for these
    # pooled ratios and attention probabilities (the responses are within 10× of the largest
    # |q, k, v| here and pooling averages their roundings: measured ≤ 7e-8)
    tol = rounding_tolerance(model_dtype(model), 1.0, 3)
    for column in ("response_cosine", "response_norm_ratio", "response_projection"):
        np.testing.assert_allclose(table[column], 1.0, rtol=0, atol=tol, err_msg=column)
    np.testing.assert_allclose(table["tv_total"], table["tv_direct"], rtol=0, atol=tol)


def test_responses_and_tv_match_a_naive_full_forward():
    """With an MLP between them, the pass's numbers for one pair against the plain route:
    a full forward with the z patch (total) and the reader on x + δ (direct)."""
    model, inputs = _model(n_layer=3, seed=3), _inputs(seed=4)
    table = _run(model, inputs)
    src, rl, rh = (0, 2), 2, 1
    dots = dd = tt = 0.0
    tvs = {c: 0.0 for c in ("query", "keys", "direct", "total")}
    with torch.no_grad():
        for c_ids, r_ids in zip(inputs.clean_ids, inputs.ref_ids, strict=True):
            clean = torch.as_tensor(c_ids[None].astype(np.int64))
            ref = torch.as_tensor(r_ids[None].astype(np.int64))
            zname = site(src[0], "attn.hook_z")
            names = [zname, site(rl, "hook_resid_pre"), site(rl, "attn.hook_q")]
            _, cc = model.run_with_cache(clean, names + [site(rl, "attn.hook_k")])
            _, rc = model.run_with_cache(ref, [zname])
            w = model.blocks[src[0]].attn.writer.write_maps()[src[1]]
            delta = (rc[zname][0, :, src[1]] - cc[zname][0, :, src[1]]) @ w.T  # (T, D)
            hook = {zname: replace_head(src[1], rc[zname][:, :, src[1]])}
            with model.hooks(hook):
                _, pc = model.run_with_cache(clean, [site(rl, "attn.hook_q"),
                                                     site(rl, "attn.hook_k")])  # fmt: skip
            x = cc[site(rl, "hook_resid_pre")]
            qd, kd, _ = model.blocks[rl].attn.reader(x + delta[None])
            q0, k0 = cc[site(rl, "attn.hook_q")], cc[site(rl, "attn.hook_k")]
            qt, kt = pc[site(rl, "attn.hook_q")], pc[site(rl, "attn.hook_k")]
            d_d, d_t = (qd - q0)[0, :, rh].double(), (qt - q0)[0, :, rh].double()
            dots += float((d_d * d_t).sum())
            dd += float((d_d**2).sum())
            tt += float((d_t**2).sum())

            def att(q, k):
                s = (q[0, -1, rh] @ k[0, :, rh].T) / math.sqrt(q.shape[-1])
                return torch.softmax(s.double(), -1)

            a = att(q0, k0)
            for c, (q, k) in {"query": (qd, k0), "keys": (q0, kd), "direct": (qd, kd),
                              "total": (qt, kt)}.items():  # fmt: skip
                tvs[c] += 0.5 * float((att(q, k) - a).abs().sum()) / len(inputs.clean_ids)
    row = table[(table["source_layer"] == src[0]) & (table["source_head"] == src[1])
                & (table["reader_layer"] == rl) & (table["reader_head"] == rh)
                & (table["read_type"] == "Q")].iloc[0]  # fmt: skip
    cosine, ratio, projection = pooled_response_stats(dots, dd, tt)
    assert row["response_cosine"] == pytest.approx(cosine, rel=1e-4)
    assert row["response_norm_ratio"] == pytest.approx(ratio, rel=1e-4)
    assert row["response_projection"] == pytest.approx(projection, rel=1e-4)
    assert cosine < 0.9999  # the MLP in between makes total differ from direct
    for c, value in tvs.items():
        assert row[f"tv_{c}"] == pytest.approx(value, rel=1e-4, abs=1e-7)
