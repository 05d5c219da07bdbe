"""Compression as simulated weights (headgeom.atlas.compression), against hand-computed
codes, scales and sizes, a naive per-group loop, Eckart–Young and the article's own sizes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from headgeom.atlas import compression as cq
from headgeom.atlas.tensor_groups import Weights
from tests.helpers import atlas_weights as aw
from tests.helpers.models import small_gpt


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p ‖ q) of next-token distributions, mean over positions (float64)."""
    lp, lq = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def naive_quantize(w: np.ndarray, bits: int, group: int, scheme: str):
    """(values, codes): one group at a time in Python floats, float16 scale and minimum,
    round half to even, the last group of a row as long as what is left."""
    x = np.asarray(w, dtype=np.float64)
    rows = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    values, codes = np.zeros_like(rows), np.zeros_like(rows)
    for r, row in enumerate(rows):
        for start in range(0, row.size, group):
            g = row[start : start + group].astype(np.float32)
            if scheme == "absmax":
                qmax = 2 ** (bits - 1) - 1
                s = float(np.float16(np.float32(np.abs(g).max()) / np.float32(qmax)))
                lo, cmin, cmax = 0.0, -qmax, qmax
            else:
                cmax = 2**bits - 1
                s = float(np.float16((np.float32(g.max()) - np.float32(g.min())) / cmax))
                lo, cmin = float(np.float16(g.min())), 0
            for i, v in enumerate(g):
                c = 0.0 if s == 0 else min(max(np.round((np.float32(v) - lo) / s), cmin), cmax)
                codes[r, start + i] = c
                values[r, start + i] = np.float32(lo + c * s)
    return values.reshape(x.shape), codes.reshape(x.shape)


# ------------------------------------------------------------------ hand-built groups
@pytest.mark.parametrize(
    ("bits", "row", "scale", "codes", "values"),
    [
        # absmax 15.875 = 127 · 0.125; x / 0.125 = 127, −10.4, 0.48, 16
        (8, [15.875, -1.3, 0.06, 2.0], 0.125, [127, -10, 0, 16], [15.875, -1.25, 0.0, 2.0]),
        # absmax 3.5 = 7 · 0.5; x / 0.5 = −7, 0.6, 2.2, 4.4
        (4, [-3.5, 0.3, 1.1, 2.2], 0.5, [-7, 1, 2, 4], [-3.5, 0.5, 1.0, 2.0]),
        # int2 has codes −1, 0, 1: absmax 2 = 1 · 2; x / 2 = −1, 0.45, 0.55, 0.15
        (2, [-2.0, 0.9, 1.1, 0.3], 2.0, [-1, 0, 1, 0], [-2.0, 0.0, 2.0, 0.0]),
    ],
)
def test_absmax_codes_and_scales_by_hand(bits, row, scale, codes, values):
    q = cq.quantize(_t([row]), bits, group=4, scheme="absmax")
    assert q.scales.tolist() == [[scale]] and q.minima is None
    assert q.codes.tolist() == [codes]
    assert q.values.tolist() == [values]


@pytest.mark.parametrize(
    ("bits", "row", "scale", "codes", "values"),
    [
        # [min, max] = [−1, 2.75], 15 steps of 0.25; (x + 1) / 0.25 = 0, 5.2, 8.4, 15
        (4, [-1.0, 0.3, 1.1, 2.75], 0.25, [0, 5, 8, 15], [-1.0, 0.25, 1.0, 2.75]),
        # 3 steps of 1.25; (x + 1) / 1.25 = 0, 1.04, 1.68, 3
        (2, [-1.0, 0.3, 1.1, 2.75], 1.25, [0, 1, 2, 3], [-1.0, 0.25, 1.5, 2.75]),
        # 255 steps of 0.0625 on [−8, 7.9375]; (x + 8) / 0.0625 = 0, 131.2, 255, 129.6
        (8, [-8.0, 0.2, 7.9375, 0.1], 0.0625, [0, 131, 255, 130], [-8.0, 0.1875, 7.9375, 0.125]),
    ],
)
def test_minmax_codes_scales_and_minima_by_hand(bits, row, scale, codes, values):
    q = cq.quantize(_t([row]), bits, group=4, scheme="minmax")
    assert q.scales.tolist() == [[scale]] and q.minima.tolist() == [[row[0]]]
    assert q.codes.tolist() == [codes]
    assert q.values.tolist() == [values]


@pytest.mark.parametrize("scheme", cq.SCHEMES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_a_group_of_zeros_stays_zero(scheme, bits):
    q = cq.quantize(_t([[0.0] * 4, [1.0, -1.0, 0.5, 0.25]]), bits, group=4, scheme=scheme)
    assert q.values[0].tolist() == [0.0] * 4 and q.codes[0].tolist() == [0] * 4
    assert q.scales[0].tolist() == [0.0] and q.scales[1].item() > 0


def test_ragged_last_group_and_rows_are_grouped_apart():
    # a row of 7 in groups of 4: the last group is [0.5, 1.2, 2.0] alone (min 0.5, not a
    # padding 0): 3 steps of 0.5; (x − 0.5) / 0.5 = 0, 1.4, 3
    row = [-1.0, 0.3, 1.1, 2.75, 0.5, 1.2, 2.0]
    q = cq.quantize(_t([row, [2 * v for v in row]]), 2, group=4, scheme="minmax")
    assert q.scales.tolist() == [[1.25, 0.5], [2.5, 1.0]]
    assert q.minima.tolist() == [[-1.0, 0.5], [-2.0, 1.0]]
    assert q.codes.tolist() == [[0, 1, 2, 3, 0, 1, 3]] * 2
    assert q.values[0].tolist() == [-1.0, 0.25, 1.5, 2.75, 0.5, 1.0, 2.0]
    assert q.values[1].tolist() == [-2.0, 0.5, 3.0, 5.5, 1.0, 2.0, 4.0]
    # absmax, the ragged group [0.5, −1.2, 3.5]: scale 0.5; x / 0.5 = 1, −2.4, 7
    r = cq.quantize(_t([[0.1, 0.2, 0.3, 0.7, 0.5, -1.2, 3.5]]), 4, group=4, scheme="absmax")
    assert r.scales[0, 1].item() == 0.5
    assert r.codes[0, 4:].tolist() == [1, -2, 7]
    assert r.values[0, 4:].tolist() == [0.5, -1.0, 3.5]


@pytest.mark.parametrize("scheme", cq.SCHEMES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(3, 70), (2, 3, 130), (64,)])
def test_quantize_equals_the_naive_group_loop(scheme, bits, shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(bits)) * 3
    q = cq.quantize(w, bits, scheme=scheme)  # groups of 64: 70 = 64 + 6, 130 = 2 · 64 + 2
    values, codes = naive_quantize(w.numpy(), bits, 64, scheme)
    assert q.codes.numpy().tolist() == codes.astype(np.int64).tolist()
    assert np.array_equal(q.values.numpy(), values.astype(np.float32))
    assert q.values.dtype == w.dtype and q.values.shape == w.shape


# ------------------------------------------------------------------ sizes
def test_sizes_by_hand():
    # 3 rows of 70 at int4: 840 values · 4 bits = 105 bytes; 2 groups a row (64 + 6)
    assert cq.quantized_bytes((3, 70), 4, 64, "minmax") == 105 + 6 * 4  # scale + minimum
    assert cq.quantized_bytes((3, 70), 4, 64, "absmax") == 105 + 6 * 2  # scale
    assert cq.quantized_bytes((1, 5), 2) == 2 + 4  # 10 bits round up to 2 bytes
    assert cq.quantized_bytes((70,), 8, 64, "absmax") == 70 + 2 * 2
    assert cq.quantized_bytes((2, 3, 130), 8) == 780 + 6 * 3 * 4
    assert cq.dense_bytes((3, 70)) == 420
    assert cq.quantize(torch.zeros(3, 70), 4).nbytes == 129


def test_sizes_reproduce_the_articles_table_sizes():
    """E2B's PLE table: 262,144 tokens × 35 layers × 256 (2.35B values); E4B's: 42 layers."""
    e2b, e4b = (262_144, 35 * 256), (262_144, 42 * 256)
    gb = lambda n: round(n / 1e9, 2)  # noqa: E731
    assert gb(cq.dense_bytes(e2b)) == 4.70 and gb(cq.quantized_bytes(e2b, 4)) == 1.32
    assert gb(cq.quantized_bytes((131_072 + 1, 35 * 256), 4)) == 0.66  # int4, 128k tokens
    assert gb(cq.dense_bytes(e4b)) == 5.64 and gb(cq.quantized_bytes(e4b, 4)) == 1.59
    assert gb(cq.quantized_bytes(e4b, 2)) == 0.88
    assert gb(cq.quantized_bytes(e2b, 4, scheme="absmax")) == 1.25  # not the article's


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="bits must be 2"):
        cq.quantize(torch.ones(4), 1)
    with pytest.raises(ValueError, match="scheme must be one of"):
        cq.quantize(torch.ones(4), 4, scheme="nf4")


# ------------------------------------------------------------------ tensor groups
def test_quantize_group_changes_the_groups_matrices_only():
    w = Weights.of(aw.tiny_gemma4())
    out = cq.quantize_group(w, "attention", 4)
    changed = [n for n in w.tensors if not torch.equal(out.weights.tensors[n], w.tensors[n])]
    expected = [n for n in w.tensors if ".self_attn." in n and n.endswith("_proj.weight")]
    assert changed == expected == list(out.names)
    for n in expected:
        values, _ = naive_quantize(w.tensors[n].numpy(), 4, 64, "minmax")
        assert np.array_equal(out.weights.tensors[n].numpy(), values.astype(np.float32))
    # q (32, 32), k (16, 32), v (16, 32), o (32, 32) per layer: one group a row
    rows = 2 * (32 + 16 + 16 + 32)
    assert out.nbytes == rows * 32 // 2 + rows * 4 and out.dense_nbytes == rows * 32 * 2


def test_ple_table_is_quantised_layer_slice_by_slice_with_mixed_precision():
    w = Weights.of(aw.tiny_gemma4())
    name = "model.embed_tokens_per_layer.weight"  # (97, 2 · 8): layer l is columns 8l … 8l + 7
    table = w.tensors[name].numpy()
    out = cq.quantize_group(w, "ple_table", 2, layer_bits={1: 8})
    assert out.names == (name,)
    got = out.weights.tensors[name].numpy()
    assert np.array_equal(got[:, :8], naive_quantize(table[:, :8], 2, 64, "minmax")[0])
    assert np.array_equal(got[:, 8:], naive_quantize(table[:, 8:], 8, 64, "minmax")[0])
    # per slice: 97 rows of 8 codes and one group (4 bytes) a row
    assert out.nbytes == (97 * 8 * 2 // 8 + 97 * 4) + (97 * 8 + 97 * 4)
    with pytest.raises(ValueError, match="layer_bits names layers"):
        cq.quantize_group(w, "ple_table", 2, layer_bits={5: 8})


def test_mixed_precision_picks_the_most_sensitive_layers_on_another_corpus():
    scores = {0: 0.1, 1: 0.5, 2: 0.5, 3: 0.05}
    assert cq.mixed_precision(scores, 2, 8, chosen_on="code", scored_on="prose") == {1: 8, 2: 8}
    assert cq.mixed_precision(scores, 1, 4, chosen_on="code", scored_on="prose") == {1: 4}
    with pytest.raises(ValueError, match="choose them on another corpus"):
        cq.mixed_precision(scores, 1, 8, chosen_on="prose", scored_on="prose")
    with pytest.raises(ValueError, match="not finite"):
        cq.mixed_precision({0: float("nan")}, 1, 8, chosen_on="a", scored_on="b")
    # applied to our GPT's MLPs: layer 1 at int8, the others at int2
    w = Weights.of(small_gpt())
    layer_bits = cq.mixed_precision({0: 0.0, 1: 1.0, 2: 0.5}, 1, 8, chosen_on="a", scored_on="b")
    out = cq.quantize_group(w, "mlp", 2, layer_bits=layer_bits)
    for n in out.names:
        bits = 8 if n.startswith("blocks.1.") else 2
        values, _ = naive_quantize(w.tensors[n].numpy(), bits, 64, "minmax")
        assert np.array_equal(out.weights.tensors[n].numpy(), values.astype(np.float32)), n


def test_int8_moves_predictions_less_than_int2():
    model = small_gpt()
    w = Weights.of(model)
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model(ids)
        kl = {}
        for bits in (8, 2):
            q = w
            for group in ("attention", "mlp"):
                q = cq.quantize_group(q, group, bits).weights
            kl[bits] = _kl(base, q.load_into(copy.deepcopy(model))(ids))
    assert 0 < kl[8] < kl[2]


# ------------------------------------------------------------------ low rank
def test_low_rank_error_is_the_tail_singular_values():
    w = torch.randn(12, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    s = np.linalg.svd(w.numpy(), compute_uv=False)
    approx = cq.low_rank(w, range(10))
    for k, a in approx.items():
        err = float(torch.linalg.matrix_norm(w - a) ** 2)
        assert err == pytest.approx(float(np.sum(s[k:] ** 2)), rel=1e-9, abs=1e-12), k
        assert np.linalg.matrix_rank(a.numpy()) == k
    assert torch.allclose(approx[9], w, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="rank 10 is not in 0"):
        cq.low_rank(w, [10])


def test_low_rank_group_and_its_size():
    w = Weights.of(small_gpt())  # wte (40, 32): rank-k factors hold k · (40 + 32) values
    out = cq.low_rank_group(w, "embedding", [1, 4])
    assert set(out) == {1, 4} and out[4].names == ("wte.weight",)
    assert out[4].nbytes == 4 * 72 * 2 and out[1].nbytes == 72 * 2
    assert out[4].dense_nbytes == 40 * 32 * 2
    assert np.linalg.matrix_rank(out[4].weights.tensors["wte.weight"].numpy()) == 4
    assert cq.low_rank_bytes((3, 12, 9), 2) == 3 * 2 * 21 * 2


# ------------------------------------------------------------------ vocabulary pruning
def test_counts_and_most_frequent_tokens():
    counts = cq.token_counts([[1, 1, 2], np.array([3, 1, 2, 4])], 6)
    assert counts.tolist() == [0, 3, 2, 1, 1, 0]
    assert cq.most_frequent(counts, 2).tolist() == [1, 2]
    assert cq.most_frequent(counts, 3).tolist() == [1, 2, 3]  # 3 and 4 tie: the lower id
    with pytest.raises(ValueError, match="outside 0"):
        cq.token_counts([[6]], 6)


def test_pruned_tokens_read_the_fallback_row():
    model = small_gpt()
    w = Weights.of(model)
    table = w.tensors["wte.weight"]
    out = cq.prune_vocabulary(w, "wte.weight", [1, 2])
    got = out.weights.tensors["wte.weight"]
    mean = table.double().numpy().mean(0).astype(np.float32)
    assert torch.equal(got[1:3], table[1:3])
    for i in [0, *range(3, 40)]:
        assert np.array_equal(got[i].numpy(), mean), i
    assert out.nbytes == 3 * 32 * 2 and out.dense_nbytes == 40 * 32 * 2  # 2 rows + fallback
    # a pruned token is indistinguishable from another pruned one, in and out (tied)
    pruned = out.weights.load_into(copy.deepcopy(model))
    with torch.no_grad():
        l0, l5 = pruned(torch.tensor([[0, 7]])), pruned(torch.tensor([[5, 7]]))
        l1, l2 = pruned(torch.tensor([[1, 7]])), pruned(torch.tensor([[2, 7]]))
    assert torch.equal(l0, l5) and not torch.equal(l1, l2)
    assert torch.equal(l1[..., 0], l1[..., 5])
    zero = cq.prune_vocabulary(w, "wte.weight", [1, 2], fallback="zero")
    assert not zero.weights.tensors["wte.weight"][0].any()
    with pytest.raises(ValueError, match="not a vocabulary table"):
        cq.prune_vocabulary(w, "wpe.weight", [1])


def test_pruning_with_int4_quantises_the_kept_rows_and_the_fallback():
    w = Weights.of(aw.tiny_gemma4())
    name = "model.embed_tokens_per_layer.weight"
    keep = [3, 4, 50]
    dense = cq.prune_vocabulary(w, name, keep).weights.tensors[name].numpy()
    out = cq.prune_vocabulary(w, name, keep, bits=4)
    got = out.weights.tensors[name].numpy()
    for cols in (slice(0, 8), slice(8, 16)):
        assert np.array_equal(got[:, cols], naive_quantize(dense[:, cols], 4, 64, "minmax")[0])
    # per slice of 8 columns: 4 stored rows (3 kept + the fallback) of 8 int4 codes, and one
    # group (4 bytes) a row
    assert out.nbytes == 2 * (4 * 8 // 2 + 4 * 4)
    assert out.dense_nbytes == 97 * 16 * 2
