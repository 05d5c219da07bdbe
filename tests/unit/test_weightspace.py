"""Weight-space geometry (docs §9.1–9.4, §14.1, §14.3; check C14), the geometry_stats
script and the geometry columns of Table 2, from first principles."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom.hashing import ManifestMismatchError, content_hash, sha256_file
from headgeom.heads.analysis.tolerance import model_dtype, rounding_tolerance
from headgeom.heads.analysis.weightspace import (
    HeadMaps,
    head_maps,
    head_spaces,
    idempotence,
    index_stats,
    pk_matrix,
    proposition1,
    scaled_idempotence,
    self_alignment,
    write_read_pk,
    write_write_pk,
)
from headgeom.heads.paper.setup import table2
from headgeom.heads.stages import geometry_stats as geometry_stats_stage
from headgeom.io import read_json, read_parquet_metadata, write_manifest, write_parquet
from headgeom.model.checkpoint import save_checkpoint
from headgeom.model.geometries import READ_TYPES, write_scale
from headgeom.model.gpt import GPT
from headgeom.subspace import orthonormal_basis, projection_kernel
from tests.helpers import models
from tests.helpers.models import small_gpt

N_LAYER, N_HEAD, D_MODEL, D_HEAD = models.L, models.H, models.D, models.DH


def tiny_model(geometry: str, seed: int = 0) -> GPT:
    return small_gpt(geometry, seed, weights="normal")


def brute_pk(A: np.ndarray, B: np.ndarray) -> float:
    """tr(P_A P_B) from the D×D projectors of arbitrary spanning matrices."""
    U, V = orthonormal_basis(A), orthonormal_basis(B)
    return float(np.trace((U @ U.T) @ (V @ V.T)))


def random_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


# --------------------------------------------------------------------------- spaces and PK
@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_spaces_come_from_the_model_api_and_pk_of_a_space_with_itself_is_its_dim(geometry):
    model = tiny_model(geometry)
    maps = head_maps(model)
    assert maps.write.shape == (N_LAYER, N_HEAD, D_MODEL, D_HEAD)
    for X in READ_TYPES:
        assert maps.read[X].shape == (N_LAYER, N_HEAD, D_HEAD, D_MODEL)
    block = model.blocks[1]
    np.testing.assert_array_equal(
        maps.write[1], block.attn.writer.write_maps().detach().double().numpy()
    )
    np.testing.assert_array_equal(
        maps.read["K"][1], block.attn.reader.read_maps("K").detach().double().numpy()
    )
    spaces = head_spaces(maps)
    for layer, head in itertools.product(range(N_LAYER), range(N_HEAD)):
        U = spaces.write[layer][head]
        assert U.shape == (D_MODEL, D_HEAD)  # full column rank
        assert pk_matrix([U], [U])[0, 0] == pytest.approx(D_HEAD, abs=1e-12)
        for X in READ_TYPES:
            R = spaces.read[X][layer][head]
            assert pk_matrix([R], [R])[0, 0] == pytest.approx(D_HEAD, abs=1e-12)
            # R_{X,0} = Im W_Xᵀ: every row of W_X lies in it
            W = maps.read[X][layer, head]
            np.testing.assert_allclose(W @ R @ R.T, W, atol=1e-12)


def test_pk_matrix_equals_trace_of_projector_products():
    rng = np.random.default_rng(0)
    D = 12
    spans = [rng.standard_normal((D, k)) for k in (3, 5, 1)] + [np.zeros((D, 2))]
    bases = [orthonormal_basis(A) for A in spans]
    assert bases[-1].shape == (D, 0)  # rank 0: PK 0 with anything
    pk = pk_matrix(bases, bases[::-1])
    for i, j in itertools.product(range(4), range(4)):
        assert pk[i, j] == pytest.approx(brute_pk(spans[i], spans[::-1][j]), abs=1e-12)
        assert pk[i, j] == pytest.approx(projection_kernel(bases[i], bases[::-1][j]), abs=1e-12)


def test_learned_pairs_cover_every_later_head_and_match_brute_force():
    model = tiny_model("learned")
    maps = head_maps(model)
    spaces = head_spaces(maps)
    ww, wr = write_write_pk(spaces), write_read_pk(spaces)
    n_pairs = sum(N_HEAD * N_HEAD for a, b in itertools.combinations(range(N_LAYER), 2))
    assert len(ww) == n_pairs and len(wr) == 3 * n_pairs
    assert (ww["target_layer"] > ww["source_layer"]).all()
    assert (wr["target_layer"] > wr["source_layer"]).all()
    assert ww["read_type"].isna().all() and set(wr["read_type"]) == set(READ_TYPES)
    row = wr[
        (wr["source_layer"] == 0)
        & (wr["source_head"] == 2)
        & (wr["target_layer"] == 2)
        & (wr["target_head"] == 1)
        & (wr["read_type"] == "Q")
    ].iloc[0]
    expected = brute_pk(maps.write[0, 2], maps.read["Q"][2, 1].T)
    assert row["pk"] == pytest.approx(expected, abs=1e-12)
    assert row["rho"] == pytest.approx(expected / D_HEAD, abs=1e-12)
    assert 0 < row["rho"] < 1
    np.testing.assert_array_equal(ww["same_index"], ww["source_head"] == ww["target_head"])


def test_write_common_axis_write_write_pk_is_d_on_the_same_index_and_0_elsewhere():
    spaces = head_spaces(head_maps(tiny_model("write-common-axis")))
    ww = write_write_pk(spaces)
    same = ww["source_head"] == ww["target_head"]
    np.testing.assert_allclose(ww.loc[same, "pk"], D_HEAD, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ww.loc[~same, "pk"], 0.0, rtol=0, atol=1e-12)
    stats = index_stats(ww)
    assert stats["same_index_min"] == pytest.approx(D_HEAD, abs=1e-12)
    assert stats["other_index_max"] == pytest.approx(0.0, abs=1e-12)


# --------------------------------------------------------------------------- Proposition 1
def test_proposition1_holds_on_the_frozen_buffers_and_not_for_learned_writes():
    model = tiny_model("write-common-axis")
    writer = model.blocks[0].attn.writer
    assert isinstance(writer.basis, torch.Tensor) and writer.basis.dtype == torch.float64
    assert "basis" in dict(writer.named_buffers())
    maps = head_maps(model)
    # the maps are the buffer itself, times g
    expected = (write_scale(model.cfg) * writer.basis).reshape(D_MODEL, N_HEAD, D_HEAD)
    np.testing.assert_array_equal(maps.write[0], expected.permute(1, 0, 2).numpy())
    result = proposition1(head_spaces(maps), D_HEAD)
    assert result.applies
    assert result.decomposition_residual <= 1e-8
    assert result.max_residual <= 1e-8

    learned = proposition1(head_spaces(head_maps(tiny_model("learned"))), D_HEAD)
    assert not learned.applies
    assert learned.decomposition_residual > 1e-3
    assert np.isnan(learned.max_residual)


def decomposed_maps(rng: np.random.Generator, n_layer=3, n_head=3, d=4, orthogonal=True):
    """Hand-made maps: each layer's writes are the blocks of a random orthogonal matrix,
    each mixed by a random invertible d×d matrix (so W_O itself is not orthonormal), and
    random readers (one rank-deficient)."""
    D = n_head * d
    write = np.empty((n_layer, n_head, D, d))
    for layer in range(n_layer):
        Q = random_orthogonal(D, rng) if orthogonal else rng.standard_normal((D, D))
        for h in range(n_head):
            write[layer, h] = Q[:, h * d : (h + 1) * d] @ rng.standard_normal((d, d))
    read = {X: rng.standard_normal((n_layer, n_head, d, D)) for X in READ_TYPES}
    read["V"][-1, 0, -1] = read["V"][-1, 0, 0]  # a rank d−1 reader
    return HeadMaps(write, read)


def test_proposition1_and_the_inter_index_identity_on_a_hand_made_decomposition():
    rng = np.random.default_rng(3)
    spaces = head_spaces(decomposed_maps(rng))
    assert spaces.read["V"][-1][0].shape[1] == 3
    result = proposition1(spaces, 4)
    assert result.applies and result.max_residual <= 1e-8
    # Σ_h PK(U^{l,h}, R) = dim R for a reader of any dimension, written out by hand
    R = orthonormal_basis(rng.standard_normal((12, 5)))
    for layer in spaces.write:
        assert sum(projection_kernel(U, R) for U in layer) == pytest.approx(5, abs=1e-10)
    # inter-index identity: Σ_{h≠h'} PK(U^{l,h}, R^{l',h'}) = dim R − PK(U^{l,h'}, R^{l',h'})
    wr = write_read_pk(spaces)
    for (sl, tl, th, X), group in wr.groupby(
        ["source_layer", "target_layer", "target_head", "read_type"]
    ):
        other = group.loc[group["source_head"] != th, "pk"].sum()
        same = group.loc[group["source_head"] == th, "pk"].item()
        dim = group["target_dim"].iloc[0]
        assert other == pytest.approx(dim - same, abs=1e-10), (sl, tl, th, X)


def test_proposition1_is_not_reported_without_an_orthogonal_decomposition():
    rng = np.random.default_rng(4)
    oblique = proposition1(head_spaces(decomposed_maps(rng, orthogonal=False)), 4)
    assert not oblique.applies and np.isnan(oblique.max_residual)
    # more heads than D/d (routed controls): H·d != D even with mutually orthogonal pieces
    maps = decomposed_maps(rng, n_head=3, d=4)
    wider = HeadMaps(
        np.concatenate([maps.write, maps.write[:, :1]], axis=1),
        {X: np.concatenate([v, v[:, :1]], axis=1) for X, v in maps.read.items()},
    )
    assert not proposition1(head_spaces(wider), 4).applies


# --------------------------------------------------------------------------- self-alignment
def set_value_maps(model: GPT, target_head) -> None:
    """Make R_{V,0}^{l,h} = Im W_O^{l,target_head(h)}: W_V^h = M (W_O^{target})ᵀ, M orthogonal
    (invertible, and no ill-conditioned M amplifies the float32 rounding of W_V)."""
    cfg = model.cfg
    hd = cfg.n_head * cfg.d_head
    with torch.no_grad():
        for block in model.blocks:
            W_O = block.attn.writer.write_maps()  # (H, D, d)
            weight = block.attn.reader.c_attn.weight  # (3·H·d, D), rows q | k | v
            for h in range(cfg.n_head):
                M = torch.linalg.qr(torch.randn(cfg.d_head, cfg.d_head, dtype=torch.float64))[0]
                rows = slice(2 * hd + h * cfg.d_head, 2 * hd + (h + 1) * cfg.d_head)
                weight[rows] = (M @ W_O[target_head(h)].double().T).to(weight.dtype)


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_own_best_fraction_is_1_when_v_reads_its_own_write_space(geometry):
    model = tiny_model(geometry)
    set_value_maps(model, lambda h: h)
    frame = self_alignment(head_spaces(head_maps(model)))
    assert len(frame) == N_LAYER * N_HEAD
    assert frame["own_best"].all()
    # Im W_Vᵀ = Im W_O up to the cast of W_V to the model's dtype: one rounded stage at
    # scale 1 (ρ ≤ 1)
    dtype = model_dtype(model)
    np.testing.assert_allclose(frame["rho_self"], 1.0, rtol=0, atol=rounding_tolerance(dtype, 1, 1))

    set_value_maps(model, lambda h: (h + 1) % N_HEAD)  # read the neighbour's write space
    frame = self_alignment(head_spaces(head_maps(model)))
    assert not frame["own_best"].any()
    # the same one rounding, at the scale of a PK (≤ d)
    tol = rounding_tolerance(dtype, D_HEAD, 1)
    np.testing.assert_allclose(frame["pk_best_other"], D_HEAD, rtol=0, atol=tol)


def test_an_exact_tie_is_not_own_best():
    rng = np.random.default_rng(5)
    maps = decomposed_maps(rng, n_layer=1, n_head=2, d=2)
    maps.read["V"][0, 0] = 0.0  # V reads nothing: PK 0 with every write space
    frame = self_alignment(head_spaces(maps))
    assert not frame.loc[0, "own_best"] and np.isnan(frame.loc[0, "rho_self"])
    # a designed tie broken only by rounding: R_V at 45° between the two write spaces
    e = np.eye(2)
    for theta in np.pi / 4 + np.array([-1e-13, 0.0, 1e-13]):
        tied = HeadMaps(
            np.stack([e[:, :1], e[:, 1:]])[None],
            {X: np.array([[[[np.cos(theta), np.sin(theta)]]] * 2]) for X in READ_TYPES},
        )
        frame = self_alignment(head_spaces(tied))
        assert frame["pk_self"].to_numpy() == pytest.approx([0.5, 0.5], abs=1e-12)
        assert not frame["own_best"].any()


# --------------------------------------------------------------------------- idempotence
def brute_idempotence(W_O: np.ndarray, W_V: np.ndarray) -> float:
    T = W_O @ W_V
    T2 = T @ T
    return float(np.sum(T2 * T) ** 2 / (np.sum(T2 * T2) * np.sum(T * T)))


def test_scaled_idempotence_on_hand_made_maps():
    D = 5
    e = np.eye(D)
    W_O = e[:, :2]  # writes into span(e0, e1)
    # T = e0 e0ᵀ + 2 e1 e1ᵀ: ⟨T², T⟩ = 1 + 8 = 9, ‖T²‖² = 17, ‖T‖² = 5 → P = 81/85
    W_V = np.stack([e[0], 2 * e[1]])
    assert scaled_idempotence(W_O, W_V) == pytest.approx(81 / 85, abs=1e-14)
    # a projector (T² = T) gives 1; the gain g of frozen writes does not matter
    assert scaled_idempotence(W_O, W_O.T) == pytest.approx(1.0, abs=1e-14)
    assert scaled_idempotence(0.113 * W_O, W_V) == pytest.approx(81 / 85, abs=1e-14)
    # T = e0 e0ᵀ − e1 e1ᵀ: T² = P ⊥ T → 0
    assert scaled_idempotence(W_O, np.stack([e[0], -e[1]])) == pytest.approx(0.0, abs=1e-14)
    # reading orthogonally to the write space: T² = 0, P undefined
    assert np.isnan(scaled_idempotence(W_O, e[2:4]))
    rng = np.random.default_rng(6)
    for _ in range(3):
        W_O, W_V = rng.standard_normal((9, 3)), rng.standard_normal((3, 9))
        assert scaled_idempotence(W_O, W_V) == pytest.approx(brute_idempotence(W_O, W_V), rel=1e-12)


def test_idempotence_of_every_head_uses_w_o_and_w_v():
    maps = head_maps(tiny_model("learned"))
    frame = idempotence(maps)
    assert len(frame) == N_LAYER * N_HEAD
    row = frame[(frame["layer"] == 2) & (frame["head"] == 3)].iloc[0]
    expected = brute_idempotence(maps.write[2, 3], maps.read["V"][2, 3])
    assert row["idempotence"] == pytest.approx(expected, rel=1e-12)
    assert frame["idempotence"].between(0, 1).all()


# --------------------------------------------------------------------------- the script
def make_fixture(tmp_path: Path, geometry: str) -> dict[str, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    checkpoint = tmp_path / "model.safetensors"
    save_checkpoint(checkpoint, tiny_model(geometry), np.arange(40, dtype=np.int64) + 100)
    manifest = tmp_path / "manifest.json"
    write_manifest(
        manifest, {"config_id": geometry, "checkpoint_file_sha256": sha256_file(checkpoint)}
    )
    return {"checkpoint": checkpoint, "manifest": manifest}


def run_geometry_stats(paths, out: Path, model: str, seed: int = 42) -> int:
    return geometry_stats_stage.main(
        [
            "--checkpoint",
            str(paths["checkpoint"]),
            "--manifest",
            str(paths["manifest"]),
            "--model-name",
            model,
            "--seed",
            str(seed),
            "--out-pk",
            str(out / "pk.parquet"),
            "--out-summary",
            str(out / "summary.parquet"),
            "--out-heads",
            str(out / "heads.parquet"),
        ]
    )


@pytest.mark.parametrize("geometry", ["learned", "write-common-axis"])
def test_geometry_stats_end_to_end(tmp_path, geometry):
    paths = make_fixture(tmp_path / "fixture", geometry)
    out = tmp_path / "out"
    assert run_geometry_stats(paths, out, geometry) == 0
    pk = pq.read_table(out / "pk.parquet").to_pandas()
    n_pairs = sum(N_HEAD * N_HEAD for _ in itertools.combinations(range(N_LAYER), 2))
    assert (pk["kind"] == "write_write").sum() == n_pairs
    assert (pk["kind"] == "write_read").sum() == 3 * n_pairs
    assert not pk.duplicated(
        ["kind", "source_layer", "source_head", "target_layer", "target_head", "read_type"]
    ).any()
    assert (pk["model"] == geometry).all() and (pk["seed"] == 42).all()
    np.testing.assert_allclose(
        pk["rho"], pk["pk"] / np.minimum(pk["source_dim"], pk["target_dim"]), rtol=1e-12
    )
    summary = pq.read_table(out / "summary.parquet").to_pandas()
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["n_heads_own_best_test"] == (N_LAYER - 1) * N_HEAD
    assert 0 <= row["own_best_fraction"] <= 1 and 0 <= row["own_best_fraction_layer0"] <= 1
    assert 0 < row["idempotence_median"] <= 1
    if geometry == "write-common-axis":
        assert row["prop1_applies"] and row["prop1_max_residual"] <= 1e-8
        assert row["write_write_pk_same_index_mean"] == pytest.approx(D_HEAD, abs=1e-12)
        assert row["write_write_pk_other_index_max"] == pytest.approx(0.0, abs=1e-12)
    else:
        assert not row["prop1_applies"] and np.isnan(row["prop1_max_residual"])
        assert 0 < row["write_write_pk_other_index_mean"] < D_HEAD
    # the per-head rows are what the summary aggregates: one row per head, and the summary's
    # fraction, mean and median recomputed from them (layers ≥ 1 for the reader set)
    heads = pq.read_table(out / "heads.parquet").to_pandas()
    assert len(heads) == N_LAYER * N_HEAD
    assert not heads.duplicated(["layer", "head"]).any()
    later = heads[heads["layer"] >= 1]
    assert row["own_best_fraction"] == pytest.approx(later["own_best"].mean(), abs=1e-15)
    assert row["own_best_fraction_layer0"] == pytest.approx(
        heads.loc[heads["layer"] == 0, "own_best"].mean(), abs=1e-15
    )
    assert row["rho_self_mean"] == pytest.approx(later["rho_self"].mean(), rel=1e-12)
    assert row["idempotence_median"] == pytest.approx(heads["idempotence"].median(), rel=1e-12)
    # own-best is the strict comparison of the two PKs the row carries
    assert (heads["own_best"] == (heads["pk_self"] > heads["pk_best_other"] + 1e-9)).all()
    for name in ("pk.parquet", "summary.parquet", "heads.parquet"):
        meta = read_parquet_metadata(out / name)
        assert meta["checkpoint_sha256"] == sha256_file(paths["checkpoint"])
        record = read_json(paths["manifest"])
        assert meta["manifest_content_hash"] == record.pop("record_sha256") == content_hash(record)
        assert meta["analysis"] == "geometry_stats"


def test_geometry_stats_refuses_a_flipped_checkpoint_byte(tmp_path):
    paths = make_fixture(tmp_path / "fixture", "learned")
    data = bytearray(paths["checkpoint"].read_bytes())
    data[len(data) // 2] ^= 0x01
    paths["checkpoint"].write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ManifestMismatchError, match=paths["checkpoint"].name):
        run_geometry_stats(paths, out, "learned")
    assert not out.exists() or not any(out.iterdir())


def test_table2_gains_the_geometry_columns(tmp_path):
    logs, summaries = [], []
    for geometry, loss in (("learned", 3.5), ("write-common-axis", 3.6)):
        paths = make_fixture(tmp_path / geometry, geometry)
        assert run_geometry_stats(paths, tmp_path / geometry / "geo", geometry, seed=1) == 0
        summaries.append(str(tmp_path / geometry / "geo" / "summary.parquet"))
        log = tmp_path / geometry / "train_log.parquet"
        cfg = {"model_name": geometry, "seed": 1, "model": {"geometry": geometry}}
        meta = {"config": cfg, "n_params": 1000, "val_loss_nats": loss}
        write_parquet(log, pd.DataFrame({"step": [1]}), pa.schema([("step", pa.int64())]), meta)
        logs.append(str(log))
    table = table2({"runs": logs, "geometry": summaries})
    frame, md = table.frame, table.markdown()
    rows = frame.set_index("model")
    assert rows.loc["write-common-axis", "write_write_pk_same_index_mean"] == pytest.approx(8)
    assert rows.loc["write-common-axis", "write_write_pk_other_index_mean"] == pytest.approx(0)
    assert bool(rows.loc["write-common-axis", "prop1_applies"])
    assert not bool(rows.loc["learned", "prop1_applies"])
    assert "WW PK same index" in md and "Own-best (L ≥ 1)" in md and "8.00" in md
    assert rows.loc["write-common-axis", "delta_vs_learned"] == pytest.approx(0.1)
