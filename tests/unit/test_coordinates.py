"""Coordinate concentration (docs §15.2): the batched single-direction patches equal a naive
hooked forward per direction; the share on planted effects; decile matching on a hand-built
magnitude vector, the random sets drawn without the selected directions and short deciles
merged; the null's p-value on planted and hand-counted cases; the Haar rotation keeps the
total patch (Σ_k r r^T = I)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from headgeom import results
from headgeom.heads.analysis import coordinates as C
from headgeom.model import registry, zoo
from tests.helpers.edges import edge_model as zoo_model
from tests.helpers.examples import random_pairs
from tests.helpers.models import N_VOCAB, TINY_ROUTED, multiscreen_model, perturbed


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
    # the earlier draw, selected included: the whole top decile is in every set
    old = C.matched_random_sets(m, chosen, 200, np.random.default_rng(0), include_selected=True)
    for s in old:
        assert len(set(s)) == 3 and {3, 12} <= set(s) and len(set(s) & {1, 11}) == 1
    assert {int(x) for s in old for x in s} == {1, 3, 11, 12}  # both bottom members drawn
    # without the selected: the top decile has no other member, so it is merged with decile
    # 8 ({7: 8.0, 18: 8.5}); the bottom decile keeps its one other member, 11
    assert C.null_strata(m, chosen) == [[0], [1], [2], [3], [4], [5], [6], [7], [8, 9]]
    assert C.strata_label(C.null_strata(m, chosen)) == "0,1,2,3,4,5,6,7,8+9"
    sets = C.matched_random_sets(m, chosen, 50, np.random.default_rng(0))
    assert {frozenset(s.tolist()) for s in sets} == {frozenset({7, 18, 11})}


def test_random_sets_exclude_the_selected_and_match_the_decile_counts():
    rng = np.random.default_rng(4)
    m = rng.random(100)  # deciles of exactly 10
    q = C.deciles(m)
    chosen = np.array([int(np.flatnonzero(q == b)[j]) for b, j in
                       [(9, 0), (9, 1), (9, 2), (9, 3), (8, 0), (8, 5), (5, 2), (2, 2),
                        (0, 0), (0, 9)]])  # fmt: skip
    want = np.bincount(q[chosen], minlength=10)
    assert C.null_strata(m, chosen) == [[b] for b in range(10)]
    sets = C.matched_random_sets(m, chosen, 500, np.random.default_rng(1))
    assert sets.shape == (500, 10)
    seen = set()
    for s in sets:
        assert len(set(s.tolist())) == 10  # without replacement within a set
        assert not set(s.tolist()) & set(chosen.tolist())
        np.testing.assert_array_equal(np.bincount(q[s], minlength=10), want)
        seen |= set(s.tolist())
    # every non-selected member of the deciles used is drawn somewhere (uniform over the pool)
    assert seen == {g for g in range(100) if want[q[g]] and g not in set(chosen.tolist())}


def test_short_middle_deciles_merge_upward_and_too_few_directions_fail():
    m = np.arange(20.0)  # decile b = {2b, 2b + 1}
    # decile 4 ({8, 9}) wholly selected: merged with decile 5 above it ({10, 11}), whose two
    # members then fill both places; decile 9: one selected, the other (19) fills it
    chosen = np.array([8, 9, 18])
    assert C.strata_label(C.null_strata(m, chosen)) == "0,1,2,3,4+5,6,7,8,9"
    sets = C.matched_random_sets(m, chosen, 20, np.random.default_rng(2))
    assert {frozenset(s.tolist()) for s in sets} == {frozenset({10, 11, 19})}
    with pytest.raises(ValueError, match=r"site before_wo: 15 directions leave 5 .* 10"):
        C.null_strata(np.arange(15.0), np.arange(10), "before_wo")


def planted(val_mean, eval_mean, magnitude, n=3, seed=0):
    """(N, G) per-example drops with the given means (zero-mean noise) and magnitudes."""
    noise = np.random.default_rng(seed).standard_normal((n, len(val_mean)))
    noise -= noise.mean(0)
    mags = np.broadcast_to(magnitude, (n, len(magnitude)))
    return val_mean + 0.1 * noise, eval_mean - 0.1 * noise, mags


def test_a_uniquely_best_selected_set_beats_every_random_set_with_the_smallest_p():
    rng = np.random.default_rng(7)
    G, n_sets = 100, 300
    top = rng.choice(G, 10, replace=False)
    val_mean, eval_mean = rng.uniform(-0.5, 1.0, G), rng.uniform(-0.5, 1.0, G)
    val_mean[top] = 5.0 + np.arange(10)  # the top 10 on validation ...
    eval_mean[top] = 2.0 + np.arange(10)  # ... and on evaluation, above every other direction
    val, ev, mags = planted(val_mean, eval_mean, rng.random(G))
    out = C.site_summary(val, ev, mags, n_sets, seed=11, site_name="after_wo")
    assert set(map(int, out["top_directions"].split(","))) == set(top.tolist())
    positive = eval_mean[eval_mean > 0].sum()
    assert out["share_evaluation"] == pytest.approx(eval_mean[top].sum() / positive)
    assert out["beats_every_random_set"] is True
    assert out["null_p_value"] == 1 / (n_sets + 1)
    assert out["null_fraction_at_least"] == 0.0
    assert out["null_max"] < out["share_evaluation"]


def test_p_value_of_a_selected_set_that_is_not_best_is_the_hand_count():
    # deciles of 3 ({3b, 3b+1, 3b+2}), the selected direction of each is 3b + 2; so every
    # random set has one of the two others of every decile: of decile 0, direction 0 or 1
    G, n_sets = 30, 400
    chosen = np.arange(2, G, 3)
    val_mean = np.zeros(G)
    val_mean[chosen] = 1.0
    eval_mean = np.zeros(G)
    eval_mean[chosen] = 0.3  # selected share 3.0 / 7.0
    eval_mean[0] = 4.0  # a random set with direction 0 has share 4 / 7, any other 0
    val, ev, mags = planted(val_mean, eval_mean, np.arange(G, dtype=float))
    out = C.site_summary(val, ev, mags, n_sets, seed=3)
    assert out["share_evaluation"] == pytest.approx(3 / 7)
    assert out["null_strata"] == "0,1,2,3,4,5,6,7,8,9"
    sets = C.matched_random_sets(
        np.arange(G, dtype=float), chosen, n_sets, np.random.default_rng(3)
    )
    with_0 = int(np.count_nonzero((sets == 0).any(1)))  # the sets with share 4/7 ≥ 3/7
    assert 0.4 * n_sets < with_0 < 0.6 * n_sets  # 0 or 1 with probability 1/2 each
    assert out["null_p_value"] == (1 + with_0) / (1 + n_sets)
    assert out["null_fraction_at_least"] == with_0 / n_sets
    assert out["beats_every_random_set"] is False
    assert out["null_max"] == pytest.approx(4 / 7)
    assert out["null_mean"] == pytest.approx(4 / 7 * with_0 / n_sets)


def test_the_earlier_draw_can_never_be_beaten_when_the_selected_fill_their_deciles():
    # the 10 selected are the 10 largest magnitudes (deciles 5–9, 2 each): the earlier draw
    # returns the selected set itself every time (p = 1); the unbiased draw merges every
    # decile into one stratum and returns the 10 others, which the selected set beats
    G, n_sets = 20, 100
    chosen = np.arange(10, 20)
    val_mean = np.where(np.arange(G) >= 10, 1.0, 0.0)
    eval_mean = np.where(np.arange(G) >= 10, 0.5, 0.1)
    val, ev, mags = planted(val_mean, eval_mean, np.arange(G, dtype=float))
    out = C.site_summary(val, ev, mags, n_sets, seed=5)
    assert out["top_directions"] == ",".join(map(str, chosen))
    assert out["share_evaluation"] == pytest.approx(5 / 6)
    assert out["null_incl_selected_max"] == pytest.approx(out["share_evaluation"])
    assert out["null_incl_selected_p_value"] == 1.0
    assert out["null_strata"] == "0+1+2+3+4+5+6+7+8+9"
    assert out["null_max"] == pytest.approx(1 / 6)
    assert out["beats_every_random_set"] is True and out["null_p_value"] == 1 / (n_sets + 1)


def test_no_positive_drop_gives_no_p_value():
    G = 30
    val, ev, mags = planted(np.linspace(1, 2, G), -np.ones(G), np.arange(G, dtype=float))
    out = C.site_summary(val, ev, mags, 20, seed=1)
    assert np.isnan(out["share_evaluation"]) and np.isnan(out["null_p_value"])
    assert out["beats_every_random_set"] is False and np.isnan(out["null_mean"])


def test_coordinate_rows_fill_the_coordinates_schema():
    torch.manual_seed(0)
    cfg = zoo.derive_model_config("learned", TINY_ROUTED, {})  # D = H·d = 24 ≥ 2k
    model = perturbed(registry.build_model(cfg, N_VOCAB), 0).double()
    pairs = [random_pairs(4, (5, 6), seed=s) for s in (1, 2)]
    val, ev = (SimpleNamespace(clean_ids=c, ref_ids=r, correct=a, incorrect=b)
               for c, r, a, b in pairs)  # fmt: skip
    e = np.zeros((model.cfg.n_layer, model.cfg.n_head))
    e[1, 2] = 1.0
    rows, directions = C.coordinate_rows(
        model,
        e,
        val,
        ev,
        n_sets=30,
        null_seed=1502,
        rotation_seed=1503,
        batch_size=64,
        max_rows=4096,
    )
    identity = {"model", "seed", "task"}
    assert [r["site"] for r in rows] == list(C.SITES)
    for r in rows:
        assert identity | set(r) == set(results.COORDINATES.names)
        assert (r["best_layer"], r["best_head"]) == (1, 2)
    assert identity | set(directions[0]) == set(results.COORDINATE_DIRECTIONS.names)


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


def test_a_site_too_small_for_a_null_has_none():
    """16 directions, 10 selected: no matched set of 10 exists outside the selection, so the
    null columns are NaN and the site beats nothing (the micro study's shape)."""
    G = 16
    val_mean = np.linspace(1.0, 2.0, G)
    val, ev, mags = planted(val_mean, val_mean, np.arange(G, dtype=float))
    out = C.site_summary(val, ev, mags, 50, seed=3)
    assert out["null_strata"] == "none: 16 directions, 10 selected"
    assert np.isnan(out["null_p_value"]) and np.isnan(out["null_max"])
    assert out["beats_every_random_set"] is False
    assert out["share_evaluation"] == pytest.approx(val_mean[6:].sum() / val_mean.sum())
