"""Coordinate concentration (docs §15.2): the batched single-direction patches equal a naive
hooked forward per direction; the share on planted effects; decile matching on a hand-built
magnitude vector; the Haar rotation keeps the total patch (Σ_k r r^T = I)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.analysis import coordinates as C
from headgeom.model import registry
from tests.unit.test_edges import zoo_model
from tests.unit.test_patching_fast import multiscreen_model, random_pairs


def test_share_of_a_one_hot_planted_effect_is_one():
    e = np.zeros(64)
    e[17] = 2.5
    e[[3, 40]] = -1.0  # negative drops never enter the denominator
    assert C.top_share(e) == 1.0
    assert 17 in C.top_directions(e)
    # hand-computed: 12 positive drops 12..1, top 10 = 12+..+3 = 75 of 78
    e = np.concatenate([np.arange(1, 13, dtype=float), -np.ones(4)])
    assert C.top_share(e) == pytest.approx(75 / 78)
    # selected on one split, reported on another: Σ chosen (may be negative) / Σ positive
    assert C.share(np.array([1.0, -1.0, 2.0]), np.array([0, 1])) == pytest.approx(0.0)
    assert np.isnan(C.top_share(-np.ones(5)))


def test_decile_matching_on_a_hand_built_magnitude_vector():
    m = np.array([5.0, 0.1, 3.0, 9.0, 7.0, 0.5, 2.0, 8.0, 6.0, 1.0,
                  4.0, 0.2, 9.5, 3.5, 0.3, 7.5, 5.5, 2.5, 8.5, 6.5])  # fmt: skip
    # ranks by value: deciles are the pairs of consecutive ranks
    q = C.deciles(m)
    order = np.argsort(m)
    for rank, i in enumerate(order):
        assert q[i] == rank // 2
    chosen = np.array([12, 3, 1])  # 9.5, 9.0 (top decile: {3, 12}), 0.1 (bottom: {1, 11})
    sets = C.matched_random_sets(m, chosen, 200, np.random.default_rng(0))
    for s in sets:
        assert len(set(s)) == 3 and {3, 12} <= set(s) and len(set(s) & {1, 11}) == 1
    assert {int(x) for s in sets for x in s} == {1, 3, 11, 12}  # both bottom members drawn


def test_haar_rotations_are_orthogonal_and_seeded():
    R = C.head_rotations(3, 8, seed=5)
    for r in R:
        np.testing.assert_allclose(r.T @ r, np.eye(8), atol=1e-12)
    np.testing.assert_array_equal(R, C.head_rotations(3, 8, seed=5))
    assert not np.allclose(R[0], R[1])


@pytest.mark.parametrize("rotated", [False, True])
def test_directions_over_a_full_basis_sum_to_the_whole_layer_patch(rotated):
    model = zoo_model("learned")
    H, d = model.cfg.n_head, model.cfg.d_head
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(2, H, d, generator=gen, dtype=torch.float64)
    z_ref = torch.randn(2, H, d, generator=gen, dtype=torch.float64)
    bases = C.head_rotations(H, d, 9) if rotated else C.identity_bases(H, d)
    writer = model.blocks[1].attn.writer
    rows, _ = C.direction_attn_out(writer, z, z_ref, torch.as_tensor(bases))
    a, a_ref = writer(z), writer(z_ref)
    # Σ_j (patched_j − clean) = Σ_h W_O^h Σ_k r r^T Δz_h = W_O Δz = a_ref − a
    torch.testing.assert_close((rows - a).sum(0), a_ref - a, rtol=0, atol=1e-10)
    # and per head: its d directions give that head's whole patch δ_h
    w = writer.write_maps().double()
    per_head = (rows - a).view(H, d, *a.shape).sum(1)  # (H, B, D)
    delta = torch.einsum("bhk,hdk->hbd", z_ref - z, w)
    torch.testing.assert_close(per_head, delta, rtol=0, atol=1e-10)


@pytest.mark.parametrize("geometry", ["learned", "all-common-axis", "value384", "multiscreen"])
def test_batched_patches_equal_naive_hooked_forwards(geometry):
    if geometry == "multiscreen":
        model = multiscreen_model("write-common-axis").double()
    else:
        model = zoo_model(geometry)
    pairs = random_pairs(5, (5, 7))
    layer = 1
    H, d = model.cfg.n_head, model.cfg.d_head
    rot = C.head_rotations(H, d, 7)
    fast = C.direction_drops(model, *pairs, layer, rot, batch_size=3, max_rows=11)
    naive = C.direction_drops_naive(model, *pairs, layer)
    naive_rot = C.direction_drops_naive(model, *pairs, layer, rot)
    for name, want in (("after_wo", naive["after_wo"]), ("before_wo", naive["before_wo"]),
                       ("before_wo_rotated", naive_rot["before_wo"])):  # fmt: skip
        np.testing.assert_allclose(fast[name][0], want, rtol=0, atol=1e-6)
        # float64 models: the two routes agree far below 1e-6; effects not vacuous
        np.testing.assert_allclose(fast[name][0], want, rtol=0, atol=1e-9)
        assert np.abs(want).max() > (1e-5 if geometry == "multiscreen" else 1e-3)
    assert registry.architecture_of(model) is not None


def test_direction_rows_rank_select_and_name_every_direction():
    # hand-built mean drops over 2 examples: direction 5 largest on validation, then 2, ...
    G, d = 12, 4
    val_mean = np.array([0.1, 0.0, 0.9, -0.2, 0.3, 1.5, 0.05, 0.2, 0.0, 0.4, 0.6, 0.7])
    spread = np.array([[1.0], [-1.0]]) * 0.01  # mean over examples unchanged
    validation = (val_mean + spread, np.abs(np.arange(G, dtype=float))[None].repeat(2, 0))
    evaluation = (-val_mean[None].repeat(2, 0), np.zeros((2, G)))
    rows = C.direction_rows("before_wo", validation, evaluation, d)
    assert [r["direction"] for r in rows] == list(range(G))
    by = {r["direction"]: r for r in rows}
    assert by[5]["rank_validation"] == 1 and by[2]["rank_validation"] == 2
    assert by[3]["rank_validation"] == G  # the only negative drop is last
    # ties by index: directions 1 and 8 both 0.0 → 1 ranks before 8
    assert by[1]["rank_validation"] < by[8]["rank_validation"]
    assert {r["direction"] for r in rows if r["selected"]} == set(
        np.argsort(-val_mean, kind="stable")[: C.TOP_K]
    )
    assert by[7]["head"] == 1 and by[7]["index_in_head"] == 3  # j = h·d + k
    assert by[5]["drop_evaluation"] == pytest.approx(-1.5)
    assert by[11]["magnitude_validation"] == 11.0 and by[11]["magnitude_decile"] == 9
    after = C.direction_rows("after_wo", validation, evaluation, d)
    assert all(r["head"] is None and r["index_in_head"] is None for r in after)
