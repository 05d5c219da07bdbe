"""Ablation modes and the block ablation atlas (docs §10.6).

Expectations come from first principles: a constant write is its own mean, so mean
ablation of it changes nothing while zero ablation removes it; zero ablation equals a naive
forward that skips the block (written out here, independently of the hooks); the constant
part is 1 for a constant write and exactly 1/n for n equally frequent orthogonal one-hot
writes; ``resample`` runs today's engine call bit for bit, and the engines' mean/zero modes
equal a plain hooked forward with that head's z set by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headgeom.heads.analysis import ablation
from headgeom.heads.analysis.ablation import Edit
from headgeom.heads.analysis.ablation_modes import mode_comparison
from headgeom.heads.analysis.patch_effects import mode_replacement, patch_task
from headgeom.heads.analysis.patching import (
    logit_difference,
    patch_all_heads,
    patch_all_heads_fast,
)
from headgeom.heads.analysis.tolerance import forward_tolerance
from headgeom.heads.paper.plan import PaperPlan
from headgeom.io import IntegrityError
from headgeom.model import registry, zoo
from headgeom.model.gpt import site
from tests.helpers.models import perturbed
from tests.tolerances import largest, patch_tolerance

TINY = dict(n_layer=3, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
N_VOCAB = 29


def tiny(geometry="learned", seed=0):
    torch.manual_seed(seed)
    return perturbed(
        registry.build_model(zoo.derive_model_config(geometry, TINY, {}), N_VOCAB), seed
    )


def windows(n=6, T=12, seed=3):
    return torch.as_tensor(np.random.default_rng(seed).integers(0, N_VOCAB, (n, T)))


def naive_logits(model, ids, skip=None, head=None):
    """GPT forward written out: embeddings, then per block x += attn(x), x += mlp(ln_2(x)),
    leaving out the ``skip`` = (kind, layer) write; for a head, its W_O^h z^h is subtracted
    from the attention output (z read from the block's own z site)."""
    T = ids.shape[1]
    x = model.wte(ids) + model.wpe(torch.arange(T))
    for layer, block in enumerate(model.blocks):
        if skip == ("head", layer):
            captured = {}

            def keep(z, captured=captured):
                captured["z"] = z

            with model.hooks({site(layer, "attn.hook_z"): keep}):
                out = block.attn(x)
            w_o = block.attn.writer.write_maps()[head]  # (D, d)
            x = x + (out - captured["z"][:, :, head] @ w_o.T)
        elif skip != ("attn", layer):
            x = x + block.attn(x)
        if skip != ("mlp", layer):
            x = x + block.mlp(block.ln_2(x))
    return model.ln_f(x) @ model.wte.weight.T


# ----------------------------------------------------------------------------- descriptors
def test_constant_part_of_constant_and_orthogonal_writes():
    constant = torch.tensor([[0.5, -2.0, 3.0]]).repeat(7, 1)
    assert ablation.constant_part(constant) == pytest.approx(1.0, abs=1e-12)
    for n in (2, 4, 8):
        one_hot = torch.eye(n).repeat(5, 1)  # each of n orthogonal writes, equally often
        assert ablation.constant_part(one_hot) == pytest.approx(1.0 / n, abs=1e-12)
    # a constant plus zero-mean noise lies strictly between
    noise = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]).repeat(3, 1)
    mixed = ablation.constant_part(constant[:6] + noise)
    assert 0.0 < mixed < 1.0
    assert np.isnan(ablation.constant_part(torch.zeros(4, 3)))


def test_size_ratio_is_rms_over_rms():
    w = torch.full((4, 2), 3.0)  # ‖w‖ = 3√2 everywhere
    x = torch.full((4, 2), 1.0)  # ‖x‖ = √2
    assert ablation.size_ratio(w, x) == pytest.approx(3.0)


# ----------------------------------------------------------------------------- block edits
def constant_mlp_model(layer=1):
    """A tiny model whose layer-``layer`` MLP writes the same vector at every position
    (c_fc.weight = 0: the MLP sees only its bias)."""
    model = tiny()
    with torch.no_grad():
        model.blocks[layer].mlp.c_fc.weight.zero_()
    return model


def test_mean_ablation_of_a_constant_write_changes_nothing_zero_ablation_does():
    model = constant_mlp_model(1)
    ids = windows()
    means = ablation.write_means(model, windows(seed=9), batch_size=4)
    base = ablation.edited_logits(model, ids, None, means)
    mean = ablation.edited_logits(model, ids, Edit("mlp", 1, None, "mean"), means)
    zero = ablation.edited_logits(model, ids, Edit("mlp", 1, None, "zero"), means)
    # the routes part at block 1: L − 1 blocks plus the unembedding at the largest |logit|
    tol = forward_tolerance(model, largest(base), from_layer=1)
    torch.testing.assert_close(mean, base, atol=tol, rtol=0)
    assert (zero - base).abs().max() > 1e-2
    # and the atlas sees it: KL 0 for mean, > 0 for zero; constant part 1
    rows, _ = ablation.block_atlas(model, means, ids, [], batch_size=4, work_bytes=2**30)
    mlp1 = rows[(rows["block"] == "mlp") & (rows["layer"] == 1)].set_index("ablation")
    assert mlp1.loc["mean", "kl"] == pytest.approx(0.0, abs=1e-9)
    assert mlp1.loc["zero", "kl"] > 1e-4
    assert mlp1.loc["zero", "constant_part"] == pytest.approx(1.0, abs=1e-6)


def test_atlas_kl_is_the_definition_in_float64_and_float32():
    # KL of next-token distributions averaged over every input position, by hand: scipy's
    # rel_entr of the naive forward's softmax with and without the block's write
    from scipy.special import rel_entr

    model, ids = tiny(seed=5).double(), windows()
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    inputs = ids[:, :-1]
    with torch.no_grad():
        p = torch.softmax(naive_logits(model, inputs), -1).numpy()
        cases = [("attn", 0, -1), ("mlp", 2, -1), ("head", 1, 3)]
        expected = [
            rel_entr(p, torch.softmax(naive_logits(model, inputs, (k, lay), h), -1).numpy())
            .sum(-1)
            .mean()
            for k, lay, h in cases
        ]
    for dtype, rtol in ((torch.float64, 1e-9), (torch.float32, 1e-3)):
        # float32: logits within δ ≈ 4·(L+1)·eps₃₂·max|logit| ≈ 3e-5 (max|logit| 14) move
        # these KLs (0.24–2.6) by ≲ 2δ·√(2·KL), under 2e-4 relative (measured: 4e-7)
        rows, _ = ablation.block_atlas(model.to(dtype), means, ids, [], 4, 2**30, modes=("zero",))
        assert (rows["kl"] >= 0).all()
        for (k, lay, h), want in zip(cases, expected, strict=True):
            row = rows[(rows["block"] == k) & (rows["layer"] == lay)]
            row = row[row["head"] == h] if k == "head" else row
            assert float(row["kl"].iloc[0]) == pytest.approx(want, rel=rtol), (dtype, k)
    assert min(expected) > 1e-3  # not vacuous


def test_chunked_atlas_equals_the_unchunked_one_in_float64():
    # a budget that splits windows, edits and positions gives the same KLs, top-1 changes,
    # retention and descriptors as one that holds everything at once (float64: rows and
    # positions are unembedded independently, so chunking only reorders float64 sums)
    torch.manual_seed(6)  # a vocabulary large enough for the KL's share of the budget
    cfg = zoo.derive_model_config("learned", TINY, {})
    model, ids = perturbed(registry.build_model(cfg, 160), 6).double(), windows(n=5, T=12)
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    rng = np.random.default_rng(1)
    task = ablation.TaskPrompts(
        "sva", [rng.integers(0, N_VOCAB, 6) for _ in range(9)], rng.integers(0, N_VOCAB, 9),
        rng.integers(0, N_VOCAB, 9),
    )  # fmt: skip
    n_edits = len(ablation.atlas_edits(model))
    small = 24 * ablation.forward_row_bytes(model.cfg, 11, 8)  # 12 rows: 4 windows × 2 edits
    plan = ablation.atlas_plan(model, 11, 4, small, 6, n_edits)
    assert plan.windows < 5 and plan.edits < n_edits and plan.positions < 11  # all chunked
    big = ablation.atlas_plan(model, 11, 8, 2**30, 6, n_edits)
    assert big.windows >= 5 and big.edits == n_edits and big.positions == 11  # none chunked
    got, _ = ablation.block_atlas(model, means, ids, [task], batch_size=4, work_bytes=small)
    want, _ = ablation.block_atlas(model, means, ids, [task], batch_size=8, work_bytes=2**30)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=0, atol=1e-12)
    assert (want["kl"] > 1e-4).sum() > n_edits // 2  # not vacuous


def test_atlas_budget_too_small_is_a_clear_error():
    model = tiny()
    with pytest.raises(ValueError, match=r"ablation.work_mb .* below two rows"):
        ablation.atlas_plan(model, 11, 4, 1000)


def test_atlas_peak_formula_at_paper_shape_is_bounded_by_its_budget():
    # the plan's own estimate stays within the budget at the paper's shape (no model is
    # built: the plan needs only cfg, the vocabulary and the dtype's size)
    from types import SimpleNamespace

    cfg = SimpleNamespace(n_layer=12, n_head=12, d_model=768, d_mlp=3072, n_vocab=50257)
    paper = SimpleNamespace(cfg=cfg, parameters=lambda: iter([torch.zeros(1)]))
    for mb in (2048, 4096, 16384):
        plan = ablation.atlas_plan(paper, 511, 16, mb * 2**20, 12, n_edits=12 * 14 * 2)
        assert plan.peak_bytes <= mb * 2**20, (mb, plan)
        assert plan.windows * (1 + plan.edits) * plan.positions * 50257 * 8 < mb * 2**20


@pytest.mark.parametrize("kind,layer", [("mlp", 0), ("mlp", 2), ("attn", 0), ("attn", 1)])
def test_zero_ablation_equals_removing_the_block(kind, layer):
    model, ids = tiny(seed=1), windows()
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    got = ablation.edited_logits(model, ids, Edit(kind, layer, None, "zero"), means)
    assert torch.equal(got, naive_logits(model, ids, (kind, layer)))
    assert not torch.equal(got, naive_logits(model, ids))


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3), (2, 2)])
def test_zero_ablation_of_a_head_removes_its_write(layer, head):
    model, ids = tiny(seed=2), windows()
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    got = ablation.edited_logits(model, ids, Edit("head", layer, head, "zero"), means)
    expected = naive_logits(model, ids, ("head", layer), head)
    # the routes part at the ablated block: one stage per block from it plus the unembedding,
    # at the largest |logit|
    tol = forward_tolerance(model, largest(expected), from_layer=layer)
    torch.testing.assert_close(got, expected, atol=tol, rtol=0)


def test_stacked_edits_equal_one_edit_at_a_time():
    model, ids = tiny(seed=4), windows()
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    edits = ablation.atlas_edits(model)
    stacked = ablation._stacked_forward(model, ids, edits, means)
    # stacked rows against one batch: the routes part at block 0, L + 1 stages at the
    # largest |logit|
    tol = forward_tolerance(model, largest(stacked))
    for g, edit in enumerate(edits):
        single = ablation.edited_logits(model, ids, edit, means)
        torch.testing.assert_close(stacked[g], single, atol=tol, rtol=0, msg=str(edit))


def test_means_exclude_position_zero():
    model, ids = tiny(), windows(n=3, T=5)
    means = ablation.write_means(model, ids, batch_size=2)
    _, cache = model.run_with_cache(ids, [site(1, "hook_attn_out"), site(2, "attn.hook_z")])
    by_hand = cache[site(1, "hook_attn_out")][:, 1:].double().mean(dim=(0, 1))
    assert torch.allclose(means["attn_out_mean"][1], by_hand, atol=1e-12)
    z = cache[site(2, "attn.hook_z")][:, 1:].double().mean(dim=(0, 1))  # (H, d)
    assert torch.allclose(means["z_mean"][2], z, atol=1e-12)


def test_retention_counts_prompts_that_stay_right():
    model = constant_mlp_model(1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, N_VOCAB, 6) for _ in range(20)]
    good = rng.integers(0, N_VOCAB, 20)
    bad = (good + 1) % N_VOCAB
    task = ablation.TaskPrompts("sva", prompts, good, bad)
    means = ablation.write_means(model, windows(seed=9), batch_size=16)
    edits = [Edit("mlp", 1, None, "mean"), Edit("mlp", 1, None, "zero")]
    got = ablation._retention(model, task, edits, means, max_rows=16)
    ids = torch.as_tensor(np.stack(prompts))
    base = naive_logits(model, ids)[:, -1]
    right = (base[range(20), good] - base[range(20), bad]) > 0
    edited = naive_logits(model, ids, ("mlp", 1))[:, -1]
    stays = ((edited[range(20), good] - edited[range(20), bad]) > 0) & right
    assert got[0] == pytest.approx(1.0)  # mean ablation of a constant write
    assert got[1] == pytest.approx(float(stays.sum() / right.sum()))


# ----------------------------------------------------------------------------- the artifact
def test_means_artifact_round_trip_and_checkpoint_gate(tmp_path):
    model = tiny()
    means = ablation.write_means(model, windows(), batch_size=16)
    path = tmp_path / "means.safetensors"
    sha = ablation.save_means(path, means, {"checkpoint_sha256": "abc"})
    again = ablation.save_means(tmp_path / "again.safetensors", means, {"checkpoint_sha256": "abc"})
    assert sha == again  # equal inputs, equal bytes
    back = ablation.read_means(path, "abc")
    assert back.sha256 == sha and torch.equal(back.z, means["z_mean"])
    with pytest.raises(ValueError, match="means of checkpoint abc.*rerun ablation_atlas"):
        ablation.read_means(path, "def")


def test_a_changed_byte_in_the_means_is_refused_naming_its_rule(tmp_path):
    """The verify-on-read case of a means artifact: a byte flipped in its tensors (any
    value would follow silently otherwise) or in its header is refused on read."""
    path = tmp_path / "results" / "demo" / "ablation" / "learned" / "s42" / "means.safetensors"
    ablation.save_means(
        path, ablation.write_means(tiny(), windows(), batch_size=16), {"checkpoint_sha256": "abc"}
    )
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    for offset, message in ((len(data) - 5, "means SHA-256 is"), (header_end - 30, "means")):
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(IntegrityError, match=message) as err:
            ablation.read_means(path, "abc")
        assert "written by rule ablation_atlas" in str(err.value)
    path.write_bytes(data)
    assert torch.equal(ablation.read_means(path, "abc").z, ablation.read_means(path).z)


# ----------------------------------------------------------------------------- patching modes
def task_pairs(n=10, seed=1):
    rng = np.random.default_rng(seed)
    clean, ref = [], []
    for i in range(n):
        T = (6, 9)[i % 2]
        x = rng.integers(0, N_VOCAB, T)
        y = x.copy()
        y[T - 3] = (x[T - 3] + 1) % N_VOCAB
        clean.append(x)
        ref.append(y)
    good = rng.integers(0, N_VOCAB, n)
    return clean, ref, good, (good + 2) % N_VOCAB


def hand_patched_ld(model, clean, good, bad, layer, head, value):
    """LD with head (layer, head)'s z set to ``value`` at every position, one forward."""

    def fn(z):
        z = z.clone()
        z[:, :, head] = value
        return z

    out = []
    for x, g, b in zip(clean, good, bad, strict=True):
        ids = torch.as_tensor(x)[None]
        with torch.no_grad(), model.hooks({site(layer, "attn.hook_z"): fn}):
            logits = model(ids, last_only=True)
        out.append(float(logit_difference(logits, torch.tensor([g]), torch.tensor([b]))[0]))
    return np.array(out)


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_engine_modes_equal_a_hand_set_z(mode):
    model = tiny(seed=5)
    clean, ref, good, bad = task_pairs()
    z_means = ablation.write_means(model, windows(seed=7), batch_size=16)["z_mean"]
    replacement = mode_replacement(model, mode, z_means)
    fast = patch_all_heads_fast(
        model, clean, ref, good, bad, 4, max_rows=4096, replacement=replacement
    )
    plain = patch_all_heads(model, clean, ref, good, bad, 4, replacement=replacement)
    # engines, batches and the hand-set forward part at block 0: L + 1 stages at the largest
    # |logit|
    tol = patch_tolerance(model, clean, ref)
    np.testing.assert_allclose(fast[1], plain[1], rtol=0, atol=tol)
    for layer, head in ((0, 1), (1, 0), (2, 3)):
        value = replacement[layer, head].float()
        expected = hand_patched_ld(model, clean, good, bad, layer, head, value)
        np.testing.assert_allclose(plain[1][:, layer, head], expected, rtol=0, atol=tol)
    # mean and zero differ from resample on a perturbed model
    resample = patch_all_heads_fast(model, clean, ref, good, bad, 4, max_rows=4096)
    assert np.abs(resample[1] - fast[1]).max() > 1e-3


def test_resample_mode_is_todays_engine_bit_for_bit():
    from headgeom.data.task_files import TaskSplits

    model = tiny(seed=6)
    clean, ref, good, bad = task_pairs(12)
    vocab = np.arange(N_VOCAB)
    frame = pd.DataFrame({
        "example_id": np.arange(12), "split": "evaluation", "condition": "c",
        "lexical_group": "g", "clean_ids": clean, "ref_ids": ref,
        "correct_id": good, "incorrect_id": bad,
    })  # fmt: skip
    task = TaskSplits(frame, None, "d", "f", "sva")
    rows = patch_task(model, vocab, task, ["evaluation"], 4, 4096, "fast", mode="resample")
    clean_ld, patched = patch_all_heads_fast(model, clean, ref, good, bad, 4, max_rows=4096)
    today = (clean_ld[:, None, None] - patched).reshape(-1)
    assert rows["effect"].to_numpy().tobytes() == today.tobytes()
    assert rows["patched_ld"].to_numpy().tobytes() == patched.reshape(-1).tobytes()


def test_mode_errors():
    model = tiny()
    with pytest.raises(ValueError, match="mode must be one of"):
        mode_replacement(model, "shuffle", None)
    with pytest.raises(ValueError, match="needs the head means"):
        mode_replacement(model, "mean", None)
    with pytest.raises(ValueError, match=r"replacement has shape"):
        patch_all_heads_fast(
            model, *task_pairs(2), 2, max_rows=4096, replacement=torch.zeros(1, 1, 1)
        )


# ----------------------------------------------------------------------------- comparison
def test_mode_comparison_by_hand():
    run = dict(model="m", seed=1, task="sva")
    e_base = np.array([3.0, 1.0, 0.5, 0.0])
    e_other = np.array([0.1, 0.2, 0.3, 0.4])  # reversed ranks of e_base
    heads = pd.concat([
        pd.DataFrame({**run, "split": "evaluation", "layer": [0, 0, 1, 1],
                      "head": [0, 1, 0, 1], "e": e, "mode": mode})
        for mode, e in (("resample", e_base), ("zero", e_other))
    ])  # fmt: skip
    summary = pd.DataFrame([
        {**run, "split": "evaluation", "mode": mode, "E": E, "N_eff": n, "top_head_share": 0.5,
         "N_index": 1.5, "N_layer_given_index": n / 1.5, "top_layer": 0, "top_head": 0}
        for mode, E, n in (("resample", 4.5, 2.0), ("zero", 1.0, 3.0))
    ])  # fmt: skip
    lanes = pd.DataFrame([{**run, "split": "discovery", "mode": m, "lambda_score": 0.5,
                           "p_value": 0.1} for m in ("resample", "zero")])  # fmt: skip
    out = mode_comparison(summary, heads, lanes, "evaluation", "resample")
    out = out.set_index("mode")
    assert out.loc["resample", "spearman_vs_base"] == pytest.approx(1.0)
    assert out.loc["zero", "spearman_vs_base"] == pytest.approx(-1.0)
    assert out.loc["zero", "N_eff_ratio"] == pytest.approx(1.5)
    assert out.loc["zero", "E_ratio"] == pytest.approx(1.0 / 4.5)
    assert out.loc["zero", "lambda_split"] == "discovery"


# ----------------------------------------------------------------------------- the study
def demo_config():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    return yaml.safe_load((root / "config" / "config.yaml").read_text())


def test_study_modes_runs_and_splits():
    from headgeom.heads.study import Study

    study = Study.from_config(demo_config())
    assert study.patch_mode == "resample"
    assert study.comparison_modes == ["resample", "mean", "zero"]
    assert study.run_set("ablation_modes") == [("learned", 42)]
    assert len(study.run_set("ablation_atlas")) == len(study.models) and (
        "learned",
        43,
    ) not in study.run_set("ablation_atlas")
    assert study.mode_splits == ["discovery", "evaluation"]  # lanes, concentration
    plan = PaperPlan(study)
    assert "ablation_atlas" in plan.tables and "ablation_atlas" in plan.figures
    cfg = demo_config()
    cfg["patching"]["mode"] = "mean"
    cfg["ablation"]["modes"] = ["resample", "mean"]
    assert Study.from_config(cfg).comparison_modes == ["mean", "resample"]
    cfg["ablation"]["modes"] = ["mean"]
    none = Study.from_config(cfg)
    assert none.extra_modes == [] and none.run_set("ablation_modes") == []
    assert "ablation_modes" not in PaperPlan(none).tables


def test_study_refuses_bad_ablation_config():
    from headgeom.heads.study import Study, StudyConfigError

    cfg = demo_config()
    cfg["patching"]["mode"] = "means"
    with pytest.raises(StudyConfigError, match=r"config patching.mode: 'means' is not allowed "
                                               r"\(did you mean 'mean'\?\)"):  # fmt: skip
        Study.from_config(cfg)
    cfg = demo_config()
    cfg["ablation"]["mode_models"] = ["lerned"]
    wanted = r"ablation.mode_models\[0\]: unknown model 'lerned' \(did you mean 'learned'\?\)"
    with pytest.raises(StudyConfigError, match=wanted):
        Study.from_config(cfg)


def test_study_refuses_windows_beyond_the_validation_file():
    from headgeom.heads.study import Study, StudyConfigError

    cfg = demo_config()  # 65,536 validation tokens = 1024 windows of 64
    cfg["ablation"]["n_mean_windows"] = 1020
    with pytest.raises(StudyConfigError, match=r"n_mean_windows \+ n_eval_windows = 1028 windows"):
        Study.from_config(cfg)
