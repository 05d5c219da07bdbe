"""The edge-patching engine (docs §15.1) against an independent naive float64 hook
implementation on random tiny models of every geometry the registry marks ``edge_patching``:
relative error ≤ 1e-3 where KL ≥ 1e-9, absolute ≤ 1e-12 below, never negative; in float32
within a rounding floor derived from float32's eps and the logit scale. Also: the KL by hand,
its float64 floor, Table 7's examples (the first of each condition in canonical order) and
their record in the stage's output, an edge whose writer is orthogonal to a block reader's
block has KL exactly 0, and the paper-shape edge counts."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from scipy.special import rel_entr

from headgeom.analysis import edges as E
from headgeom.data.task_files import TaskSplits, first_per_condition
from headgeom.hashing import sha256_file
from headgeom.io import write_json, write_parquet
from headgeom.model import registry, zoo
from headgeom.model.checkpoint import save_checkpoint
from tests.scripts import load_script
from tests.unit.test_patching import TASK_SCHEMA
from tests.unit.test_patching_fast import multiscreen_model, perturbed, random_pairs

TINY = dict(n_layer=3, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16, init_std=0.5)
TINY_ROUTED = dict(n_layer=3, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16, init_std=0.5)
N_VOCAB = 29
#: Every geometry of an architecture with Q/K/V readers and the KV-prefix forward.
EDGE_GEOMETRIES = sorted(
    g
    for arch in registry.ARCHITECTURES.values()
    if arch.edge_patching
    for g in registry.geometry_names(arch.name)
)


def zoo_model(geometry: str, seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    arch = TINY_ROUTED if geometry.startswith("write-routed") else TINY
    model = registry.build_model(zoo.derive_model_config(geometry, arch, {}), N_VOCAB)
    return perturbed(model, seed).to(dtype)


# --------------------------------------------------------------------------- naive reference
def _softmax(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), -1).numpy()


@torch.no_grad()
def naive_edge_kl(model, clean_ids, ref_ids, edges: E.Edges):
    """(KL, S) (N, E) in float64 by the definition, through the model's named sites only:
    δ_i = (attention output with writer i's z from the reference) − (clean attention output);
    the reader's q/k/v on x + δ_i are read off a forward whose ``hook_resid_pre`` at l' is
    replaced by x + δ_i; then a clean forward with head h' of ``attn.hook_{x}`` at l' set to
    that value. KL = Σ rel_entr(p, q) of the softmax probabilities (scipy).
    S = ‖q − p‖₁ + Σ_v p_v |log(p_v/q_v) − KL| is the KL's first-order sensitivity to
    logit errors (for the float32 floor)."""
    model = copy.deepcopy(model).double()
    L = model.cfg.n_layer
    kl = np.full((len(clean_ids), len(edges)), np.nan)
    sens = np.full_like(kl, np.nan)
    lengths = np.array([len(c) for c in clean_ids])
    for T in np.unique(lengths):
        rows = np.flatnonzero(lengths == T)
        clean = torch.as_tensor(np.stack([clean_ids[i] for i in rows]))
        ref = torch.as_tensor(np.stack([ref_ids[i] for i in rows]))
        names = [
            f"blocks.{lay}.{s}" for lay in range(L) for s in ("hook_resid_pre", "hook_attn_out")
        ]
        logits, cc = model.run_with_cache(clean, names, last_only=True)
        p = _softmax(logits)
        _, rc = model.run_with_cache(ref, [f"blocks.{lay}.attn.hook_z" for lay in range(L)])
        deltas, reads = {}, {}
        for n, (wl, wh, rl, rh, x) in enumerate(
            zip(*(a.tolist() for a in edges.arrays()), strict=True)
        ):
            if (wl, wh) not in deltas:

                def from_ref(z, wl=wl, wh=wh, rc=rc):
                    z = z.clone()
                    z[:, :, wh] = rc[f"blocks.{wl}.attn.hook_z"][:, :, wh]
                    return z

                out = f"blocks.{wl}.hook_attn_out"
                with model.hooks({f"blocks.{wl}.attn.hook_z": from_ref}):
                    _, c2 = model.run_with_cache(clean, [out])
                deltas[(wl, wh)] = c2[out] - cc[out]
            if (wl, wh, rl) not in reads:
                moved = cc[f"blocks.{rl}.hook_resid_pre"] + deltas[(wl, wh)]
                qkv = [f"blocks.{rl}.attn.hook_{s}" for s in "qkv"]
                with model.hooks({f"blocks.{rl}.hook_resid_pre": lambda t, m=moved: m}):
                    _, c3 = model.run_with_cache(clean, qkv)
                reads[(wl, wh, rl)] = [c3[s] for s in qkv]
            value = reads[(wl, wh, rl)][x]

            def swap(t, value=value, rh=rh):
                t = t.clone()
                t[:, :, rh] = value[:, :, rh]
                return t

            with model.hooks({f"blocks.{rl}.attn.hook_{'qkv'[x]}": swap}):
                q = _softmax(model(clean, last_only=True))
            k = rel_entr(p, q).sum(-1)
            kl[rows, n] = k
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(p > 0, np.log(p / q), 0.0)
            sens[rows, n] = np.abs(q - p).sum(-1) + (p * np.abs(r - k[:, None])).sum(-1)
    return kl, sens


def float32_floor(model, sens: np.ndarray) -> np.ndarray:
    """|KL₃₂ − KL| ≤ δ·S + 2δ² + 1e-13 per (example, edge), derived here:

    * δ bounds the float32 rounding of a logit b_v = w_v·h. Its scale is ‖h‖·max‖w_v‖ ≥ |b_v|
      (Cauchy–Schwarz), ‖h‖ ≤ √D·max|γ| + ‖β‖ (final LayerNorm, ‖normalised x‖ ≤ √D); each
      of the L blocks and the unembedding adds a few eps of that scale (LayerNorm
      renormalises, so errors add rather than compound): δ = 4·(L + 1)·eps₃₂·scale (measured
      ≤ 3.1·eps₃₂·scale on these models, so a 5× margin);
    * to first order KL moves by δ·S (∂KL/∂b = q − p, ∂KL/∂a = p ⊙ (log p/q − KL)), and where
      P = Q by ½·Var_p(α − β) ≤ 2δ²; 1e-13 covers both sides' float64 summation."""
    ln, w = model.ln_f, model.wte.weight.detach().double()
    gamma, beta = ln.weight.detach().double(), ln.bias.detach().double()
    h_norm = model.cfg.d_model**0.5 * gamma.abs().max() + beta.norm()
    scale = float(h_norm * w.norm(dim=-1).max())
    delta = 4 * (model.cfg.n_layer + 1) * np.finfo(np.float32).eps * scale
    return delta * sens + 2 * delta**2 + 1e-13


def assert_exact(fast: np.ndarray, ref: np.ndarray) -> None:
    """Relative error ≤ 1e-3 where the reference KL ≥ 1e-9, absolute ≤ 1e-12 below."""
    big = ref >= 1e-9
    np.testing.assert_array_less(np.abs(fast - ref)[big], 1e-3 * ref[big])
    np.testing.assert_array_less(np.abs(fast - ref)[~big], 1e-12)


# --------------------------------------------------------------------------- tests
def test_kl_by_hand_and_its_float64_floor():
    # P = (1/2, 1/2), Q = softmax(0, log 3) = (1/4, 3/4): KL = ½ log 2 + ½ log(2/3) = ½ log(4/3)
    clean = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    logits = torch.tensor([[0.0, np.log(3.0)]], dtype=torch.float32)
    assert float(E.kl_from_logits(clean, logits)[0]) == pytest.approx(0.5 * np.log(4 / 3), 1e-7)
    # the same distribution, logits shifted: rounding only, in [0, floor], never negative
    gen = torch.Generator().manual_seed(0)
    a = 10 * torch.randn(64, 500, generator=gen, dtype=torch.float64)
    kl = E.kl_from_logits(torch.log_softmax(a, -1), a + 1000.0)
    assert (kl >= 0).all() and kl.max() < 1e-12
    # a "distribution" that does not sum to 1 is refused, not clamped
    with pytest.raises(ArithmeticError, match="summation floor"):
        E.kl_from_logits(torch.log_softmax(a, -1) - 1e-6, a)


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


@pytest.mark.parametrize("geometry", EDGE_GEOMETRIES)
def test_engine_equals_the_definition_in_float64_and_float32(geometry):
    model = zoo_model(geometry)
    pairs = random_pairs(4, (5, 7))[:2]
    edges = E.all_edges(model.cfg.n_layer, model.cfg.n_head)
    ref, sens = naive_edge_kl(model, *pairs, edges)
    # not vacuous: all-common-axis has 3 in 4 edges exactly 0, all-rotated small writes
    assert (ref >= 1e-9).mean() > 0.2 and ref.max() > 1e-4
    fast = E.edge_kl(model, *pairs, edges, batch_size=4, max_rows=40)  # many chunks
    assert fast.shape == (4, len(edges)) and fast.dtype == np.float64
    assert (fast >= 0).all()
    assert_exact(fast, ref)
    fast32 = E.edge_kl(model.float(), *pairs, edges, batch_size=4, max_rows=40)
    assert (fast32 >= 0).all()
    floor = float32_floor(model, sens)
    np.testing.assert_array_less(np.abs(fast32 - ref), floor)
    big = ref > 1e-6
    assert np.median(floor[big] / ref[big]) < 0.1  # the floor is not vacuous (1–6% here)


def test_library_naive_engine_equals_the_fast_one():
    # edge_kl_naive (the benchmarks' reference), full forward and resumed
    model = zoo_model("value384")
    pairs = random_pairs(4, (5, 7))[:2]
    edges = E.all_edges(3, 4)
    fast = E.edge_kl(model, *pairs, edges)
    for resume in (False, True):
        naive = E.edge_kl_naive(model, *pairs, edges, resume=resume, batch_size=3)
        assert_exact(naive, fast)


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
    with pytest.raises(ValueError, match="edge_patching"):
        E.edge_kl(model, *random_pairs(2, (5,))[:2])


def test_table7_examples_are_the_first_of_each_condition_in_canonical_order():
    # file order is not canonical order; one discovery row must be ignored
    rows = [(13, "SS"), (10, "SP"), (11, "SS"), (12, "PP"), (14, "PS"), (15, "SS"), (16, "SP"),
            (17, "PP"), (18, "PS"), (19, "PP")]  # fmt: skip
    frame = pd.DataFrame(
        [{"example_id": i, "split": "validation", "condition": c} for i, c in rows]
        + [{"example_id": 1, "split": "discovery", "condition": "PP"}]
    )
    task = TaskSplits(frame, None, "d", "f", "sva")
    # by hand: canonical SP 10, SS 11, PP 12, SS 13, PS 14, SS 15, SP 16, PP 17, PS 18, PP 19
    pick = first_per_condition(task, "validation", 8, "sva.parquet")
    assert pick["example_id"].tolist() == [10, 11, 12, 13, 14, 16, 17, 18]
    assert pick["condition"].value_counts().to_dict() == {"SS": 2, "SP": 2, "PP": 2, "PS": 2}
    pick = first_per_condition(task, "validation", 4, "sva.parquet")
    assert pick["example_id"].tolist() == [10, 11, 12, 14]
    with pytest.raises(ValueError, match=r"sva.parquet: split 'validation' .* \['PS', 'SP'\]"):
        first_per_condition(task, "validation", 12, "sva.parquet")  # SP and PS have 2
    with pytest.raises(ValueError, match="6 examples cannot be split evenly over the 4"):
        first_per_condition(task, "validation", 6, "sva.parquet")
    odd = TaskSplits(frame.replace({"SS": "XX"}), None, "d", "f", "sva")
    with pytest.raises(ValueError, match=r"conditions \['XX'\] not in"):
        first_per_condition(odd, "validation", 4, "sva.parquet")


def test_stage_uses_the_first_per_condition_and_records_them(tmp_path):
    model = zoo_model("learned", dtype=torch.float32)
    vocab = np.arange(N_VOCAB, dtype=np.int64) * 7 + 100  # model id i <-> GPT-2 id vocab[i]
    save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    write_json(
        tmp_path / "m.json",
        {
            "checkpoint_file_sha256": sha256_file(tmp_path / "m.safetensors"),
            "model_name": "learned",
            "init_seed": 42,
        },
    )
    clean, ref = random_pairs(10, (6,), seed=5)[:2]
    conditions = ["SS", "SS", "SP", "PP", "SS", "PS", "SP", "PP", "PS", "PS"]  # ids 0..9
    table = {
        "example_id": list(range(10)),
        "split": ["validation"] * 10,
        "condition": conditions,
        "lexical_group": ["g"] * 10,
        "clean_ids": [vocab[x].tolist() for x in clean],
        "ref_ids": [vocab[x].tolist() for x in ref],
        "diff_position": [0] * 10,
        "correct_id": [int(vocab[0])] * 10,
        "incorrect_id": [int(vocab[1])] * 10,
    }
    write_parquet(
        tmp_path / "sva.parquet",
        pa.table(table).cast(TASK_SCHEMA),
        TASK_SCHEMA,
        metadata={"dataset_sha256": "ab" * 32, "task": "sva"},
    )
    out = {k: tmp_path / f"{k}.parquet" for k in ("edges", "summary", "acdc")}
    argv = ["--checkpoint", str(tmp_path / "m.safetensors"), "--manifest", str(tmp_path / "m.json"),
            "--task", str(tmp_path / "sva.parquet"), "--n-examples", "8", "--device", "cpu",
            "--out-edges", str(out["edges"]), "--out-summary", str(out["summary"]),
            "--out-acdc", str(out["acdc"]), "--acdc-threshold", "0.01"]  # fmt: skip
    assert load_script("edges").main(argv) == 0
    meta = {k.decode(): v.decode() for k, v in pq.read_metadata(out["edges"]).metadata.items()}
    # by hand: SS 0, 1; SP 2, 6; PP 3, 7; PS 5, 8 (SS 4 and PS 9 are third of theirs)
    assert json.loads(meta["example_ids"]) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert json.loads(meta["examples_per_condition"]) == {"SS": 2, "SP": 2, "PP": 2, "PS": 2}
    assert meta["dtype"] == "float64"  # strings are stored as they are
    edges = pq.read_table(out["edges"]).to_pandas()
    assert len(edges) == E.edge_count(3, 4) and (edges["kl"] >= 0).all()
    # the stage's KLs are the engine's on those examples in float64
    pick = [0, 1, 2, 3, 5, 6, 7, 8]
    kl = E.edge_kl(model.double(), [clean[i] for i in pick], [ref[i] for i in pick])
    np.testing.assert_allclose(edges["kl"], kl.mean(0), rtol=1e-12, atol=0)
    acdc_meta = pq.read_metadata(out["acdc"]).metadata
    assert 0 <= json.loads(acdc_meta[b"check_decisions_max_residual_over_tolerance"]) <= 1
    assert json.loads(acdc_meta[b"example_ids"]) == pick
