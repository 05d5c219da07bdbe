"""Attribution patching (AtP) beside exact patching (docs §10.1): AtP is exact where the logit
difference is affine in the patched site, it is the first-order directional derivative of the
patch on a nonlinear model (our GPT and a transformers Llama), the agreement statistics on a
hand-computed grid, and the atp_agreement stage end to end. How well AtP agrees with exact
patching on a trained model is a measured result of the study, not a test."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from headgeom.hashing import sha256_file
from headgeom.heads.analysis import atp_agreement as atp
from headgeom.heads.analysis.patching import (
    attribution_patch,
    logit_difference,
    patch_all_heads,
    replace_head,
    z_sites,
)
from headgeom.heads.analysis.tolerance import rounding_tolerance
from headgeom.heads.stages import atp_agreement as atp_agreement_stage
from headgeom.heads.stages import patch_heads
from headgeom.io import read_parquet_metadata, write_manifest, write_parquet
from headgeom.model import registry
from headgeom.model.checkpoint import save_checkpoint
from tests.helpers.examples import TASK_SCHEMA, random_pairs
from tests.helpers.models import N_VOCAB, multiscreen_model, small_gpt, zoo_model
from tests.tolerances import largest, patch_tolerance


# --------------------------------------------------------------------------- linear stand-in
class LinearStandIn(nn.Module):
    """A model with the engines' interface (``cfg``, ``hooks``, ``run_with_cache``,
    ``forward(ids, last_only)``) whose logits are affine in every head's z.

    x_0 = tanh(E[ids]); per layer l: z^{l,h}_t = (1 / (t+1)) Σ_{s≤t} x_s V^{l,h} (causal
    averaging: a fixed linear map, no softmax), x ← x + Σ_h z^{l,h} O^{l,h}; logits = x U.
    ``nonlinear=True`` passes each layer's update through tanh (the control)."""

    def __init__(self, nonlinear: bool = False, n_layer: int = 3, n_head: int = 2,
                 d_model: int = 6, d_head: int = 3, seed: int = 0):  # fmt: skip
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def param(*shape):
            return nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64))

        self.cfg = SimpleNamespace(n_layer=n_layer, n_head=n_head, d_head=d_head)
        self.embed, self.U = param(N_VOCAB, d_model), param(d_model, N_VOCAB)
        self.V, self.O = param(n_layer, n_head, d_model, d_head), param(n_layer, n_head, d_head,
                                                                          d_model)  # fmt: skip
        self.nonlinear = nonlinear
        self._fns: dict = {}

    @contextlib.contextmanager
    def hooks(self, fns):
        self._fns = dict(fns)
        try:
            yield
        finally:
            self._fns = {}

    def run_with_cache(self, ids, names, last_only=False):
        cache = {}

        def saver(name):
            def save(x):
                cache[name] = x.detach().clone()

            return save

        with self.hooks({n: saver(n) for n in names}):
            return self(ids, last_only), cache

    def forward(self, ids, last_only=False):
        x = torch.tanh(self.embed[ids])  # nonlinear before every z: AtP stays exact
        T = ids.shape[1]
        average = torch.tril(torch.ones(T, T, dtype=x.dtype)) / torch.arange(1, T + 1)[:, None]
        for layer in range(self.cfg.n_layer):
            z = torch.einsum("ts,bsd,hdk->bthk", average, x, self.V[layer])
            fn = self._fns.get(f"blocks.{layer}.attn.hook_z")
            if fn is not None:
                out = fn(z)
                z = z if out is None else out
            update = torch.einsum("bthk,hkd->btd", z, self.O[layer])
            x = x + (torch.tanh(update) if self.nonlinear else update)
        logits = x @ self.U
        return logits[:, -1] if last_only else logits


def test_atp_is_exact_where_the_logit_difference_is_affine_in_the_patched_site():
    """Why exact: downstream of z^{l,h} the stand-in is linear (W_O, the residual sum, the
    later layers' causal averaging and V, the unembedding), so with every later z recomputed
    LD(z^{l,h} + Δ) = LD(z^{l,h}) + g · Δ with g = ∂LD/∂z^{l,h} the same at every point. AtP
    computes g at the clean point by one backward and multiplies by Δ = z^ref − z^clean: the
    first-order Taylor expansion has no remainder, so AtP's patched LD is the exact one up to
    float64 round-off. The tanh before the first layer does not matter (it precedes every z);
    the control puts a tanh after each layer's update and AtP no longer is exact."""
    pairs = random_pairs(5, (4, 6), seed=3)
    model = LinearStandIn()
    clean_ld, estimate = attribution_patch(model, *pairs, batch_size=2)
    exact_clean, exact = patch_all_heads(model, *pairs, batch_size=2)
    # two routes (a backward and product against L later forwards) at the largest |LD| or |logit|
    scale = largest(clean_ld, estimate, exact, *(model(torch.as_tensor(np.stack([x])),
                    last_only=True) for x in (*pairs[0], *pairs[1])))  # fmt: skip
    tol = rounding_tolerance(torch.float64, scale, 2 * (model.cfg.n_layer + 1))
    np.testing.assert_allclose(clean_ld, exact_clean, rtol=0, atol=tol)
    np.testing.assert_allclose(estimate, exact, rtol=0, atol=tol)
    drops = clean_ld[:, None, None] - exact
    assert np.abs(drops).min() > 1e3 * tol  # every head moves LD: the comparison is not vacuous

    control = LinearStandIn(nonlinear=True)
    clean_ld, estimate = attribution_patch(control, *pairs, batch_size=2)
    _, exact = patch_all_heads(control, *pairs, batch_size=2)
    assert np.abs(estimate - exact).max() > 1e-2


# --------------------------------------------------------------------------- finite differences
def _rms_norm_in_its_dtype(self, x):
    """LlamaRMSNorm.forward without its upcast to float32 (there for half precision)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def tiny_llama(monkeypatch):
    """A random grouped-query Llama (2 layers, 4 query heads on 2 key/value heads, rotary),
    wrapped with our sites, in float64. transformers' RMSNorm computes in float32 whatever the
    model's dtype, which would put float32 round-off (~1e-7 / ε) into a difference quotient:
    here it computes the same formula in float64."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from headgeom.model.hf import HFCausalLM

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms_norm_in_its_dtype)
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(
        vocab_size=N_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.2,
        max_position_embeddings=64,
    )  # fmt: skip
    return HFCausalLM.wrap(transformers.LlamaForCausalLM(cfg).eval()).double()


def central_difference(model, clean, ref, correct, incorrect, eps=1e-5) -> np.ndarray:
    """d/dε LD(z^{l,h} + ε (z^ref − z^clean)) at ε = 0 for every head, (B, L, H), by
    central differences of the z patch (one batch of equal-length prompts)."""
    c, r = torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    good, bad = torch.as_tensor(correct), torch.as_tensor(incorrect)
    names = z_sites(model)
    out = np.empty((len(clean), model.cfg.n_layer, model.cfg.n_head))
    with torch.no_grad():
        _, zc = model.run_with_cache(c, names)
        _, zr = model.run_with_cache(r, names)
        for layer, name in enumerate(names):
            for h in range(model.cfg.n_head):
                direction = zr[name][:, :, h] - zc[name][:, :, h]
                lds = []
                for sign in (1, -1):
                    z = zc[name][:, :, h] + sign * eps * direction
                    with model.hooks({name: replace_head(h, z)}):
                        lds.append(logit_difference(model(c, last_only=True), good, bad))
                out[:, layer, h] = ((lds[0] - lds[1]) / (2 * eps)).numpy()
    return out


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_atp_is_the_directional_derivative_along_the_patch(kind, monkeypatch):
    """AtP's estimate minus clean LD is (z^ref − z)·∂LD/∂z: the derivative of LD along the
    patch direction at ε = 0. Central differences in float64 (error O(ε²) + round-off /ε)
    agree to 1e-5 relative; on these nonlinear models the exact patch differs from it."""
    model = zoo_model("learned", seed=8).double() if kind == "gpt" else tiny_llama(monkeypatch)
    pairs = random_pairs(3, (7,), seed=9)
    clean_ld, estimate = attribution_patch(model, *pairs, batch_size=3)
    derivative = central_difference(model, *pairs)
    np.testing.assert_allclose(estimate - clean_ld[:, None, None], derivative, rtol=1e-5,
                               atol=1e-7 * max(1.0, np.abs(derivative).max()))  # fmt: skip
    assert np.abs(derivative).max() > 1e-2  # the patch moves LD
    _, exact = patch_all_heads(model, *pairs, batch_size=3)
    assert np.abs(estimate - exact).max() > 1e-4  # a first-order estimate, not the patch


@pytest.mark.parametrize(
    "geometry", [*sorted(registry.geometry_names("gpt")), "multiscreen-learned"]
)
def test_atp_runs_on_every_geometry_with_the_exact_engines_clean_ld(geometry):
    """Every model kind the studies patch: AtP's clean forward is the plain engine's (the same
    forward, so equal up to batching round-off) and every estimate is finite."""
    if geometry.startswith("multiscreen-"):
        model = multiscreen_model(geometry.removeprefix("multiscreen-"))
    else:
        model = zoo_model(geometry)
    pairs = random_pairs(4, (6, 7), seed=1)
    clean_ld, estimate = attribution_patch(model, *pairs, batch_size=4)
    exact_clean, _ = patch_all_heads(model, *pairs, batch_size=4)
    np.testing.assert_allclose(clean_ld, exact_clean, rtol=0,
                               atol=patch_tolerance(model, pairs[0], pairs[1]))  # fmt: skip
    assert estimate.shape == (4, model.cfg.n_layer, model.cfg.n_head)
    assert np.isfinite(estimate).all()


def test_atp_takes_the_ablation_modes_fixed_z():
    """Zero ablation: the direction is 0 − z^clean, so on the affine stand-in AtP equals the
    exact zero-ablation patch."""
    pairs = random_pairs(4, (5,), seed=4)
    model = LinearStandIn(seed=2)
    cfg = model.cfg
    zero = torch.zeros(cfg.n_layer, cfg.n_head, cfg.d_head, dtype=torch.float64)
    clean_ld, estimate = attribution_patch(model, *pairs, batch_size=4, replacement=zero)
    _, exact = patch_all_heads(model, *pairs, batch_size=4, replacement=zero)
    _, resample = patch_all_heads(model, *pairs, batch_size=4)
    tol = rounding_tolerance(torch.float64, largest(estimate, exact, clean_ld), 8)
    np.testing.assert_allclose(estimate, exact, rtol=0, atol=tol)
    assert np.abs(exact - resample).max() > 1e-2  # zero ablation is another patch


# --------------------------------------------------------------------------- the statistics
# A 3 × 3 grid (row-major: index 3·layer + head) and its AtP, with every statistic by hand.
EXACT = np.array([[5.0, -4.0, 3.0], [0.5, 2.0, -1.0], [0.1, 0.2, 0.3]])
ATP = np.array([[4.0, -4.5, 1.0], [0.5, 2.5, -1.0], [0.1, 0.3, 0.2]])


def test_agreement_by_hand():
    row = atp.agreement(EXACT, ATP, top_k=3, n_misses=4)
    # signed ranks (1 = smallest): exact [9,1,8,6,7,2,3,4,5], AtP [9,1,7,6,8,2,3,5,4];
    # no ties, so ρ = 1 − 6 Σd² / (n (n² − 1)) with Σd² = 4, n = 9
    assert row["spearman_rho"] == pytest.approx(1 - 6 * 4 / (9 * 80))
    # |e| ranks: exact [9,8,7,4,6,5,1,2,3], AtP [8,9,5.5,4,7,5.5,1,3,2] (a tie at |1|):
    # Pearson of the ranks, centred at 5: Σ(a−5)(b−5) = 56, Σ(a−5)² = 60, Σ(b−5)² = 59.5
    assert row["spearman_rho_abs"] == pytest.approx(56 / math.sqrt(60 * 59.5))
    # top-3 by |e|: exact {(0,0), (0,1), (0,2)}, AtP {(0,1), (0,0), (1,1)}: 2 shared
    assert row["top_k"] == 3 and row["top_k_overlap"] == pytest.approx(2 / 3)
    assert row["top_k_boundary_tie"] is False  # 3rd/4th |e|: exact 3 vs 2, AtP 2.5 vs 1
    # misses AtP − exact: (0,2) −2, (0,0) −1, then (0,1) −0.5 and (1,1) +0.5 tie: row-major
    assert list(zip(row["miss_layer"], row["miss_head"], strict=True)) == [
        (0, 2), (0, 0), (0, 1), (1, 1)
    ]  # fmt: skip
    assert row["miss_exact"] == [3.0, 5.0, -4.0, 2.0]
    assert row["miss_atp"] == [1.0, 4.0, -4.5, 2.5]
    assert row["max_abs_miss"] == 2.0
    assert row["E_exact"] == pytest.approx(16.1) and row["E_atp"] == pytest.approx(14.1)
    p = np.abs(EXACT).ravel() / 16.1
    assert row["N_eff_exact"] == pytest.approx(math.exp(-sum(x * math.log(x) for x in p)))
    assert row["n_heads"] == 9


def test_a_tie_at_k_is_flagged_and_broken_row_major():
    # AtP's 4th and 5th largest |e| are both 1, at (0,2) and (1,2): (0,2) comes first
    row = atp.agreement(EXACT, ATP, top_k=4)
    assert row["top_k_boundary_tie"] is True
    assert row["top_k_overlap"] == 1.0  # exact {(0,0),(0,1),(0,2),(1,1)}; AtP the same
    heads = pd.DataFrame({"layer": np.repeat(np.arange(3), 3), "head": np.tile(np.arange(3), 3),
                          "effect_exact": EXACT.ravel(), "effect_atp": ATP.ravel()})  # fmt: skip
    ranked = atp.head_ranks(heads, top_k=4).set_index(["layer", "head"])
    assert ranked.loc[(0, 2), "rank_atp"] == 4 and ranked.loc[(1, 2), "rank_atp"] == 5
    assert ranked["top_atp"].sum() == 4 and not ranked.loc[(1, 2), "top_atp"]
    assert ranked.loc[(0, 2), "miss"] == -2.0
    # fewer heads than k: k becomes the number of heads, and every head is in both tops
    small = atp.agreement(EXACT[:1], ATP[:1], top_k=10)
    assert small["top_k"] == 3 and small["top_k_overlap"] == 1.0
    assert not small["top_k_boundary_tie"]
    # a constant side has no rank correlation
    assert math.isnan(atp.agreement(EXACT, np.ones((3, 3)))["spearman_rho"])


# --------------------------------------------------------------------------- the stage
SPLIT_SIZES = {"discovery": 3, "validation": 2, "evaluation": 5, "holdout": 2}
VOCAB_STRIDE = 7  # model id i <-> task id 7 i + 100


def make_run(tmp_path, dataset_sha256="ab" * 32):
    """Checkpoint, manifest and task file of a small random GPT (task ids through a
    compacted vocabulary)."""
    vocab = np.arange(N_VOCAB, dtype=np.int64) * VOCAB_STRIDE + 100
    model = small_gpt("learned", 0, N_VOCAB)
    checkpoint = tmp_path / "model.safetensors"
    save_checkpoint(checkpoint, model, vocab)
    manifest = tmp_path / "manifest.json"
    write_manifest(manifest, {"config_id": "learned",
                              "checkpoint_file_sha256": sha256_file(checkpoint)})  # fmt: skip
    n = sum(SPLIT_SIZES.values())
    clean, ref, correct, incorrect = random_pairs(n, (6, 8), seed=11)
    table = {
        "example_id": list(range(n)),
        "split": [s for s, k in SPLIT_SIZES.items() for _ in range(k)],
        "condition": [["SS", "SP", "PS", "PP"][i % 4] for i in range(n)],
        "lexical_group": [f"g{i % 2}" for i in range(n)],
        "clean_ids": [vocab[x].tolist() for x in clean],
        "ref_ids": [vocab[x].tolist() for x in ref],
        "diff_position": [int(np.flatnonzero(c != r)[0]) for c, r in zip(clean, ref, strict=True)],
        "correct_id": vocab[correct].tolist(),
        "incorrect_id": vocab[incorrect].tolist(),
    }
    task = tmp_path / "sva.parquet"
    meta = {"dataset_sha256": dataset_sha256, "task": "sva"}
    write_parquet(task, pa.table(table).cast(TASK_SCHEMA), TASK_SCHEMA, metadata=meta)
    return {"checkpoint": checkpoint, "manifest": manifest, "task": task, "model": model,
            "pairs": (clean, ref, correct, incorrect)}  # fmt: skip


def run_args(run, tmp_path, effects, tag=""):
    outs = {k: tmp_path / f"atp{tag}-{k}.parquet" for k in ("agreement", "heads", "examples")}
    argv = ["--checkpoint", str(run["checkpoint"]), "--manifest", str(run["manifest"]),
            "--task", str(run["task"]), "--effects", str(effects), "--split", "evaluation",
            "--batch-size", "2", "--model-name", "learned", "--seed", "42", "--device", "cpu",
            "--top-k", "4", "--out-figure", str(tmp_path / f"atp{tag}.png"),
            *(x for k, p in outs.items() for x in (f"--out-{k}", str(p)))]  # fmt: skip
    return argv, outs


def patch(run, out, splits="discovery,evaluation"):
    argv = ["--checkpoint", str(run["checkpoint"]), "--manifest", str(run["manifest"]),
            "--task", str(run["task"]), "--splits", splits, "--batch-size", "3",
            "--max-rows", "4096", "--mode", "resample",
            "--model-name", "learned", "--seed", "42", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    assert patch_heads.main(argv) == 0


def test_the_stage_writes_atp_beside_the_exact_effects(tmp_path):
    run = make_run(tmp_path)
    effects = tmp_path / "effects.parquet"
    patch(run, effects)
    argv, outs = run_args(run, tmp_path, effects)
    assert atp_agreement_stage.main(argv) == 0

    examples = pq.read_table(outs["examples"]).to_pandas()
    heads = pq.read_table(outs["heads"]).to_pandas()
    (row,) = pq.read_table(outs["agreement"]).to_pandas().to_dict("records")
    L, H = run["model"].cfg.n_layer, run["model"].cfg.n_head
    n_eval = SPLIT_SIZES["evaluation"]
    assert len(examples) == n_eval * L * H and len(heads) == L * H
    assert set(examples["split"]) == set(heads["split"]) == {"evaluation"}

    # the exact drops are the effects file's rows of the evaluation split, unchanged
    exact = pq.read_table(effects).to_pandas()
    exact = exact[exact["split"] == "evaluation"]
    joined = exact.merge(examples, on=["example_id", "layer", "head"], validate="one_to_one")
    assert len(joined) == len(examples)
    np.testing.assert_array_equal(joined["effect"], joined["effect_exact"])

    # AtP's drops are the engine's on the evaluation examples in model ids
    first_eval = SPLIT_SIZES["discovery"] + SPLIT_SIZES["validation"]
    chosen = slice(first_eval, first_eval + n_eval)
    clean, ref, correct, incorrect = (list(x)[chosen] for x in run["pairs"])
    clean_ld, estimate = attribution_patch(run["model"], clean, ref, correct, incorrect, 2)
    want = (clean_ld[:, None, None] - estimate).reshape(-1)  # example-major, as written
    np.testing.assert_allclose(examples["effect_atp"], want, rtol=0, atol=1e-12)
    ids = np.arange(first_eval, first_eval + n_eval)
    assert examples["example_id"].tolist() == np.repeat(ids, L * H).tolist()

    # per-head means and the agreement row, recomputed here by pandas and scipy
    means = examples.groupby(["layer", "head"])[["effect_exact", "effect_atp"]].mean()
    got = heads.set_index(["layer", "head"])
    np.testing.assert_allclose(got.loc[means.index, "effect_exact"], means["effect_exact"],
                               rtol=0, atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(got.loc[means.index, "effect_atp"], means["effect_atp"],
                               rtol=0, atol=1e-12)  # fmt: skip
    from scipy.stats import spearmanr  # the independent route

    rho = spearmanr(means["effect_exact"], means["effect_atp"]).statistic
    assert row["spearman_rho"] == pytest.approx(rho, abs=1e-12)
    by_size = {side: [lh for lh, _ in sorted(means[f"effect_{side}"].abs().items(),
                                             key=lambda kv: (-kv[1], kv[0]))][:4]
               for side in ("exact", "atp")}  # fmt: skip
    assert row["top_k"] == 4
    assert row["top_k_overlap"] == len(set(by_size["exact"]) & set(by_size["atp"])) / 4
    assert set(got.index[got["top_exact"]]) == set(by_size["exact"])
    miss = (means["effect_atp"] - means["effect_exact"]).abs()
    assert (row["miss_layer"][0], row["miss_head"][0]) == miss.idxmax()
    assert row["max_abs_miss"] == pytest.approx(miss.max(), abs=1e-12)
    assert row["n_examples"] == n_eval and row["task"] == "sva" and row["seed"] == 42

    meta = read_parquet_metadata(outs["agreement"])
    assert meta["analysis"] == "atp_agreement" and meta["analysis_split"] == "evaluation"
    assert meta["checkpoint_sha256"] == sha256_file(run["checkpoint"])
    assert meta["effects_sha256"] == sha256_file(effects)
    assert meta["patch_mode"] == "resample" and meta["task_dataset_sha256"] == "ab" * 32
    clean, ref = run["pairs"][:2]
    assert float(meta["clean_ld_max_abs_diff"]) <= patch_tolerance(run["model"], clean, ref)
    png = (tmp_path / "atp.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_stage_refuses_effects_of_another_task_or_without_its_split(tmp_path):
    run = make_run(tmp_path)
    effects = tmp_path / "effects.parquet"
    patch(run, effects, splits="discovery")
    argv, _ = run_args(run, tmp_path, effects)
    with pytest.raises(ValueError, match="no rows of split 'evaluation'"):
        atp_agreement_stage.main(argv)
    (tmp_path / "other").mkdir()  # the same checkpoint bytes, another task dataset
    other = make_run(tmp_path / "other", dataset_sha256="cd" * 32)
    patch(other, tmp_path / "other.parquet")
    argv, _ = run_args(run, tmp_path, tmp_path / "other.parquet", tag="x")
    with pytest.raises(ValueError, match="other.parquet: task_dataset_sha256"):
        atp_agreement_stage.main(argv)


def test_the_stage_estimates_the_patch_the_effects_made(tmp_path):
    """Effects patched with zero ablation: AtP takes the direction 0 − z (read from the
    effects file's patch_mode), not the reference prompt's."""
    run = make_run(tmp_path)
    effects = tmp_path / "zero.parquet"
    argv = ["--checkpoint", str(run["checkpoint"]), "--manifest", str(run["manifest"]),
            "--task", str(run["task"]), "--splits", "evaluation", "--batch-size", "3",
            "--max-rows", "4096",
            "--model-name", "learned", "--seed", "42", "--device", "cpu", "--mode", "zero",
            "--out", str(effects)]  # fmt: skip
    assert patch_heads.main(argv) == 0
    argv, outs = run_args(run, tmp_path, effects)
    assert atp_agreement_stage.main(argv) == 0
    examples = pq.read_table(outs["examples"]).to_pandas()
    first = SPLIT_SIZES["discovery"] + SPLIT_SIZES["validation"]
    chosen = slice(first, first + SPLIT_SIZES["evaluation"])
    pairs = [list(x)[chosen] for x in run["pairs"]]
    cfg = run["model"].cfg
    zero = torch.zeros(cfg.n_layer, cfg.n_head, cfg.d_head)
    for replacement, equal in ((zero, True), (None, False)):
        clean_ld, estimate = attribution_patch(run["model"], *pairs, 2, replacement=replacement)
        want = (clean_ld[:, None, None] - estimate).reshape(-1)
        assert np.allclose(examples["effect_atp"], want, rtol=0, atol=1e-12) is equal
    assert read_parquet_metadata(outs["agreement"])["patch_mode"] == "zero"
