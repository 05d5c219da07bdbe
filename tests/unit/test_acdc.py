"""ACDC (docs §15.4): its graph forward is the model's forward; on a model with a planted
two-edge circuit it finds exactly that circuit; its decisions match an independent hooked
recomputation."""

from __future__ import annotations

import numpy as np
import torch

from headgeom.analysis import acdc as A
from headgeom.analysis.edges import final_logits
from tests.unit.test_edges import random_pairs, zoo_model


def test_graph_forward_is_the_model_forward():
    for geometry in ("learned", "all-rotated", "value384"):
        model = zoo_model(geometry)
        clean, ref = (torch.as_tensor(np.stack(a)) for a in random_pairs(4, (6,))[:2])
        graph = A.Graph(model, clean, ref)
        torch.testing.assert_close(
            final_logits(model, graph.clean_cache["final"]),
            model(clean, last_only=True),
            rtol=0,
            atol=1e-10,
        )
        assert graph.metric(frozenset(), 0) == 0.0 or abs(graph.metric(frozenset(), 0)) < 1e-12


def planted_model():
    """Only head (0, 0) writes (other heads' W_O and every MLP output are 0) and it attends
    uniformly (W_Q = W_K = 0): the circuit is embedding → (0, 0).V → logits."""
    model = zoo_model("learned")
    H, d = model.cfg.n_head, model.cfg.d_head
    with torch.no_grad():
        for lay, block in enumerate(model.blocks):
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            w = block.attn.writer.c_proj.weight
            keep = w[:, :d].clone() * 3
            w.zero_()
            if lay == 0:
                w[:, :d] = keep
                qk = block.attn.reader.c_attn.weight[: 2 * H * d]
                qk.zero_()
    return model


def test_acdc_recovers_a_planted_two_edge_circuit():
    model = planted_model()
    clean, ref = random_pairs(6, (6,), seed=3)[:2]
    result = A.acdc(model, clean, ref, threshold=1e-3, n_checks=10)
    assert set(result.kept) == {(A.EMBED, ("v", 0, 0)), (("head", 0, 0), A.LOGITS)}
    for _, engine, hooked in result.checks:
        assert abs(engine - hooked) < 1e-9


def test_decisions_match_the_hooked_recomputation_on_a_random_model():
    model = zoo_model("all-rotated")  # small frozen writes: a small threshold
    clean, ref = random_pairs(4, (5,), seed=2)[:2]
    result = A.acdc(model, clean, ref, threshold=1e-7, n_checks=12)
    assert len(result.checks) == 12
    for _, engine, hooked in result.checks:
        assert abs(engine - hooked) < 1e-9
    assert 0 < len(result.kept) < len(A.graph_edges(3, 4))
