"""Single-head patching, the real patch perturbation δ and the patching/leakage/lanes scripts
(docs §10.1, §11.2–11.3; checks C8, C9)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom.hashing import ManifestMismatchError, content_hash, sha256_file
from headgeom.heads.analysis.batching import length_batches
from headgeom.heads.analysis.leakage import C8_STAGES
from headgeom.heads.analysis.patching import (
    delta_patch_layer,
    logit_difference,
    patch_all_heads,
    patch_perturbations,
    perturbation_check,
)
from headgeom.heads.analysis.tolerance import model_dtype, rounding_tolerance
from headgeom.heads.stages import concentration as concentration_stage
from headgeom.heads.stages import lanes as lanes_stage
from headgeom.heads.stages import leakage as leakage_stage
from headgeom.heads.stages import patch_heads
from headgeom.io import (
    IntegrityError,
    read_parquet_metadata,
    write_manifest,
    write_parquet,
)
from headgeom.model.checkpoint import save_checkpoint
from headgeom.model.gpt import GPT, site
from tests.helpers import models
from tests.helpers.examples import TASK_SCHEMA
from tests.helpers.models import small_gpt
from tests.tolerances import patch_tolerance

GEOMETRIES = ("learned", "write-common-axis")
N_LAYER, N_HEAD, N_VOCAB = models.L, models.H, 48


def tiny_model(geometry: str, seed: int = 0) -> GPT:
    """A small random GPT whose weights are large enough that every head matters."""
    return small_gpt(geometry, seed, N_VOCAB)


def random_pairs(n: int, lengths: tuple[int, ...], seed: int = 1):
    """Clean/reference prompts (model ids) differing in one token, plus answers."""
    rng = np.random.default_rng(seed)
    clean, ref, diff = [], [], []
    for i in range(n):
        T = lengths[i % len(lengths)]
        x = rng.integers(0, N_VOCAB, T)
        t = int(rng.integers(0, T - 1))
        y = x.copy()
        y[t] = (x[t] + 1 + rng.integers(0, N_VOCAB - 1)) % N_VOCAB
        clean.append(x)
        ref.append(y)
        diff.append(t)
    correct = rng.integers(0, N_VOCAB, n)
    incorrect = (correct + 1 + rng.integers(0, N_VOCAB - 1, n)) % N_VOCAB
    return clean, ref, correct, incorrect, diff


def manual_forward(model: GPT, ids, correct, incorrect, patch=None):
    """An independent forward for one example: explicit causal softmax attention and W_O
    applied head by head from ``write_maps()``, not the model's forward or hooks.

    ``patch = (layer, head, z)`` replaces that head's output by ``z`` (position, d_head).
    Returns the logit difference and every layer's z (position, head, d_head).
    """
    cfg = model.cfg
    ids = torch.as_tensor(ids)
    T = len(ids)
    x = (model.wte(ids) + model.wpe(torch.arange(T))).double()
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    zs = []
    for layer, block in enumerate(model.blocks):
        q, k, v = (a[0].double() for a in block.attn.reader(x[None].float()))  # (T, H, d)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(cfg.d_head)
        z = torch.einsum("hts,shd->thd", scores.masked_fill(~mask, -math.inf).softmax(-1), v)
        if patch is not None and patch[0] == layer:
            z = z.clone()
            z[:, patch[1]] = patch[2]
        zs.append(z)
        W = block.attn.writer.write_maps().double()  # (H, D, d)
        bias = block.attn.writer(torch.zeros(1, 1, cfg.n_head, cfg.d_head))[0, 0].double()
        x = x + torch.einsum("hDd,thd->tD", W, z) + bias
        x = x + block.mlp(block.ln_2(x.float())).double()
    logits = model.ln_f(x[-1].float()) @ model.wte.weight.T
    return float(logits[correct] - logits[incorrect]), zs


# --------------------------------------------------------------------------- library
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_identical_prompts_give_zero_effect(geometry):
    model = tiny_model(geometry)
    clean, _, correct, incorrect, _ = random_pairs(5, (6, 7))
    clean_ld, patched = patch_all_heads(model, clean, clean, correct, incorrect, batch_size=3)
    assert patched.shape == (5, N_LAYER, N_HEAD)
    np.testing.assert_allclose(
        patched, np.broadcast_to(clean_ld[:, None, None], patched.shape), atol=1e-12
    )


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_effects_match_an_independent_forward(geometry):
    model = tiny_model(geometry)
    clean, ref, correct, incorrect, _ = random_pairs(3, (7,))
    clean_ld, patched = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=2)
    effects = clean_ld[:, None, None] - patched
    assert np.abs(effects).max() > 1e-2  # the fixture's heads matter
    tol = patch_tolerance(model, clean, ref)  # routes part at the embeddings: L + 1 stages
    with torch.no_grad():
        for x in range(3):
            answers = (correct[x], incorrect[x])
            _, ref_z = manual_forward(model, ref[x], *answers)
            clean_manual, _ = manual_forward(model, clean[x], *answers)
            assert clean_ld[x] == pytest.approx(clean_manual, abs=tol)
            for layer in range(N_LAYER):
                for head in range(N_HEAD):
                    patch = (layer, head, ref_z[layer][:, head])
                    expected, _ = manual_forward(model, clean[x], *answers, patch)
                    assert patched[x, layer, head] == pytest.approx(expected, abs=tol)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_delta_route_and_check_c8(geometry):
    """Adding δ_i to the clean attention output reproduces the z patch (C8, C9)."""
    model = tiny_model(geometry)
    clean, ref, correct, incorrect, _ = random_pairs(4, (6,))
    clean_ld, patched = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=4)
    c, r = torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    # C9: the δ route and the z patch part at block 0 at the latest: L + 1 stages at the
    # largest |logit|
    c9_tol = patch_tolerance(model, c, r)
    for layer in range(N_LAYER):
        delta, drops, c8 = delta_patch_layer(
            model, c, r, torch.as_tensor(correct), torch.as_tensor(incorrect), layer
        )
        assert delta.shape == (4, 6, N_HEAD, model.cfg.d_model)
        assert delta.dtype == torch.float64
        # C8: two rounded W_O sums at the largest |attention output| of the layer
        with torch.no_grad():
            _, cache = model.run_with_cache(c, [site(layer, "hook_attn_out")])
        scale = float(cache[site(layer, "hook_attn_out")].abs().max())
        assert c8 <= rounding_tolerance(model_dtype(model), scale, C8_STAGES)
        assert perturbation_check(model, c, r, layer) == pytest.approx(c8, abs=1e-12)
        np.testing.assert_allclose(
            drops.numpy(), clean_ld[:, None] - patched[:, layer], rtol=0, atol=c9_tol
        )
        # δ_i lies in Im W_O^i
        W = model.blocks[layer].attn.writer.write_maps().detach().double()
        for head in range(N_HEAD):
            rows = delta[:, :, head].reshape(-1, model.cfg.d_model).T
            coef = torch.linalg.lstsq(W[head], rows).solution
            assert torch.allclose(W[head] @ coef, rows, atol=1e-9)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_positions_before_the_differing_token_have_zero_delta(geometry):
    model = tiny_model(geometry)
    clean, ref, _, _, diff = random_pairs(6, (8,), seed=3)
    c, r = torch.as_tensor(np.stack(clean)), torch.as_tensor(np.stack(ref))
    delta = patch_perturbations(model, c, r, layer=0)
    for x, t in enumerate(diff):
        assert torch.all(delta[x, :t] == 0)  # causality: identical prefixes
        assert delta[x, t].abs().max() > 1e-6  # the differing token itself moves every head
    # later layers see the same prefix too
    assert torch.all(patch_perturbations(model, c, r, layer=2)[0, : diff[0]] == 0)


def test_batching_and_mixed_lengths_do_not_change_results():
    model = tiny_model("learned")
    clean, ref, correct, incorrect, _ = random_pairs(7, (5, 8, 6))
    one = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=1)
    many = patch_all_heads(model, clean, ref, correct, incorrect, batch_size=16)
    tol = patch_tolerance(model, clean, ref)  # other batches part at block 0: L + 1 stages
    for a, b in zip(one, many, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)
    # order is the input order: example 0 alone gives its own row
    alone = patch_all_heads(model, clean[:1], ref[:1], correct[:1], incorrect[:1], batch_size=1)
    np.testing.assert_allclose(alone[1][0], many[1][0], rtol=0, atol=tol)


def test_length_batches_and_input_checks():
    batches = length_batches([3, 5, 3, 3, 5], batch_size=2)
    assert [b.tolist() for b in batches] == [[0, 2], [3], [1, 4]]
    model = tiny_model("learned")
    with pytest.raises(ValueError, match="equal length"):
        patch_all_heads(model, [np.arange(4)], [np.arange(5)], [0], [1], batch_size=1)
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    assert logit_difference(logits, torch.tensor([1]), torch.tensor([2])).item() == 3.0


# --------------------------------------------------------------------------- scripts
SPLIT_SIZES = {"discovery": 4, "validation": 3, "evaluation": 4, "holdout": 2}


def fixture_pairs():
    """The fixture task's prompts (model ids), every split's examples."""
    return random_pairs(sum(SPLIT_SIZES.values()), (6, 7), seed=11)


def fixture_tolerance(geometry: str = "learned") -> float:
    """Tolerance of two routes (engines, δ against z patches) to the fixture's logit
    differences: they part at block 0, so L + 1 stages at the largest |logit| of any of its
    prompts."""
    clean, ref = fixture_pairs()[:2]
    return patch_tolerance(tiny_model(geometry), clean, ref)


def make_fixture(tmp_path: Path, geometry: str = "learned") -> dict[str, Path]:
    """Checkpoint + manifest + task Parquet (GPT-2 ids through a compacted vocabulary)."""
    vocab = np.arange(N_VOCAB, dtype=np.int64) * 7 + 100  # model id i <-> GPT-2 id vocab[i]
    model = tiny_model(geometry)
    checkpoint = tmp_path / "model.safetensors"
    save_checkpoint(checkpoint, model, vocab)
    manifest = tmp_path / "manifest.json"
    write_manifest(
        manifest, {"config_id": geometry, "checkpoint_file_sha256": sha256_file(checkpoint)}
    )
    n = sum(SPLIT_SIZES.values())
    clean, ref, correct, incorrect, diff = fixture_pairs()
    splits = [s for s, k in SPLIT_SIZES.items() for _ in range(k)]
    table = {
        "example_id": list(range(n)),
        "split": splits,
        "condition": [["SS", "SP", "PS", "PP"][i % 4] for i in range(n)],
        "lexical_group": [f"g{i % 2}" for i in range(n)],
        "clean_ids": [vocab[x].tolist() for x in clean],
        "ref_ids": [vocab[x].tolist() for x in ref],
        "diff_position": diff,
        "correct_id": vocab[correct].tolist(),
        "incorrect_id": vocab[incorrect].tolist(),
    }
    task = tmp_path / "sva.parquet"
    write_parquet(
        task, pa.table(table).cast(TASK_SCHEMA), TASK_SCHEMA, metadata={"dataset_sha256": "ab" * 32}
    )
    return {"checkpoint": checkpoint, "manifest": manifest, "task": task}


def run_patch_heads(paths, out: Path, splits="discovery,validation,evaluation"):
    return patch_heads.main(
        [
            "--checkpoint",
            str(paths["checkpoint"]),
            "--manifest",
            str(paths["manifest"]),
            "--task",
            str(paths["task"]),
            "--splits",
            splits,
            "--batch-size",
            "3",
            "--max-rows",
            "4096",
            "--mode",
            "resample",
            "--model-name",
            "learned",
            "--seed",
            "42",
            "--task-name",
            "sva",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )


def test_patch_heads_takes_every_task_of_a_run_in_one_job(tmp_path):
    """One job per run (the workflow's granularity): each task file's effects equal those of
    a job given that file alone, the task named by the file; counts that differ are named."""
    paths = make_fixture(tmp_path)
    quote = tmp_path / "quote.parquet"  # the same examples under a second task's name
    table = pq.read_table(paths["task"]).cast(TASK_SCHEMA)
    meta = {"dataset_sha256": "cd" * 32, "task": "quote"}
    write_parquet(quote, table, TASK_SCHEMA, metadata=meta)
    base = ["--checkpoint", str(paths["checkpoint"]), "--manifest", str(paths["manifest"]),
            "--splits", "discovery,evaluation", "--batch-size", "3", "--max-rows", "4096",
            "--mode", "resample", "--model-name", "learned", "--seed", "42",
            "--device", "cpu"]  # fmt: skip
    script = patch_heads
    alone = {t: tmp_path / f"alone-{t}.parquet" for t in ("sva", "quote")}
    for task_file, out in zip((paths["task"], quote), alone.values(), strict=True):
        assert script.main([*base, "--task", str(task_file), "--out", str(out)]) == 0
    both = {t: tmp_path / f"both-{t}.parquet" for t in ("sva", "quote")}
    argv = [*base, "--task", str(paths["task"]), str(quote), "--out", *map(str, both.values())]
    assert script.main(argv) == 0
    for task in ("sva", "quote"):
        a, b = (pq.read_table(f[task]) for f in (alone, both))
        assert a.num_rows > 0 and a.equals(b), task
        assert set(a.column("task").to_pylist()) == {task}
    with pytest.raises(SystemExit):  # two task files, one output
        script.main([*base, "--task", str(paths["task"]), str(quote), "--out", str(alone["sva"])])
    # leakage, one job per run too: each task's file that of a job given that task alone
    leakage = leakage_stage
    common = ["--checkpoint", str(paths["checkpoint"]), "--manifest", str(paths["manifest"]),
              "--split", "evaluation", "--batch-size", "2", "--device", "cpu"]  # fmt: skip
    tasks = {"sva": paths["task"], "quote": quote}
    one = {t: tmp_path / f"leak-alone-{t}.parquet" for t in tasks}
    for t, task_file in tasks.items():
        argv = ["--task", str(task_file), "--effects", str(alone[t]), "--out", str(one[t])]
        assert leakage.main([*common, *argv]) == 0
    two = {t: tmp_path / f"leak-both-{t}.parquet" for t in tasks}
    argv = ["--task", *map(str, tasks.values()), "--effects", *(str(both[t]) for t in tasks),
            "--out", *map(str, two.values())]  # fmt: skip
    assert leakage.main([*common, *argv]) == 0
    for t in tasks:
        a, b = pq.read_table(one[t]), pq.read_table(two[t])
        assert a.num_rows > 0 and a.equals(b), t
        assert read_parquet_metadata(two[t])["effects_sha256"] == sha256_file(both[t])
    with pytest.raises(SystemExit):  # two tasks, one effects file
        leakage.main([*common, "--task", *map(str, tasks.values()), "--effects", str(both["sva"]),
                      "--out", *map(str, two.values())])  # fmt: skip


def leakage_row_count() -> int:
    return sum(N_HEAD * (N_LAYER - 1 - l) * N_HEAD * 3 for l in range(N_LAYER))  # noqa: E741


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_scripts_end_to_end(tmp_path, geometry):
    paths = make_fixture(tmp_path, geometry)
    effects_path = tmp_path / "effects.parquet"
    assert run_patch_heads(paths, effects_path) == 0
    effects = pq.read_table(effects_path).to_pandas()
    n_examples = SPLIT_SIZES["discovery"] + SPLIT_SIZES["validation"] + SPLIT_SIZES["evaluation"]
    assert len(effects) == n_examples * N_LAYER * N_HEAD
    assert list(effects.columns) == [
        "model",
        "seed",
        "task",
        "split",
        "example_id",
        "condition",
        "lexical_group",
        "layer",
        "head",
        "clean_ld",
        "patched_ld",
        "effect",
    ]
    assert set(effects["split"]) == {"discovery", "validation", "evaluation"}
    np.testing.assert_allclose(effects["effect"], effects["clean_ld"] - effects["patched_ld"])
    meta = read_parquet_metadata(effects_path)
    assert meta["checkpoint_sha256"] == sha256_file(paths["checkpoint"])
    assert meta["task_dataset_sha256"] == "ab" * 32
    assert json.loads(meta["splits"]) == ["discovery", "validation", "evaluation"]
    assert len(meta["manifest_content_hash"]) == 64

    summary_path, heads_path = tmp_path / "summary.parquet", tmp_path / "heads.parquet"
    concentration = concentration_stage
    argv = ["--effects", str(effects_path), "--split", "evaluation", "--n-bootstrap", "2000",
            "--n-permutations", "5000", "--ci", "0.95", "--index-meaningful", "true",
            "--out-summary", str(summary_path)]  # fmt: skip
    assert concentration.main([*argv, "--out-heads", str(heads_path)]) == 0
    summary = pq.read_table(summary_path).to_pandas()
    heads = pq.read_table(heads_path).to_pandas()
    assert len(summary) == 3 and len(heads) == 3 * N_LAYER * N_HEAD
    assert list(heads.columns) == ["model", "seed", "task", "split", "layer", "head", "e", "p"]
    assert list(summary.columns) == [
        "model",
        "seed",
        "task",
        "split",
        "n_examples",
        "E",
        "N_eff",
        "top_head_share",
        "top_layer",
        "top_head",
        "N_index",
        "N_layer_given_index",
    ]
    means = effects.groupby(["split", "layer", "head"])["effect"].mean()
    got = heads.set_index(["split", "layer", "head"])["e"]
    np.testing.assert_allclose(got.loc[means.index], means, atol=1e-12)  # check C10
    ev = summary.set_index("split").loc["evaluation"]
    assert ev["n_examples"] == SPLIT_SIZES["evaluation"]
    assert ev["N_eff"] == pytest.approx(ev["N_index"] * ev["N_layer_given_index"], rel=1e-9)
    assert read_parquet_metadata(summary_path)["effects_sha256"] == sha256_file(effects_path)

    leakage_path = tmp_path / "leakage.parquet"
    leakage = leakage_stage
    assert (
        leakage.main(
            [
                "--checkpoint",
                str(paths["checkpoint"]),
                "--manifest",
                str(paths["manifest"]),
                "--task",
                str(paths["task"]),
                "--effects",
                str(effects_path),
                "--split",
                "evaluation",
                "--batch-size",
                "2",
                "--device",
                "cpu",
                "--out",
                str(leakage_path),
            ]
        )
        == 0
    )
    leak = pq.read_table(leakage_path).to_pandas()
    assert len(leak) == leakage_row_count()
    assert {
        "source_layer",
        "source_head",
        "reader_layer",
        "reader_head",
        "read_type",
        "leakage",
        "rho",
        "leakage_over_rho",
        "pk",
    } <= set(leak.columns)
    assert (leak["reader_layer"] > leak["source_layer"]).all()
    assert leak["leakage"].between(0, 1).all() and leak["rho"].between(0, 1).all()
    np.testing.assert_allclose(leak["leakage_over_rho"], leak["leakage"] / leak["rho"])
    np.testing.assert_allclose(leak["rho"], leak["pk"] / leak["write_dim"])
    lmeta = read_parquet_metadata(leakage_path)
    # C8 and C9 within the tolerances the job derived and recorded; C9's is at most the
    # derivation at the largest |logit| of any fixture prompt, C8's far below the effects
    for check in ("C8", "C9"):
        residual = float(lmeta[f"check_{check}_max_abs_residual"])
        assert residual <= float(lmeta[f"check_{check}_tolerance"]), check
    assert float(lmeta["check_C9_tolerance"]) <= fixture_tolerance(geometry)
    assert float(lmeta["check_C8_tolerance"]) < 1e-3 * effects["effect"].abs().max()
    assert lmeta["model"] == "learned" and json.loads(lmeta["seed"]) == 42

    lanes_path = tmp_path / "lanes.parquet"
    lanes = lanes_stage
    argv = ["--heads", str(heads_path), "--split", "discovery", "--n-permutations", "200"]
    assert lanes.main([*argv, "--seed", "7", "--out", str(lanes_path)]) == 0
    lane = pq.read_table(lanes_path).to_pandas()
    assert len(lane) == 1
    assert list(lane.columns) == [
        "model",
        "seed",
        "task",
        "split",
        "lambda_score",
        "p_value",
        "n_permutations",
        "permutation_seed",
        "chance",
        "n_layers",
        "n_heads",
    ]
    row = lane.iloc[0]
    assert row["chance"] == 1 / N_HEAD and row["n_layers"] == N_LAYER
    if not np.isnan(row["lambda_score"]):
        assert 1 / 201 <= row["p_value"] <= 1


def test_patch_heads_patches_the_splits_it_is_given_and_names_the_manifest(tmp_path, capsys):
    """--splits names every split patched (the holdout too when listed, per example), the
    stage has no default of its own (the rule passes config patching.splits); the file names
    the checkpoint and its manifest; both engines write the same effects."""
    paths = make_fixture(tmp_path)
    argv = ["--checkpoint", str(paths["checkpoint"]), "--manifest", str(paths["manifest"])]
    argv += ["--task", str(paths["task"]), "--model-name", "learned", "--seed", "42"]
    argv += ["--task-name", "sva", "--device", "cpu", "--max-rows", "5"]
    argv += ["--batch-size", "128", "--mode", "resample"]
    script = patch_heads
    with pytest.raises(SystemExit):
        script.main([*argv, "--out", str(tmp_path / "none.parquet")])
    assert "required: --splits" in capsys.readouterr().err
    argv += ["--splits", ",".join(SPLIT_SIZES)]
    fast, plain = tmp_path / "fast.parquet", tmp_path / "plain.parquet"
    assert script.main([*argv, "--out", str(fast)]) == 0
    assert script.main([*argv, "--engine", "plain", "--out", str(plain)]) == 0
    effects = pq.read_table(fast).to_pandas()
    counts = effects.groupby("split", observed=True).size().to_dict()
    assert counts == {s: k * N_LAYER * N_HEAD for s, k in SPLIT_SIZES.items()}
    meta = read_parquet_metadata(fast)
    assert json.loads(meta["splits"]) == list(SPLIT_SIZES)
    record = json.loads(paths["manifest"].read_text())
    assert meta["manifest_content_hash"] == record.pop("record_sha256") == content_hash(record)
    assert "prefix" in meta["engine_paths"] and json.loads(meta["max_rows"]) == 5
    other = pq.read_table(plain).to_pandas()
    assert read_parquet_metadata(plain)["engine_paths"].startswith("plain")
    # the engines part at block 0: L + 1 stages at the largest |logit|
    np.testing.assert_allclose(effects["effect"], other["effect"], rtol=0, atol=fixture_tolerance())
    assert effects["effect"].abs().max() > 1e-2


def test_direct_leakage_into_a_reader_equals_the_manual_projection(tmp_path):
    """One (source, reader, X) leakage value recomputed from δ and the folded read map."""
    paths = make_fixture(tmp_path)
    effects_path, leakage_path = tmp_path / "effects.parquet", tmp_path / "leakage.parquet"
    run_patch_heads(paths, effects_path, splits="evaluation")
    argv = ["--checkpoint", str(paths["checkpoint"]), "--manifest", str(paths["manifest"])]
    argv += ["--task", str(paths["task"]), "--effects", str(effects_path), "--device", "cpu"]
    argv += ["--split", "evaluation"]
    leakage_stage.main([*argv, "--out", str(leakage_path)])
    leak = pq.read_table(leakage_path).to_pandas()
    value = leak.query(
        "source_layer == 0 and source_head == 1 and reader_layer == 2 "
        "and reader_head == 3 and read_type == 'K'"
    )["leakage"].item()

    model = tiny_model("learned")
    task = pq.read_table(paths["task"]).to_pandas()
    task = task[task["split"] == "evaluation"]
    vocab = np.arange(N_VOCAB) * 7 + 100
    rows = []
    for c, r in zip(task["clean_ids"], task["ref_ids"], strict=True):
        c, r = torch.as_tensor((c - 100) // 7)[None], torch.as_tensor((r - 100) // 7)[None]
        rows.append(patch_perturbations(model, c, r, 0)[0, :, 1])
    delta = torch.cat(rows).numpy()  # (Σ T, D)
    reader = model.blocks[2].attn.reader
    A = (reader.read_maps("K")[3].double() * reader.ln_1.weight.double()).detach().numpy()
    A = A - A.mean(axis=1, keepdims=True)  # W_K diag(γ) P_c
    projected = delta @ np.linalg.pinv(A) @ A  # P_R δ with R = Im Aᵀ
    assert vocab[1] == 107
    assert value == pytest.approx(np.sum(projected**2) / np.sum(delta**2), rel=1e-5)  # fp32 z


def test_wrong_checkpoint_byte_fails_before_any_output(tmp_path):
    paths = make_fixture(tmp_path)
    data = bytearray(paths["checkpoint"].read_bytes())
    data[-1] ^= 0x01
    paths["checkpoint"].write_bytes(bytes(data))
    out = tmp_path / "out" / "effects.parquet"
    with pytest.raises(ManifestMismatchError, match=str(paths["checkpoint"].name)):
        run_patch_heads(paths, out)
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_leakage_refuses_effects_of_another_task_and_block_readers(tmp_path):
    paths = make_fixture(tmp_path)
    effects_path = tmp_path / "effects.parquet"
    run_patch_heads(paths, effects_path, splits="evaluation")
    table = pq.read_table(effects_path)
    meta = dict(table.schema.metadata)
    meta[b"task_dataset_sha256"] = b"cd" * 32
    pq.write_table(table.replace_schema_metadata(meta), effects_path)
    leakage = leakage_stage
    argv = ["--checkpoint", str(paths["checkpoint"]), "--manifest", str(paths["manifest"])]
    argv += ["--task", str(paths["task"]), "--effects", str(effects_path), "--split", "evaluation"]
    out = tmp_path / "leakage.parquet"
    # edited by hand and rewritten without headgeom's writer: its footer has no digests
    with pytest.raises(IntegrityError, match="footer lacks"):
        leakage.main([*argv, "--out", str(out)])
    # written as another task's effects (a consistent file): the run check refuses it
    decoded = {k.decode(): v.decode() for k, v in meta.items()}
    write_parquet(effects_path, table, table.schema, decoded)
    with pytest.raises(ValueError, match="task_dataset_sha256"):
        leakage.main([*argv, "--out", str(out)])
    assert not out.exists()

    leakage.require_free_readers(tiny_model("learned"), "ckpt")  # a shared LN_1: accepted
    with pytest.raises(ValueError, match="free readers"):  # per-head block readers
        leakage.require_free_readers(tiny_model("all-rotated"), "ckpt")


def test_lanes_reports_null_when_undefined(tmp_path):
    heads = tmp_path / "heads.parquet"
    lanes = lanes_stage
    rows = {
        "model": ["m"] * 6,
        "seed": [1] * 6,
        "task": ["sva"] * 6,
        "split": ["discovery"] * 6,
        "layer": [0, 0, 1, 1, 2, 2],
        "head": [0, 1] * 3,
        "e": [-1.0, -2.0, 0.5, -1.0, -0.3, 0.0],
        "p": [0.1] * 6,
    }
    schema = pa.schema(
        [
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("split", pa.string()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("e", pa.float64()),
            ("p", pa.float64()),
        ]
    )
    write_parquet(heads, pa.table(rows).cast(schema), schema)
    out = tmp_path / "lanes.parquet"
    lane_args = ["--n-permutations", "5000", "--seed", "1", "--out", str(out)]
    assert lanes.main(["--heads", str(heads), "--split", "discovery", *lane_args]) == 0
    lane = pq.read_table(out).to_pylist()[0]
    assert lane["lambda_score"] is None and lane["p_value"] is None
    assert lane["chance"] == 0.5
    with pytest.raises(ValueError, match="split"):
        lanes.main(["--heads", str(heads), "--split", "evaluation", *lane_args])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
