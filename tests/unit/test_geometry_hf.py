"""The weight-space geometry summary (docs §9, §14.1, §14.3) of transformers causal LMs, its
projection kernels and scaled idempotence against maps extracted here from the modules (W_O
from unit vectors through the output projection, W_X from the projections' Jacobians; a
grouped-query head reads its key/value head's maps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.heads.analysis.geometry_summary import geometry_tables  # noqa: E402
from headgeom.model.hf import HFCausalLM  # noqa: E402
from tests.helpers.hf_models import (  # noqa: E402
    fused_slices,
    o_proj,
    projection_modules,
    tiny_family_model,
)


@pytest.fixture(scope="module", params=["llama", "gpt2", "gpt_neox", "gemma2"])
def model(request):
    return HFCausalLM.wrap(tiny_family_model(request.param, seed=11))


def _write(model, layer, h) -> np.ndarray:
    H, d = model.cfg.n_head, model.cfg.d_head
    proj = o_proj(model.hf, layer)
    with torch.no_grad():
        units = torch.eye(H * d)[h * d : (h + 1) * d]
        return (proj(units) - proj(torch.zeros(1, H * d))).T.double().numpy()  # (D, d)


def _read(model, layer, X, h) -> np.ndarray:
    """W_X of query head h (d, D): for K, V the rows of the key/value head it reads."""
    d, D = model.cfg.d_head, model.cfg.d_model
    j = h if X == "Q" else next(g for g, hs in enumerate(model.cfg.kv_groups) if h in hs)
    n = model.cfg.n_head if X == "Q" else model.cfg.n_kv_head
    module = projection_modules(model.hf, layer, X)
    jac = torch.autograd.functional.jacobian(lambda v: module(v[None])[0], torch.zeros(D))
    return jac[fused_slices(model.cfg.family, X, n, d, D)[j]].double().numpy()


def _projector(M):
    u, s, _ = np.linalg.svd(M, full_matrices=False)
    u = u[:, s > 1e-6 * s.max()]  # the rank cut of docs §9.1
    return u @ u.T


def test_the_pk_rows_cover_every_pair_and_equal_projector_traces(model):
    geo = geometry_tables(model, "m", 0, "ckpt")
    L, H = model.cfg.n_layer, model.cfg.n_head
    ww, wr = geo.pk[geo.pk["kind"] == "write_write"], geo.pk[geo.pk["kind"] == "write_read"]
    assert len(ww) == sum(H * H * (L - 1 - layer) for layer in range(L))
    assert len(wr) == 3 * len(ww)
    for kind, (sl, sh, tl, th, X) in (
        ("write_write", (0, 1, 2, 3, None)),
        ("write_read", (0, 1, 2, 3, "K")),
        ("write_read", (1, 0, 2, 2, "V")),
        ("write_read", (0, 2, 1, 1, "Q")),
    ):
        target = _write(model, tl, th) if X is None else _read(model, tl, X, th).T
        expected = np.trace(_projector(_write(model, sl, sh)) @ _projector(target))
        rows = geo.pk[(geo.pk["kind"] == kind) & (geo.pk["source_layer"] == sl)
                      & (geo.pk["source_head"] == sh) & (geo.pk["target_layer"] == tl)
                      & (geo.pk["target_head"] == th)]  # fmt: skip
        if X is not None:
            rows = rows[rows["read_type"] == X]
        assert len(rows) == 1
        assert rows["pk"].iloc[0] == pytest.approx(expected, abs=1e-9), (kind, X)
    # learned writes do not decompose R^D orthogonally: Proposition 1 does not apply
    assert not geo.prop1_applies and geo.designed_pk_residual is None


def test_idempotence_and_self_alignment_use_each_query_heads_own_value_map(model):
    geo = geometry_tables(model, "m", 0, "ckpt")
    heads = geo.heads.set_index(["layer", "head"])
    for layer, h in ((1, 3), (2, 0)):
        W_O, W_V = _write(model, layer, h), _read(model, layer, "V", h)
        T = W_O @ W_V  # (D, D) = O_h V_hᵀ, its value map the kv head's
        T2 = T @ T
        expected = np.sum(T2 * T) ** 2 / (np.sum(T2 * T2) * np.sum(T * T))
        assert heads.loc[(layer, h), "idempotence"] == pytest.approx(expected, rel=1e-9)
        pk_self = np.trace(_projector(W_V.T) @ _projector(W_O))
        assert heads.loc[(layer, h), "pk_self"] == pytest.approx(pk_self, abs=1e-9)
    if model.cfg.n_kv_head < model.cfg.n_head:  # two query heads of a group: one value map,
        g = model.cfg.kv_groups[0]  # different writes, different self-alignment
        assert heads.loc[(1, g[0]), "pk_self"] != pytest.approx(heads.loc[(1, g[1]), "pk_self"])
