"""The edge-patching engine (docs §15.1) equals a naive one-forward-per-edge hook
implementation on random tiny models of every GPT zoo geometry; an edge whose writer is
orthogonal to a block reader's block has KL exactly 0; the paper-shape edge counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.analysis import edges as E
from headgeom.model import registry, zoo
from tests.unit.test_patching_fast import multiscreen_model, perturbed, random_pairs

TINY = dict(n_layer=3, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16, init_std=0.5)
TINY_ROUTED = dict(n_layer=3, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16, init_std=0.5)
N_VOCAB = 29


def zoo_model(geometry: str, seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    arch = TINY_ROUTED if geometry.startswith("write-routed") else TINY
    model = registry.build_model(zoo.derive_model_config(geometry, arch, {}), N_VOCAB)
    return perturbed(model, seed).to(dtype)


def test_edge_counts_at_paper_shape():
    # Σ_{l<l'} H·H·3 by direct enumeration, not the closed form
    def count(L, H):
        return sum(H * H * 3 for lr in range(L) for lw in range(lr))

    assert count(12, 12) == 28_512 and count(12, 16) == 50_688
    assert E.edge_count(12, 12) == 28_512 and E.edge_count(12, 16) == 50_688
    edges = E.all_edges(4, 3)
    assert len(edges) == count(4, 3) == E.edge_count(4, 3)
    assert (edges.writer_layer < edges.reader_layer).all()
    keys = set(zip(*(a.tolist() for a in edges.arrays()), strict=False))
    assert len(keys) == len(edges)  # no edge twice


@pytest.mark.parametrize("geometry", sorted(registry.geometry_names("gpt")))
def test_engine_equals_naive_for_every_geometry(geometry):
    model = zoo_model(geometry)
    pairs = random_pairs(6, (5, 7))[:2]
    edges = E.all_edges(model.cfg.n_layer, model.cfg.n_head)
    naive = E.edge_kl_naive(model, *pairs, edges, batch_size=4)
    fast = E.edge_kl(model, *pairs, edges, batch_size=4, max_rows=40)  # many chunks
    assert fast.shape == (6, len(edges)) and fast.dtype == np.float64
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-6)
    assert naive.max() > 1e-3, naive.max()  # not vacuous
    resumed = E.edge_kl_naive(model, *pairs, edges, resume=True, batch_size=3)
    np.testing.assert_allclose(resumed, naive, rtol=0, atol=1e-6)


def test_engine_in_float32_within_1e6():
    model = zoo_model("learned", dtype=torch.float32)
    pairs = random_pairs(4, (6,))[:2]
    edges = E.all_edges(3, 4)
    naive = E.edge_kl_naive(model, *pairs, edges)
    np.testing.assert_allclose(E.edge_kl(model, *pairs, edges), naive, rtol=0, atol=1e-6)


def test_orthogonal_writer_gives_exactly_zero():
    # all-common-axis: writer (l, h) writes only the coordinates of block h, reader (l', h')
    # reads only block h': for h != h' the patched input equals the clean one exactly.
    model = zoo_model("all-common-axis", dtype=torch.float32)
    pairs = random_pairs(4, (6,))[:2]
    edges = E.all_edges(3, 4)
    kl = E.edge_kl(model, *pairs, edges)
    cross = edges.writer_head != edges.reader_head
    assert (kl[:, cross] == 0.0).all()
    assert kl[:, ~cross].max() > 1e-3 and (kl[:, ~cross] > 0).mean() > 0.5  # not vacuous


def test_multiscreen_is_refused_by_name():
    model = multiscreen_model("learned")
    with pytest.raises(ValueError, match="prefix_reuse"):
        E.edge_kl(model, *random_pairs(2, (5,))[:2])
