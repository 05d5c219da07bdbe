"""The edge-patching engine (docs §15.1) against an independent naive float64 hook
implementation on random tiny models of every geometry the registry marks ``edge_patching``:
relative error ≤ 1e-3 where KL ≥ 1e-9, absolute ≤ 1e-12 below, never negative; in float32
within a rounding floor derived from float32's eps and the logit scale. Also: the KL by hand,
its float64 floor, Table 7's examples (the first of each condition in canonical order) and
their record in the stage's output, an edge whose writer is orthogonal to a block reader's
block has KL exactly 0, and the paper-shape edge counts."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headgeom.data.task_files import TaskSplits, first_per_condition
from headgeom.hashing import sha256_file
from headgeom.heads.analysis import edges as E
from headgeom.heads.stages import acdc as acdc_stage
from headgeom.heads.stages import edges as edges_stage
from headgeom.io import write_manifest, write_parquet
from headgeom.model.checkpoint import save_checkpoint
from tests.helpers.edges import (
    EDGE_GEOMETRIES,
    assert_exact,
    edge_model,
    float32_floor,
    naive_edge_kl,
)
from tests.helpers.examples import TASK_SCHEMA, random_pairs
from tests.helpers.models import N_VOCAB, multiscreen_model


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


def test_kl_of_rows_is_the_plain_kl_bit_for_bit():
    """The in-place, index_select KL of the engine's chunks (E.kl_of_rows) is
    kl_from_logits on the gathered rows, bit for bit (same operations on the same values),
    including a row equal to its example's logits (KL at the float64 floor: clamped to 0
    or tiny, never negative)."""
    torch.manual_seed(3)
    V, B = 1000, 3
    clean_logits = 4 * torch.randn(B, V, dtype=torch.float64)
    clean_logp = torch.log_softmax(clean_logits, -1)
    rows = torch.tensor([2, 0, 0, 1, 2, 1, 0])
    logits = clean_logits[rows] + 0.3 * torch.randn(len(rows), V, dtype=torch.float64)
    logits[3] = clean_logits[1]  # the clean distribution itself: KL at the floor
    logits32 = logits.float()  # a float32 model's logits, log-softmaxed in float64
    for lg in (logits, logits32):
        got = E.kl_of_rows(clean_logp, clean_logp.exp(), rows, lg)
        want = E.kl_from_logits(clean_logp[rows], lg)
        assert torch.equal(got, want)
        others = got[torch.arange(len(rows)) != 3]
        assert (got >= 0).all() and got[3] < 1e-12 and (others > 1e-3).all()


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
    model = edge_model(geometry)
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
    model = edge_model("value384")
    pairs = random_pairs(4, (5, 7))[:2]
    edges = E.all_edges(3, 4)
    fast = E.edge_kl(model, *pairs, edges, batch_size=16, max_rows=2048)
    for resume in (False, True):
        naive = E.edge_kl_naive(model, *pairs, edges, resume=resume, batch_size=3)
        assert_exact(naive, fast)


def test_orthogonal_writer_gives_exactly_zero():
    # all-common-axis: writer (l, h) writes only the coordinates of block h, reader (l', h')
    # reads only block h': for h != h' the patched input equals the clean one exactly.
    model = edge_model("all-common-axis", dtype=torch.float32)
    pairs = random_pairs(4, (6,))[:2]
    edges = E.all_edges(3, 4)
    kl = E.edge_kl(model, *pairs, edges, batch_size=16, max_rows=2048)
    cross = edges.writer_head != edges.reader_head
    assert (kl[:, cross] == 0.0).all()
    assert kl[:, ~cross].max() > 1e-3 and (kl[:, ~cross] > 0).mean() > 0.5  # not vacuous


def test_multiscreen_is_refused_by_name():
    model = multiscreen_model("learned")
    with pytest.raises(ValueError, match="edge_patching"):
        E.edge_kl(model, *random_pairs(2, (5,))[:2], batch_size=16, max_rows=2048)


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
    model = edge_model("learned", dtype=torch.float32)
    vocab = np.arange(N_VOCAB, dtype=np.int64) * 7 + 100  # model id i <-> GPT-2 id vocab[i]
    save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    write_manifest(
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
            "--task", str(tmp_path / "sva.parquet"), "--n-examples", "8", "--split", "validation",
            "--dtype", "float64", "--device", "cpu"]  # fmt: skip
    edge_outs = ["--out-edges", str(out["edges"]), "--out-summary", str(out["summary"]),
                 "--batch-size", "16", "--max-rows", "2048"]  # fmt: skip
    assert edges_stage.main(argv + edge_outs) == 0
    acdc_out = ["--out", str(out["acdc"]), "--acdc-threshold", "0.01"]
    assert acdc_stage.main(argv + acdc_out) == 0
    meta = {k.decode(): v.decode() for k, v in pq.read_metadata(out["edges"]).metadata.items()}
    # by hand: SS 0, 1; SP 2, 6; PP 3, 7; PS 5, 8 (SS 4 and PS 9 are third of theirs)
    assert json.loads(meta["example_ids"]) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert json.loads(meta["examples_per_condition"]) == {"SS": 2, "SP": 2, "PP": 2, "PS": 2}
    assert meta["dtype"] == "float64"  # strings are stored as they are
    edges = pq.read_table(out["edges"]).to_pandas()
    assert len(edges) == E.edge_count(3, 4) and (edges["kl"] >= 0).all()
    # the stage's KLs are the engine's on those examples in float64
    pick = [0, 1, 2, 3, 5, 6, 7, 8]
    kl = E.edge_kl(
        model.double(),
        [clean[i] for i in pick],
        [ref[i] for i in pick],
        batch_size=16,
        max_rows=2048,
    )
    np.testing.assert_allclose(edges["kl"], kl.mean(0), rtol=1e-12, atol=0)
    acdc_meta = pq.read_metadata(out["acdc"]).metadata
    assert 0 <= json.loads(acdc_meta[b"check_decisions_max_residual_over_tolerance"]) <= 1
    assert json.loads(acdc_meta[b"example_ids"]) == pick
