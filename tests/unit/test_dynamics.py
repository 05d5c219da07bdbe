"""Training dynamics (docs §13.4, §14.4, §14.5) from first principles: τ against
finite differences, lane shares of constructed gradients, V-gradient traces against
directional finite differences, the scalar-part ablation of an exact s·I map, the edited
checkpoint's manifest and per-checkpoint verification."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.data.task_files import PatchInputs
from headgeom.hashing import ManifestMismatchError, sha256_file
from headgeom.heads.analysis.dynamics import (
    final_lane_index,
    lm_loss,
    task_gradients,
    tau_summary,
    value_gradient_traces,
)
from headgeom.heads.analysis.scalar_ablation import (
    ablate_scalar_part,
    own_lane_blocks,
    scalar_ablation,
)
from headgeom.heads.stages import dynamics as dynamics_stage
from headgeom.heads.stages import geometry_stats
from headgeom.io import write_manifest
from headgeom.manifest import edited_manifest
from headgeom.model.checkpoint import load_verified, save_checkpoint
from headgeom.model.gpt import GPT, site
from headgeom.subspace import haar_orthogonal
from tests.helpers import models
from tests.helpers.models import small_gpt

N_LAYER, N_HEAD, D_MODEL, D_HEAD, N_VOCAB = models.L, models.H, models.D, models.DH, 40


def tiny(geometry: str, seed: int = 0, **params) -> GPT:
    return small_gpt(geometry, seed, N_VOCAB, weights="normal", **params).double()


def prompts(rng: np.random.Generator):
    lengths = [5, 7, 5, 6, 7]  # several lengths: τ rows must stay in example order
    ids = [rng.integers(0, N_VOCAB, n) for n in lengths]
    return ids, rng.integers(0, N_VOCAB, len(ids)), rng.integers(0, N_VOCAB, len(ids))


def mean_ld(model, ids, correct, incorrect, deltas=None) -> float:
    """Mean LD with ``deltas[l][i]`` (T_i, D) added to layer l's attention output."""
    total = 0.0
    for i, seq in enumerate(ids):
        fns = {}
        if deltas is not None:
            for layer, per_example in enumerate(deltas):
                d = torch.as_tensor(per_example[i])[None]
                fns[site(layer, "hook_attn_out")] = lambda x, d=d: x + d
        with torch.no_grad(), model.hooks(fns):
            logits = model(torch.as_tensor(seq)[None], last_only=True)[0]
        total += float(logits[correct[i]] - logits[incorrect[i]])
    return total / len(ids)


def test_tau_matches_central_finite_differences():
    rng = np.random.default_rng(1)
    model = tiny("learned")
    ids, correct, incorrect = prompts(rng)
    taus = task_gradients(model, ids, correct, incorrect)
    lengths = [len(s) for s in ids]
    assert [t.shape for t in taus] == [(sum(lengths), D_MODEL)] * N_LAYER
    eps = 1e-5
    for layer in range(N_LAYER):
        flat = rng.standard_normal((sum(lengths), D_MODEL))
        split = np.split(flat, np.cumsum(lengths)[:-1])
        zero = [[np.zeros_like(s) for s in split] for _ in range(N_LAYER)]
        plus = [list(z) for z in zero]
        minus = [list(z) for z in zero]
        plus[layer] = [eps * s for s in split]
        minus[layer] = [-eps * s for s in split]
        fd = (mean_ld(model, ids, correct, incorrect, plus)
              - mean_ld(model, ids, correct, incorrect, minus)) / (2 * eps)  # fmt: skip
        assert np.sum(taus[layer] * flat) == pytest.approx(fd, rel=1e-6, abs=1e-9)


def coordinate_bases():
    eye = np.eye(D_MODEL)
    blocks = [eye[:, h * D_HEAD : (h + 1) * D_HEAD] for h in range(N_HEAD)]
    return [blocks for _ in range(N_LAYER)], np.stack([np.stack(blocks)] * N_LAYER)


def test_lane_share_of_a_gradient_in_one_write_space_is_one():
    rng = np.random.default_rng(2)
    bases, maps = coordinate_bases()
    lane = 2
    U = bases[0][lane]
    taus = [rng.standard_normal((9, D_MODEL)) @ U @ U.T for _ in range(N_LAYER)]
    out = tau_summary(taus, bases, maps, lane)
    assert out["lane_share"] == pytest.approx(1.0)
    assert out["lane_share_max_other"] == pytest.approx(0.0, abs=1e-15)
    assert out["lane_share_chance"] == 1 / N_HEAD
    # identical τ in every layer: same-index cosines of the lane are 1, of the others NaN
    same = tau_summary([taus[0]] * N_LAYER, bases, maps, lane)
    assert same["adjacent_cosine_mean"] == pytest.approx(1.0)
    assert same["same_index_cosine"] == pytest.approx(1.0)  # NaN pairs are skipped


def test_projected_cosines_by_hand():
    """Two layers, τ_0 = a + b in lanes 0 and 1, τ_1 = a − b: same-index cosine +1 in lane 0
    and −1 in lane 1 (mean over the 4 heads counts only defined ones), different-index
    projections are orthogonal (0), adjacent cosine 0 (‖a‖ = ‖b‖)."""
    bases, maps = coordinate_bases()
    a = np.zeros((1, D_MODEL))
    a[0, 0] = 1.0
    b = np.zeros((1, D_MODEL))
    b[0, D_HEAD] = 1.0
    out = tau_summary([a + b, a - b], [bases[0]] * 2, maps[:2], 0)
    assert out["adjacent_cosine_mean"] == pytest.approx(0.0)
    assert out["same_index_cosine"] == pytest.approx(0.0)  # (+1 − 1) / 2
    assert out["different_index_cosine"] == pytest.approx(0.0)
    assert out["lane_share"] == pytest.approx(0.5)


def test_final_lane_index_is_the_modal_index_of_the_top_three():
    heads = pd.DataFrame({"split": "discovery", "layer": [0, 1, 2, 3, 1],
                          "head": [1, 3, 3, 0, 2],
                          "e": [0.9, 0.8, 0.7, 0.6, 0.1]})  # fmt: skip
    assert final_lane_index(heads, "discovery") == 3
    heads.loc[2, "head"] = 2  # top-3 indices 1, 3, 2: a tie goes to the best head's index
    assert final_lane_index(heads, "discovery") == 1


def test_value_gradient_traces_match_directional_finite_differences():
    model = tiny("write-common-axis")
    rng = np.random.default_rng(3)
    x = torch.as_tensor(rng.integers(0, N_VOCAB, (2, 9)))
    y = torch.as_tensor(rng.integers(0, N_VOCAB, (2, 9)))
    rows = value_gradient_traces(model, x, y).set_index(["layer", "head"])
    eps = 1e-2  # a step of eps·O_j (|O_j| = g ≈ 0.05); central error O(eps²), rounding ~1e-16/eps
    for layer in range(N_LAYER):
        W_O = model.blocks[layer].attn.writer.write_maps().detach()  # (H, D, d)
        fd = np.zeros((N_HEAD, N_HEAD))
        for h in range(N_HEAD):
            for j in range(N_HEAD):
                values = []
                for sign in (1, -1):
                    with torch.no_grad():
                        V = model.blocks[layer].attn.reader.read_maps("V")
                        V[h] += sign * eps * W_O[j].T
                        values.append(float(lm_loss(model, x, y)))
                        V[h] -= sign * eps * W_O[j].T
                fd[h, j] = (values[0] - values[1]) / (2 * eps)
        for h in range(N_HEAD):
            row = rows.loc[(layer, h)]
            others = np.abs(np.delete(fd[h], h))
            assert row["own_trace"] == pytest.approx(fd[h, h], rel=1e-6, abs=1e-11)
            assert row["max_other_abs_trace"] == pytest.approx(others.max(), rel=1e-5)
            assert bool(row["own_largest"]) == bool(abs(fd[h, h]) > others.max())


def test_value_gradients_accumulated_over_chunks_equal_one_backward():
    # Σ_c (B_c/B)·∂L_c = ∂L of the mean over every token: chunks of 1, 2 (uneven) and all
    model = tiny("write-common-axis").double()
    rng = np.random.default_rng(4)
    x = torch.as_tensor(rng.integers(0, N_VOCAB, (5, 9)))
    y = torch.as_tensor(rng.integers(0, N_VOCAB, (5, 9)))
    whole = value_gradient_traces(model, x, y)
    for chunk in (1, 2, 5):
        got = value_gradient_traces(model, x, y, chunk=chunk)
        pd.testing.assert_frame_equal(got, whole, check_exact=False, rtol=1e-12, atol=0)
    assert (whole["own_trace"].abs() > 1e-6).all()  # not vacuous


def test_value_gradient_own_term_of_a_constructed_case():
    """Identity-type writes O_h = g·E_h: the own term is g·tr of G_h's own-lane columns,
    with G_h read off the V rows of GPT-2's c_attn gradient (q | k | v layout) by hand."""
    model = tiny("write-common-axis")
    x = torch.as_tensor(np.arange(8)[None] % N_VOCAB)
    y = torch.as_tensor((np.arange(8)[None] + 1) % N_VOCAB)
    with torch.enable_grad():
        loss = lm_loss(model, x, y)
        w = model.blocks[1].attn.reader.c_attn.weight  # GPT-2 layout: q | k | v rows
        (grad,) = torch.autograd.grad(loss, [w])
    hd = N_HEAD * D_HEAD
    G = grad[2 * hd : 3 * hd].reshape(N_HEAD, D_HEAD, D_MODEL).numpy()
    W_O = model.blocks[1].attn.writer.write_maps().detach().numpy()
    rows = value_gradient_traces(model, x, y)
    rows = rows[rows["layer"] == 1].set_index("head")
    for h in range(N_HEAD):
        # O_h = g E_h: tr(G_h O_h) = g · tr(G_h[:, lane h columns])
        g = W_O[h][h * D_HEAD, 0]
        own = g * np.trace(G[h][:, h * D_HEAD : (h + 1) * D_HEAD])
        assert rows.loc[h, "own_trace"] == pytest.approx(own, rel=1e-9)


def test_scalar_ablation_removes_an_exact_scalar_map_completely():
    model = tiny("write-common-axis")
    s, h, layer = 0.7, 2, 1
    V = model.blocks[layer].attn.reader.read_maps("V")
    lane = slice(h * D_HEAD, (h + 1) * D_HEAD)
    with torch.no_grad():
        V[h][:, lane] = s * torch.eye(D_HEAD, dtype=V.dtype)
    before = model.blocks[layer].attn.reader.read_maps("V").detach().clone()
    rows = ablate_scalar_part(model, [layer], "scalar").set_index("head")
    after = model.blocks[layer].attn.reader.read_maps("V").detach()
    assert rows.loc[h, "s"] == pytest.approx(s)
    assert torch.count_nonzero(after[h][:, lane]) == 0  # exactly removed
    outside = torch.ones_like(after, dtype=torch.bool)
    for k in range(N_HEAD):
        outside[k][:, k * D_HEAD : (k + 1) * D_HEAD] = False
    assert torch.equal(after[outside], before[outside])  # nothing off the lanes moves
    other = model.blocks[0].attn.reader.read_maps("V")
    assert torch.equal(other, tiny("write-common-axis").blocks[0].attn.reader.read_maps("V"))


def test_random_control_has_the_scalar_parts_norm():
    model = tiny("write-common-axis")
    before = model.blocks[1].attn.reader.read_maps("V").detach().clone()
    rows = ablate_scalar_part(model, [1], "random", np.random.default_rng([1405, 0]))
    after = model.blocks[1].attn.reader.read_maps("V").detach()
    for h in range(N_HEAD):
        lane = slice(h * D_HEAD, (h + 1) * D_HEAD)
        removed = (before[h][:, lane] - after[h][:, lane]).numpy()
        s = np.trace(before[h][:, lane].numpy()) / D_HEAD
        assert rows.loc[h, "s"] == pytest.approx(s)
        assert np.linalg.norm(removed) == pytest.approx(abs(s) * np.sqrt(D_HEAD))  # ‖sR‖ = ‖sI‖
        R = removed / s
        np.testing.assert_allclose(R @ R.T, np.eye(D_HEAD), atol=1e-9)


def test_haar_draws_are_orthogonal_and_unbiased():
    rng = np.random.default_rng(0)
    draws = np.stack([haar_orthogonal(3, rng) for _ in range(4000)])
    np.testing.assert_allclose(draws[0] @ draws[0].T, np.eye(3), atol=1e-12)
    assert np.abs(draws.mean(axis=0)).max() < 0.05  # E[R] = 0 under Haar measure


def test_own_lane_blocks_refuse_a_non_identity_write():
    coords, dims = own_lane_blocks(np.eye(D_MODEL)[:, 8:16] * 0.3)
    assert coords.tolist() == list(range(8, 16)) and dims.tolist() == list(range(8))
    # fixeddiag writes internal dims 0..w−1 of each head onto its lane's first w coordinates
    rows = ablate_scalar_part(tiny("fixeddiag"), [1], "scalar")
    assert rows["w"].tolist() == [(4 * D_HEAD) // 5] * N_HEAD  # docs §6.3: w = ⌊4d/5⌋
    model = tiny("write-common", basis_m=2, basis_r=8)
    with pytest.raises(ValueError, match="identity-type"):
        ablate_scalar_part(model, [1], "scalar")


def test_edited_checkpoint_has_its_own_manifest_naming_the_parent(tmp_path):
    model = tiny("write-common-axis").float()
    vocab = np.arange(N_VOCAB)
    parent = {"model_name": "m", "init_seed": 1, "config_id": "m-s1", "config_hash": "c",
              "step": 20, "checkpoint_file_sha256": "ab" * 32}  # fmt: skip
    ablate_scalar_part(model, [1], "scalar")
    path = tmp_path / "scalar.safetensors"
    save_checkpoint(path, model, vocab, {"edit": "scalar"})
    record = edited_manifest(parent, sha256_file(path), {"name": "scalar", "kind": "scalar"})
    write_manifest(tmp_path / "scalar.manifest.json", record)
    assert record["parent"]["checkpoint_file_sha256"] == parent["checkpoint_file_sha256"]
    assert record["config_id"] == "m-s1+scalar"
    loaded, _, manifest = load_verified(path, tmp_path / "scalar.manifest.json")
    assert manifest["record_type"] == "edited_checkpoint_manifest"


def test_scalar_ablation_measures_the_reloaded_edit_and_leaves_the_parent():
    parent = tiny("write-common-axis").float()
    state = {k: v.clone() for k, v in parent.state_dict().items()}
    rng = np.random.default_rng(5)
    clean = [rng.integers(0, N_VOCAB, 6) for _ in range(4)]
    inputs = {"sva": PatchInputs(clean, clean, rng.integers(0, N_VOCAB, 4),
                                 rng.integers(0, N_VOCAB, 4))}  # fmt: skip
    written = {}

    def write_edit(name, edited, record):
        written[name] = record
        return tiny("learned").float(), f"{name}-sha"  # what "was written" is another model

    frame = scalar_ablation(parent, inputs, [1], 2, 1405, write_edit)
    assert all(torch.equal(v, parent.state_dict()[k]) for k, v in state.items())
    assert list(written) == ["scalar", "random0", "random1"]
    assert written["random1"]["rng"] == "numpy Generator(PCG64)([1405, 1])"
    assert frame["checkpoint_sha256"].tolist() == ["scalar-sha", "random0-sha", "random1-sha"]
    other = tiny("learned").float()
    with torch.no_grad():
        last = [other(torch.as_tensor(x)[None])[0, -1].double() for x in clean]
    x = inputs["sva"]
    lds = [z[c] - z[i] for z, c, i in zip(last, x.correct, x.incorrect, strict=True)]
    np.testing.assert_allclose(frame["margin"], float(np.mean(lds)), rtol=0, atol=1e-6)
    np.testing.assert_allclose(frame["drop"], frame["margin_unedited"] - frame["margin"])


def test_a_step_target_refuses_a_checkpoint_its_manifest_does_not_match(tmp_path):
    """The per-checkpoint rules reuse the stage scripts, which verify each checkpoint
    against its own manifest: step 8's checkpoint with step 32's manifest is refused."""
    model = tiny("learned").float()
    vocab = np.arange(N_VOCAB)
    for step, seed in ((8, 0), (32, 1)):
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        save_checkpoint(tmp_path / f"step{step:06d}.safetensors", model, vocab)
        sha = sha256_file(tmp_path / f"step{step:06d}.safetensors")
        write_manifest(tmp_path / f"step{step:06d}.manifest.json",
                   {"checkpoint_file_sha256": sha, "step": step})  # fmt: skip
    script = geometry_stats
    with pytest.raises(ManifestMismatchError):
        script.main(["--checkpoint", str(tmp_path / "step000008.safetensors"),
                     "--manifest", str(tmp_path / "step000032.manifest.json"),
                     "--model-name", "m", "--seed", "0", "--out-pk", str(tmp_path / "pk.parquet"),
                     "--out-summary", str(tmp_path / "s.parquet"),
                     "--out-heads", str(tmp_path / "h.parquet")])  # fmt: skip
    dynamics = dynamics_stage
    with pytest.raises(ValueError, match="not step 8"):
        # a manifest of the right bytes but another step is refused too
        write_manifest(tmp_path / "wrong.manifest.json",
                   {"checkpoint_file_sha256": sha256_file(tmp_path / "step000008.safetensors"),
                    "step": 32})  # fmt: skip
        dynamics.load_step(
            str(tmp_path / "step000008.safetensors"), str(tmp_path / "wrong.manifest.json"), 8
        )
    assert not (tmp_path / "pk.parquet").exists()
