"""The model zoo: exact counts from the §4.4 arithmetic, frozen parts, maps, names, sizes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from headgeom.heads.stages import param_counts
from headgeom.model import registry, zoo
from headgeom.model.checkpoint import load_checkpoint, save_checkpoint
from headgeom.model.config import ModelConfig
from headgeom.model.geometries import (
    BlockReader,
    FreeReader,
    FrozenWriter,
    LearnedWriter,
    ValueAdapterReader,
)
from headgeom.model.gpt import GPT
from headgeom.model.kerdock import build_basis_family
from headgeom.run_config import TrainConfig
from headgeom.subspace import folded_block_read_basis
from headgeom.training.loop import train
from tests.helpers.models import GPT_GEOMETRIES, tiny_arch, tiny_model

REPO = Path(__file__).resolve().parents[2]

# docs §6.1, copied from the paper's table: repository name -> exact parameter count.
TABLE4 = {
    "plain-learned42": 124_046_592,
    "plain-learned43": 124_046_592,
    "dense": 124_046_592,
    "plain-identity42": 116_968_704,
    "plain-identity43": 116_968_704,
    "common42": 116_968_704,
    "layered42": 116_968_704,
    "rotated-m1-42": 116_968_704,
    "headblock-learned42": 104_582_400,
    "headblock-identity42": 97_504_512,
    "rotated-m2-42": 97_504_512,
    "rotated-m3-42": 97_504_512,
    "fixed-sum-hub42": 124_046_592,
    "fixed-split-cycle42": 124_046_592,
    "fixed-angle-split42": 124_046_592,
    "fixeddiag42": 116_968_704,
    "value384": 124_046_592,
    "mlp3456": 124_051_200,
    "identity-original42": 116_968_704,
    "multiscreen-identity42": 106_514_418,
    "multiscreen-learned42": 128_534_514,
}
MULTISCREEN_REPOS = ("multiscreen-identity42", "multiscreen-learned42")
PAPER = dict(n_layer=12, n_head=12, d_model=768, d_head=64, d_mlp=3072, n_ctx=512)
V_PAPER = 50257
#: Small sizes where every GPT geometry exists: Kerdock D = 16 (m = 4, r = 1, 8 members) for
#: all but the routed controls, which need 3 | H (4 heads over 3 lanes of width 8).
TINY = dict(n_layer=2, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
TINY_ROUTED = dict(n_layer=2, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16)
V_TINY = 29


def arithmetic(geometry: str, V: int, n_ctx: int, n_layer: int, n_head: int, d_model: int,
               d_head: int, d_mlp: int) -> int:  # fmt: skip
    """docs §4.4 by hand, from the base architecture (the zoo's sizing rules restated)."""
    D, d, H, F = d_model, d_head, n_head, d_mlp
    if geometry.startswith("write-routed"):
        H = 4 * H // 3  # 16 routed heads at paper size
    if geometry == "mlp3456":
        F += D // 2  # 3072 + 384
    hd = H * d
    free_reader = 2 * D + 3 * D * hd + 3 * hd  # LN_1, W_QKV, b_QKV
    block_reader = 2 * hd + 3 * H * d * d + 3 * hd  # per-head LN (replaces LN_1), A_QKV, b_QKV
    learned_writer = hd * D + D  # W_O, b_O
    frozen_writer = D  # b_O stays learned
    reader = block_reader if geometry in BLOCK_READERS else free_reader
    writer = learned_writer if geometry in ("learned", "read-common") else frozen_writer
    if geometry.startswith("write-routed"):
        writer = 0  # no b_O (§6.5 CHOICE)
    if geometry == "value384":
        reader += 2 * hd * (D // 2)  # bias-free adapter U1, U2 per head
    per_layer = reader + writer + 2 * D + (D * F + F) + (F * D + D)  # + LN_2, MLP
    return V * D + n_ctx * D + n_layer * per_layer + 2 * D  # embeddings, blocks, final LN


BLOCK_READERS = ("read-common", "all-common-axis", "all-rotated", "all-rotated-self")


def projector(A: torch.Tensor) -> torch.Tensor:
    """Orthogonal projector onto the column space of A (D, k), float64."""
    U, s, _ = torch.linalg.svd(A.double(), full_matrices=False)
    U = U[:, s > s[0] * 1e-9]
    return U @ U.T


def e_block(D: int, d: int, h: int) -> torch.Tensor:
    E = torch.zeros(D, d, dtype=torch.float64)
    E[h * d : (h + 1) * d] = torch.eye(d, dtype=torch.float64)
    return E


# --------------------------------------------------------------------------- counts
@pytest.mark.parametrize("repo", [r for r in TABLE4 if r not in MULTISCREEN_REPOS])
def test_paper_size_count_is_exact_and_follows_the_arithmetic(repo):
    configuration, seed = zoo.lookup(repo)
    expected = arithmetic(configuration.geometry, V_PAPER, **PAPER)
    assert expected == TABLE4[repo]  # §4.4 arithmetic reproduces §6.1
    model_config = zoo.paper_model_config(configuration.geometry)
    with torch.device("meta"):
        model = registry.build_model(model_config, V_PAPER)
    n_params, n_frozen = zoo.count_parameters(model)
    assert n_params == expected == configuration.n_params
    assert zoo.expected_n_params(configuration.geometry, model_config, V_PAPER) == expected
    frozen_writes = configuration.geometry not in ("learned", "read-common")
    block = configuration.geometry in BLOCK_READERS
    H = 16 if configuration.geometry.startswith("write-routed") else 12
    assert n_frozen == 12 * (768 * 64 * H * frozen_writes + 768 * 768 * block)  # per layer


@pytest.mark.parametrize("repo", MULTISCREEN_REPOS)
def test_multiscreen_paper_counts(repo):
    configuration, _ = zoo.lookup(repo)
    with torch.device("meta"):
        model = registry.build_model(zoo.paper_model_config(configuration.geometry), V_PAPER)
    assert zoo.count_parameters(model)[0] == TABLE4[repo] == configuration.n_params


@pytest.mark.parametrize("geometry", GPT_GEOMETRIES)
def test_small_size_counts_follow_the_arithmetic_and_have_no_paper_number(geometry):
    arch = tiny_arch(geometry)
    model_config = zoo.derive_model_config(geometry, arch)
    with torch.device("meta"):
        model = registry.build_model(model_config, V_TINY)
    assert zoo.count_parameters(model)[0] == arithmetic(geometry, V_TINY, **arch)
    assert zoo.expected_n_params(geometry, model_config, V_TINY) is None
    assert zoo.expected_n_params(geometry, model_config, V_PAPER) is None  # not paper size


def test_param_counts_script(tmp_path):
    runs = [
        {
            "model": m,
            "seed": 42,
            "repository_name": None,
            "display_name": m,
            "geometry": g,
            "corpus": None,
            "model_config": mc,
        }
        for m, g, mc in [
            ("value384", "value384", zoo.paper_model_config("value384")),
            ("tiny", "all-rotated", zoo.derive_model_config("all-rotated", TINY)),
        ]
    ]
    out = tmp_path / "counts.parquet"
    assert param_counts.main(["--runs-json", json.dumps(runs), "--out", str(out)]) == 0
    frame = pq.read_table(out).to_pandas().set_index("model")
    assert frame.loc["value384", "n_params"] == frame.loc["value384", "expected_n_params"]
    assert frame.loc["value384", "n_params"] == 124_046_592
    assert pd_isna(frame.loc["tiny", "expected_n_params"])
    assert frame.loc["tiny", "n_params"] == arithmetic("all-rotated", V_PAPER, **TINY)
    assert frame.loc["tiny", "n_frozen"] == 2 * 2 * 16 * 16  # read + write basis, 2 layers
    assert frame.loc["tiny", "basis_family_hash"] == build_basis_family(16, 4, 4).family_hash


def test_param_counts_script_fails_on_a_count_that_differs(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "PAPER_N_PARAMS", {**zoo.PAPER_N_PARAMS, "learned": 1})
    runs = [
        {
            "model": "learned-r",
            "seed": 42,
            "repository_name": "plain-learned42",
            "display_name": "learned",
            "geometry": "learned",
            "corpus": "R",
            "model_config": zoo.paper_model_config("learned"),
        }
    ]
    out = tmp_path / "counts.parquet"
    with pytest.raises(SystemExit, match="learned-r.*124,046,592 != 1"):
        param_counts.main(["--runs-json", json.dumps(runs), "--out", str(out)])
    assert not out.exists()


def pd_isna(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "<NA>"


# --------------------------------------------------------------------------- frozen parts
@pytest.mark.parametrize("geometry", GPT_GEOMETRIES)
def test_frozen_buffers_never_train_and_stay_byte_identical(geometry):
    """C6: frozen maps are float64 persistent buffers, outside the optimizer, no gradient."""
    model = tiny_model(geometry)
    before = {n: b.clone() for n, b in model.named_buffers()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = geometry not in ("learned",)
    assert bool(before) == frozen
    for name, buffer in before.items():
        assert buffer.dtype == torch.float64, name
        assert name in model.state_dict(), name  # persistent: saved in checkpoints
    assert not {n for n, _ in model.named_parameters()} & set(before)
    optimized = {id(p) for g in model.optim_groups(0.1) for p in g["params"]}
    assert not {id(b) for b in model.buffers()} & optimized
    ids = np.tile(np.arange(V_TINY, dtype=np.int32), 20)
    cfg = TrainConfig(
        steps=3, batch_size=4, lr_max=1e-2, lr_min=1e-3, warmup_steps=1, eval_every=3,
        eval_batch_size=4,
    )  # fmt: skip
    train(model, ids, ids[:100], cfg, data_seed=1729, progress=False)
    for name, buffer in model.named_buffers():
        assert not buffer.requires_grad and buffer.grad is None, name
        assert buffer.numpy().tobytes() == before[name].numpy().tobytes(), name
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, params[n])]
    assert moved  # the learned parts did train


def test_checkpoint_round_trip_keeps_buffers_and_choices(tmp_path):
    model = tiny_model("all-rotated", seed=3)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, np.arange(V_TINY))
    loaded, _ = load_checkpoint(path)
    assert loaded.cfg == model.cfg
    assert loaded.cfg.geometry_params["basis_members"] == 4
    for (name, a), (_, b) in zip(model.named_buffers(), loaded.named_buffers(), strict=True):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name


# --------------------------------------------------------------------------- maps
def family_for(model: GPT):
    p = model.cfg.geometry_params
    return build_basis_family(
        model.cfg.d_model, model.cfg.d_head, p["basis_members"], m=p["basis_m"], r=p["basis_r"]
    )


def g_of(cfg) -> float:
    return 0.02 * math.sqrt(cfg["d_model"] / (2 * cfg["n_layer"]))


@pytest.mark.parametrize(
    ("geometry", "write_member", "read_member"),
    [
        ("write-common", lambda layer: 0, None),
        ("write-rotated", lambda layer: layer, None),
        ("all-rotated", lambda layer: layer, lambda layer: TINY["n_layer"] + layer),
        ("all-rotated-self", lambda layer: layer, lambda layer: layer),
    ],
)
def test_rotated_maps_are_their_kerdock_blocks(geometry, write_member, read_member):
    model = tiny_model(geometry)
    family = family_for(model)
    g = g_of(TINY)
    for layer, block in enumerate(model.blocks):
        W = block.attn.writer.write_maps()
        for h in range(TINY["n_head"]):
            B_E = torch.from_numpy(np.array(family.head_block(write_member(layer), h)))
            assert torch.allclose(W[h], g * B_E, rtol=0, atol=1e-15)
        reader = block.attn.reader
        if read_member is None:
            assert isinstance(reader, FreeReader)
            continue
        assert isinstance(reader, BlockReader)
        for h in range(TINY["n_head"]):
            S = torch.from_numpy(np.array(family.head_block(read_member(layer), h)))
            assert torch.equal(reader.read_blocks()[h], S)
            for X in "QKV":
                assert torch.allclose(
                    reader.read_maps(X)[h], reader.block_maps(X)[h].double() @ S.T, atol=1e-12
                )


def test_all_rotated_self_reads_exactly_its_own_write_space():
    model = tiny_model("all-rotated-self")
    for block in model.blocks:
        W = block.attn.writer.write_maps()
        for X in "QKV":
            R = block.attn.reader.read_maps(X)
            for h in range(TINY["n_head"]):
                assert torch.allclose(projector(W[h]), projector(R[h].T), atol=1e-10)


def test_all_rotated_reads_the_other_half_of_the_family():
    """Layer l writes member l and reads member L + l: no read block is a write block."""
    model = tiny_model("all-rotated")
    writes = [projector(w) for b in model.blocks for w in b.attn.writer.write_maps()]
    reads = [projector(S) for b in model.blocks for S in b.attn.reader.read_blocks()]
    for P in reads:
        assert all(not torch.allclose(P, Q, atol=1e-6) for Q in writes)


@pytest.mark.parametrize(
    ("geometry", "scale"),
    [
        ("write-common-axis", None),
        ("all-common-axis", None),
        ("value384", None),
        ("mlp3456", None),
        ("identity-original", 1.0),
    ],
)
def test_axis_writes_are_scaled_coordinate_blocks(geometry, scale):
    model = tiny_model(geometry)
    g = g_of(TINY) if scale is None else scale
    D, d = TINY["d_model"], TINY["d_head"]
    for block in model.blocks:
        W = block.attn.writer.write_maps()
        for h in range(TINY["n_head"]):
            assert torch.equal(W[h], g * e_block(D, d, h))
        assert isinstance(block.attn.writer.b_O, torch.nn.Parameter)


@pytest.mark.parametrize("geometry", ["read-common", "all-common-axis"])
def test_axis_block_readers_read_coordinate_block_h(geometry):
    model = tiny_model(geometry)
    D, d = TINY["d_model"], TINY["d_head"]
    for block in model.blocks:
        reader = block.attn.reader
        assert isinstance(reader, BlockReader) and not hasattr(reader, "ln_1")
        for h in range(TINY["n_head"]):
            assert torch.equal(reader.read_blocks()[h], e_block(D, d, h))
    writer = model.blocks[0].attn.writer
    assert isinstance(writer, LearnedWriter if geometry == "read-common" else FrozenWriter)


def test_block_reader_forward_is_its_definition():
    model = tiny_model("all-rotated", seed=5)
    reader = model.blocks[1].attn.reader
    with torch.no_grad():
        reader.ln_weight.uniform_(0.5, 1.5)
        reader.ln_bias.normal_()
        reader.b_QKV.normal_()
    x = torch.randn(2, 5, TINY["d_model"], dtype=torch.float64)
    H, d = TINY["n_head"], TINY["d_head"]
    q, k, v = (t.double() for t in reader.double()(x))
    for h in range(H):
        b = x @ reader.read_blocks()[h]  # S_hᵀ x, (2, 5, d)
        u = (b - b.mean(-1, keepdim=True)) / torch.sqrt(
            b.var(-1, unbiased=False, keepdim=True) + 1e-5
        )
        u = u * reader.ln_weight[h * d : (h + 1) * d] + reader.ln_bias[h * d : (h + 1) * d]
        for i, (X, out) in enumerate(zip("QKV", (q, k, v), strict=True)):
            bias = reader.b_QKV[(i * H + h) * d : (i * H + h + 1) * d]
            expected = u @ reader.block_maps(X)[h].T + bias
            assert torch.allclose(out[..., h, :], expected, atol=1e-10), (X, h)


def test_block_reader_init_is_the_recorded_choice():
    arch = dict(n_layer=2, n_head=4, d_model=256, d_head=64, d_mlp=16, n_ctx=8)
    model_config = zoo.derive_model_config("read-common", arch)
    std = model_config["geometry_params"]["block_init_std"]
    assert std == pytest.approx(0.02 * math.sqrt(256 / 64))
    torch.manual_seed(0)
    model = registry.build_model(model_config, 11)
    A = torch.cat([b.attn.reader.block_maps(X).flatten() for b in model.blocks for X in "QKV"])
    assert A.std().item() == pytest.approx(std, rel=0.05)
    reader = model.blocks[0].attn.reader
    assert torch.equal(reader.ln_weight, torch.ones(256)) and not reader.b_QKV.any()


def test_folded_read_space_of_a_block_reader_has_dimension_d_minus_1():
    """§4.3.1/§9.2: centering within the 64-dim block leaves 63 dimensions, inside Im S_h and
    orthogonal to S_h·1; matches headgeom.subspace's independent fold."""
    arch = dict(n_layer=1, n_head=2, d_model=128, d_head=64, d_mlp=8, n_ctx=8)
    torch.manual_seed(1)
    model = registry.build_model(zoo.derive_model_config("all-rotated-self", arch), 11)
    reader = model.blocks[0].attn.reader
    with torch.no_grad():
        reader.ln_weight.uniform_(0.5, 2.0)  # a non-trivial gain
    for X in "QKV":
        folded = reader.folded_read_maps(X).detach()  # (H, d, D)
        for h in range(2):
            S = reader.read_blocks()[h]
            assert torch.linalg.matrix_rank(folded[h]).item() == 63
            P = projector(folded[h].T)
            assert torch.allclose(projector(S) @ P, P, atol=1e-10)
            assert torch.allclose(
                P @ S.sum(dim=1), torch.zeros(128, dtype=torch.float64), atol=1e-10
            )
            gamma = reader.ln_weight[h * 64 : (h + 1) * 64].detach().double().numpy()
            A = reader.block_maps(X)[h].detach().double().numpy()
            basis = folded_block_read_basis(S.numpy(), A, gamma)
            assert basis.shape == (128, 63)
            assert torch.allclose(P, projector(torch.from_numpy(basis)), atol=1e-9)


def test_fixeddiag_writes_the_first_w_coordinates_of_each_lane():
    model = tiny_model("fixeddiag")
    d = TINY["d_head"]
    w = (4 * d) // 5
    assert model.cfg.geometry_params["write_width"] == w == 3
    scale = g_of(TINY) * math.sqrt(d / w)
    for h, W in enumerate(model.blocks[0].attn.writer.write_maps()):
        expected = e_block(TINY["d_model"], d, h).clone()
        expected[:, w:] = 0
        assert torch.allclose(W, scale * expected, rtol=0, atol=1e-15)
    paper = zoo.paper_model_config("fixeddiag")["geometry_params"]
    assert paper["write_width"] == 51
    assert paper["write_scale"] == pytest.approx(0.126739, abs=1e-6)


def test_value_adapter_starts_as_write_common_axis_and_is_head_local():
    model = tiny_model("value384", seed=2)
    assert model.cfg.geometry_params["value_adapter_width"] == TINY["d_model"] // 2
    plain = registry.build_model(zoo.derive_model_config("write-common-axis", TINY), V_TINY)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.endswith(("U1", "U2")) for k in unexpected)
    ids = torch.randint(0, V_TINY, (2, 9))
    assert torch.equal(model(ids), plain(ids))  # U2 = 0 at initialisation
    reader = model.blocks[0].attn.reader
    assert isinstance(reader, ValueAdapterReader)
    with torch.no_grad():
        reader.U2.normal_()
    x = torch.randn(1, 4, TINY["d_model"])
    _, _, v = reader(x)
    _, _, v_plain = FreeReader.forward(reader, x)
    assert not torch.allclose(v, v_plain)
    with torch.no_grad():  # head 1's adapter only changes head 1's values
        reader.U2[1].zero_()
    _, _, v = reader(x)
    assert torch.equal(v[..., 1, :], v_plain[..., 1, :])


def test_mlp3456_widens_the_mlp_by_half_the_residual():
    model = tiny_model("mlp3456")
    assert model.cfg.d_mlp == TINY["d_mlp"] + TINY["d_model"] // 2
    assert zoo.paper_model_config("mlp3456")["d_mlp"] == 3456


def test_routed_writes_are_scaled_isometries_without_output_bias():
    D, d = TINY_ROUTED["d_model"], TINY_ROUTED["d_head"]
    g = g_of(TINY_ROUTED)
    eye = torch.eye(d, dtype=torch.float64)
    for geometry in ("write-routed-a", "write-routed-b", "write-routed-c"):
        model = tiny_model(geometry)
        assert model.cfg.n_head == 4
        writer = model.blocks[0].attn.writer
        assert writer.b_O is None and not model.cfg.geometry_params["attn_out_bias"]
        for W in writer.write_maps():
            assert torch.allclose(W.T @ W, g * g * eye, atol=1e-15)
    # A: heads 0..2 write their lanes, hub head 3 writes the sum of all three / sqrt(3)
    W = tiny_model("write-routed-a").blocks[0].attn.writer.write_maps()
    E = [e_block(D, d, h) for h in range(3)]
    for h in range(3):
        assert torch.allclose(W[h], g * E[h])
    assert torch.allclose(W[3], g * sum(E) / math.sqrt(3))
    # B: half-head c = 2h + j goes to half-block c mod 6
    W = tiny_model("write-routed-b").blocks[0].attn.writer.write_maps()
    for h in range(4):
        for j in range(2):
            t = (2 * h + j) % 6
            target = torch.zeros(D, d // 2, dtype=torch.float64)
            target[t * 4 : (t + 1) * 4] = torch.eye(4, dtype=torch.float64)
            assert torch.allclose(W[h][:, j * 4 : (j + 1) * 4], g * target)
    # C: cos θ E_a + sin θ E_b, a = h mod 3, b = (h + 5) mod 3, θ = (π/2)(h + 1)/5
    W = tiny_model("write-routed-c").blocks[0].attn.writer.write_maps()
    for h in range(4):
        theta = 0.5 * math.pi * (h + 1) / 5
        expected = math.cos(theta) * E[h % 3] + math.sin(theta) * E[(h + 5) % 3]
        assert torch.allclose(W[h], g * expected)


def test_paper_choices_are_recorded_in_the_model_config():
    p = {g: zoo.paper_model_config(g)["geometry_params"] for g in GPT_GEOMETRIES}
    g = 0.02 * math.sqrt(768 / 24)
    assert p["learned"] == {}
    assert p["write-common-axis"] == {"write_scale": pytest.approx(g)}
    assert p["all-rotated"] == {
        "basis_m": 8,
        "basis_r": 3,
        "basis_members": 24,
        "block_init_std": pytest.approx(0.0692820323),
        "write_scale": pytest.approx(g),
    }
    assert p["identity-original"] == {"write_scale": 1.0}
    assert p["value384"]["value_adapter_width"] == 384
    assert p["value384"]["value_adapter_layout"] == "head-local"
    assert p["write-routed-c"]["angle_offset"] == 5
    assert zoo.paper_model_config("write-routed-b")["n_head"] == 16
    cfg = ModelConfig.from_dict({**zoo.paper_model_config("all-rotated"), "n_vocab": 1})
    assert cfg.to_dict()["geometry_params"]["basis_members"] == 24


def test_geometry_params_can_be_overridden_but_not_misspelled():
    model_config = zoo.derive_model_config("all-common-axis", TINY, {"block_init_std": 0.02})
    assert model_config["geometry_params"]["block_init_std"] == 0.02
    with pytest.raises(ValueError, match="takes no geometry_params.*blok_init_std"):
        zoo.derive_model_config("all-common-axis", TINY, {"blok_init_std": 0.02})
    with pytest.raises(ValueError, match="write_mask='last'"):
        zoo.derive_model_config("fixeddiag", TINY, {"write_mask": "last"})


# --------------------------------------------------------------------------- names
def test_lookup_by_display_and_repository_name():
    configuration, seed = zoo.lookup("rotated-m3-42")
    assert (configuration.display_name, configuration.geometry, seed) == (
        "all-rotated-self",
        "all-rotated-self",
        42,
    )
    assert zoo.lookup("all-rotated-self") == (configuration, None)
    assert zoo.lookup("dense")[0].corpus == "S"
    assert zoo.lookup("plain-learned43") == (zoo.BY_KEY["learned-r"], 43)
    assert zoo.lookup("learned", corpus="S") == (zoo.BY_KEY["learned-s"], None)
    assert zoo.lookup("write-routed A")[0].repository_name(42) == "fixed-sum-hub42"
    with pytest.raises(ValueError, match="learned-r \\(corpus R\\), learned-s \\(corpus S\\)"):
        zoo.lookup("learned")
    with pytest.raises(ValueError, match="did you mean 'all-rotated'"):
        zoo.lookup("all-rotate")
    with pytest.raises(ValueError, match="no seed 43"):
        zoo.BY_KEY["all-rotated"].repository_name(43)


def test_the_zoo_is_the_21_rows_of_table_4():
    runs = zoo.paper_runs()
    assert [c.repository_name(s) for c, s in runs] == list(TABLE4)
    assert [c.rows[s] for c, s in runs] == list(range(1, 22))
    assert {c.n_params for c, _ in runs if c.geometry == "learned"} == {124_046_592}
    assert set(registry.geometry_names()) == {c.geometry for c in zoo.CONFIGURATIONS}


# --------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    ("geometry", "arch", "match"),
    [
        ("write-common-axis", dict(TINY, n_head=3), "n_head·d_head == d_model"),
        ("all-common-axis", dict(TINY, d_head=5), "n_head·d_head == d_model"),
        ("write-rotated", dict(n_layer=4, n_head=4, d_model=40, d_head=10, d_mlp=8, n_ctx=8),
         "Kerdock members 0..3.*D=40 with m=2, r=10 has at most 2\\^\\(m-1\\) = 2"),
        ("all-rotated", dict(n_layer=2, n_head=3, d_model=18, d_head=6, d_mlp=8, n_ctx=8),
         "Kerdock.*D=18"),
        ("write-routed-a", TINY, "3 must divide n_head"),
        ("multiscreen-learned", TINY, "3 must divide n_head, 4 n_layer and 4 d_head"),
        ("value384", dict(n_layer=1, n_head=1, d_model=9, d_head=9, d_mlp=8, n_ctx=8),
         "d_model must be even"),
        ("spiral", TINY, "unknown geometry 'spiral'"),
    ],
)  # fmt: skip
def test_impossible_sizes_fail_clearly(geometry, arch, match):
    with pytest.raises(ValueError, match=match) as err:
        zoo.derive_model_config(geometry, arch)
    if geometry != "spiral":
        assert repr(geometry) in str(err.value)


def test_demo_size_derivations():
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["architecture"]
    assert zoo.derive_model_config("value384", demo)["geometry_params"]["value_adapter_width"] == (
        demo["d_model"] // 2
    )
    assert zoo.derive_model_config("mlp3456", demo)["d_mlp"] == demo["d_mlp"] + 32
    rotated = zoo.derive_model_config("all-rotated", demo)["geometry_params"]
    assert rotated["basis_members"] == 2 * demo["n_layer"]
    arch12 = dict(demo, n_head=3, d_model=48, d_head=16)
    assert zoo.derive_model_config("write-routed-b", arch12)["n_head"] == 4


# --------------------------------------------------------------------------- configs
def test_paper_config_lists_the_zoo_and_validates():
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    validate(cfg, str(REPO / "workflow" / "schemas" / "heads.schema.yaml"))
    assert {k: v for k, v in cfg["architecture"].items() if k in zoo.PAPER_ARCHITECTURE} == dict(
        zoo.PAPER_ARCHITECTURE
    )
    assert list(cfg["models"]) == [c.key for c in zoo.CONFIGURATIONS]
    for key, spec in cfg["models"].items():
        c = zoo.BY_KEY[key]
        assert spec["geometry"] == c.geometry
        assert spec["corpus"] == c.corpus
        assert spec["display_name"] == c.display_name
        assert spec["seeds"] == list(c.seeds)
        assert spec["repository_names"] == dict(c.repository_names)
    assert not cfg["corpus"]["compact_vocab"]
    t = cfg["training"]
    assert (t["steps"], t["batch_size"], t["lr_max"], t["lr_min"], t["warmup_steps"]) == (
        65536,
        32,
        3e-4,
        3e-5,
        2000,
    )


def test_multiscreen_entries_are_listed_and_sized():
    configuration, seed = zoo.lookup("multiscreen-identity42")
    assert (configuration.geometry, seed) == ("multiscreen-identity", 42)
    sized = zoo.paper_model_config("multiscreen-identity")
    assert {k: sized[k] for k in ("n_layer", "n_head", "d_model", "d_head", "d_key")} == {
        "n_layer": 21,
        "n_head": 16,
        "d_model": 1024,
        "d_head": 64,
        "d_key": 16,
    }
    assert (sized["architecture"], sized["geometry"]) == ("multiscreen", "write-common-axis")


def test_manifest_names_the_basis_family_of_a_rotated_model(tmp_path):
    """hash_checkpoint records the family hash (docs §5.7) of the bases a model uses."""
    from headgeom.model import geometries

    cfg = ModelConfig(
        n_vocab=8,
        n_ctx=8,
        n_layer=2,
        n_head=2,
        d_model=16,
        d_head=8,
        d_mlp=16,
        geometry="all-rotated",
    )
    family = geometries.basis_family(GPT(cfg).cfg)
    p = GPT(cfg).cfg.geometry_params
    independent = build_basis_family(16, 8, p["basis_members"], m=p["basis_m"], r=p["basis_r"])
    assert family is not None and family.family_hash == independent.family_hash
    assert (
        geometries.basis_family(
            GPT(ModelConfig(**{**cfg.to_dict(), "geometry": "learned", "geometry_params": {}})).cfg
        )
        is None
    )
