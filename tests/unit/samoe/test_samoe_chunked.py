"""Memory-bounded capture (``headgeom.samoe.capture.captures``, ``token_capture``): a pool
captured a few sequences a forward, keeping only what each analysis reads.

* One chunk (the default, or ``batch_sequences`` ≥ the pool) is bitwise the one-forward
  capture, and every analysis built on the chunked path (state geometry and K2, set-change
  rates and K9, the ledger with K6–K8 at the targets' tokens, suppression outcomes, Li
  attribution, the probes' features) gives bitwise the whole-pool results.
* Chunks of 1 or 2 sequences run other batch shapes through the CPU kernels, which block a
  matmul by its size: the forward agrees with the whole-pool one to float32 rounding, not
  bitwise (measured here: ≤ 1e-6 on router logits of magnitude ~1). So continuous results
  are compared within ``ATOL``/``RTOL`` (a few hundred ulps of float32 at these magnitudes,
  well below every check's tolerance: K6 1e-4, K7/K8/K14 1e-5), and discrete ones (Top-k
  sets, set-change counts) exactly: the random test models have no near-ties at that scale.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from headgeom.samoe import li
from headgeom.samoe.capture import (
    FIELD_SITES,
    PoolStates,
    capture,
    captures,
    chunks,
    state_geometry,
    token_capture,
)
from headgeom.samoe.ledger import (
    Targets,
    boundary_pair,
    ledger,
    logit_reconstruction_residual,
    state_only_replay,
)
from headgeom.samoe.quality import perplexity
from headgeom.samoe.suppression import (
    PoolSetChanges,
    check_unit_lambda,
    set_change_rates,
    suppression_outcomes,
)
from tests.helpers import samoe as h
from tests.unit.samoe.test_samoe_device_scripts import SCRIPTS, argv, inputs, tables
from tests.unit.samoe.test_samoe_devices import same

__all__ = ["inputs"]  # the scripts' fixture: tiny pools, targets and checkpoints

ATOL, RTOL = 1e-5, 1e-5
LAMBDAS = (1.0, 0.5, 0.0)
SIZES = (1, 2)  # chunks that split the 5-sequence pool unevenly


@pytest.fixture(scope="module")
def persistent():
    model = h.random_model("persistent", seed=3, write_std=0.4)
    ids = h.token_ids(batch=5, seq=24, seed=1)
    targets = Targets([0, 1, 4, 2, 4], [10, 15, 20, 8, 3], [4, 5, 3, 5, 2])
    return model, ids, targets


@pytest.fixture(scope="module")
def ordinary():
    model = h.random_model("ordinary", seed=4)
    ids = h.token_ids(batch=5, seq=24, seed=2)
    targets = Targets([0, 3, 4, 0], [10, 15, 20, 21], [3, 5, 4, 2])
    return model, ids, targets


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, equal_nan=True)


# --------------------------------------------------------------------------- chunks, fields
def test_chunks_cover_the_pool_in_order():
    assert chunks(5, None) == [slice(0, 5)]
    assert chunks(5, 8) == [slice(0, 5)]
    assert chunks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    with pytest.raises(ValueError, match="batch_sequences"):
        chunks(5, 0)


@pytest.mark.parametrize("batch", [None, 5, 9])
def test_one_chunk_is_bitwise_the_pool_capture(persistent, batch):
    model, ids, _ = persistent
    (part, cap), *rest = list(captures(model, ids, batch))
    assert not rest and part == slice(0, 5)
    same(cap, capture(model, ids))


def test_fields_record_only_what_is_asked(persistent):
    model, ids, _ = persistent
    full = capture(model, ids)
    cap = capture(model, ids, fields=("router_in", "state"))
    for name in FIELD_SITES:
        if name in ("router_in", "state", "logits"):
            same(getattr(cap, name), getattr(full, name))
        else:
            assert getattr(cap, name) is None, name
    same(cap.top_ids, full.top_ids)
    with pytest.raises(KeyError, match="unknown capture fields"):
        capture(model, ids, fields=("router_inn",))


@pytest.mark.parametrize("batch", SIZES)
def test_small_chunks_agree_with_the_pool_capture_to_float32_rounding(persistent, batch):
    model, ids, _ = persistent
    full = capture(model, ids)
    parts = list(captures(model, ids, batch))
    assert [p for p, _ in parts] == chunks(5, batch)
    for name in ("router_in", "logits", "state", "write_proposal", "attn_out", "routed_out"):
        close(torch.cat([getattr(c, name) for _, c in parts], 1), getattr(full, name))
    close(torch.cat([c.output_logits for _, c in parts]), full.output_logits)
    same(torch.cat([c.top_ids for _, c in parts], 1), full.top_ids)


# --------------------------------------------------------------------------- K2, geometry, K9
def _geometry_as_before(cap, clamp):
    """The state geometry as the unchunked code computed it (one capture of the pool)."""
    return [{"layer": layer, "mean_norm": float(cap.state[layer].norm(dim=-1).mean()),
             "clamp_fraction": float((cap.state[layer].abs() >= clamp).double().mean())}
            for layer in range(cap.n_layer)]  # fmt: skip


@pytest.mark.parametrize("variant", ["persistent", "latest"])
@pytest.mark.parametrize("batch", [None, *SIZES])
def test_pool_states_and_set_changes_match_the_one_capture_results(variant, batch):
    moe = h.MOE_CLAMPED if variant == "persistent" else h.MOE
    model = h.random_model(variant, seed=5, write_std=0.6, moe=moe, drift=0.8)
    ids = h.token_ids(batch=5, seq=24, seed=3)
    clamp = model.moe_cfg.clamp
    full = capture(model, ids)
    states, changes = PoolStates(clamp), PoolSetChanges(model, LAMBDAS)
    for _, cap in captures(model, ids, batch, ("router_in", "state")):
        states.add(cap)
        changes.add(cap)
    want = _geometry_as_before(full, clamp)
    got = states.geometry()
    if variant == "persistent":
        assert max(row["clamp_fraction"] for row in want) > 0  # the clamp is reached
    assert state_geometry(full, clamp) == want  # the library's one-capture path, unchanged
    want_rates = {skip: set_change_rates(model, full, LAMBDAS, skip_layer0=skip)
                  for skip in (True, False)}  # fmt: skip
    want_k2 = float(full.state.abs().max())
    if batch is None:  # one chunk: bitwise
        assert got == want
        assert states.max_abs == want_k2
    else:
        for g, w in zip(got, want, strict=True):
            assert g["clamp_fraction"] == w["clamp_fraction"]  # counts: no coordinate moved
            assert g["mean_norm"] == pytest.approx(w["mean_norm"], rel=RTOL)
        assert states.max_abs == pytest.approx(want_k2, rel=RTOL)
    for skip in (True, False):
        assert changes.rates(skip_layer0=skip) == want_rates[skip]  # exact: same Top-2 sets
    assert changes.check_unit_lambda() == check_unit_lambda(model, full)


# --------------------------------------------------------------------------- token captures
@pytest.mark.parametrize("batch", [None, *SIZES])
def test_the_ledger_at_the_targets_tokens_matches_the_pool_capture(persistent, batch):
    model, ids, targets = persistent
    full = capture(model, ids)
    k7 = []

    def each(chunk):
        k7.append(logit_reconstruction_residual(model, chunk))

    cap = token_capture(model, ids, targets.batch, targets.position, batch,
                        ("router_in", "state", "write_proposal"), each=each)  # fmt: skip
    assert cap.attn_out is None and cap.output_logits is None
    assert cap.router_in.shape[1:3] == (len(targets), 1)
    want, got = ledger(model, full, targets), ledger(model, cap, targets)
    want_rep = state_only_replay(model, full, targets, want)
    got_rep = state_only_replay(model, cap, targets, got)
    if batch is None:
        same(got, want)
        same(got_rep, want_rep)
        assert k7 == [logit_reconstruction_residual(model, full)]
    else:
        same(got.e2, want.e2), same(got.e3, want.e3), same(got.eligible, want.eligible)
        for name in ("contributions", "state_term", "hidden_term", "margin", "write_norm"):
            close(getattr(got, name), getattr(want, name))
        close(got_rep.margin_change, want_rep.margin_change)
        same(got_rep.clamp_touched, want_rep.clamp_touched)
        assert len(k7) == len(chunks(len(ids), batch)) and max(k7) < 1e-5


def test_a_token_capture_refuses_other_targets(persistent):
    model, ids, targets = persistent
    cap = capture(model, ids).select(targets.batch, targets.position)
    other = Targets(targets.batch.flip(0), targets.position.flip(0), targets.layer)
    with pytest.raises(ValueError, match="tokens it was made for"):
        ledger(model, cap, other)


@pytest.mark.parametrize("batch", [None, 2])
def test_suppression_outcomes_from_the_targets_tokens(persistent, batch):
    model, ids, targets = persistent
    want = suppression_outcomes(model, ids, capture(model, ids), targets)
    cap = token_capture(model, ids, targets.batch, targets.position, batch, ("output_logits",))
    got = suppression_outcomes(model, ids, cap, targets)
    if batch is None:
        same(got, want)
    else:
        same(got.target, want.target), same(got.source, want.source)
        for name in ("margin_change", "jaccard_downstream", "jaccard_after_target", "output_kl"):
            close(getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("batch", [None, 2])
def test_li_attribution_from_the_targets_tokens(ordinary, batch):
    model, ids, targets = ordinary
    full = capture(model, ids)
    e2, e3 = boundary_pair(full, targets)
    want = li.attribute(model, ids, full, targets, e2, e3)
    cap = token_capture(model, ids, targets.batch, targets.position, batch,
                        ("router_in", "attn_out", "shared_out", "routed_out"))  # fmt: skip
    same(boundary_pair(cap, targets), (e2, e3))
    got = li.attribute(model, ids, cap, targets, e2, e3)
    if batch is None:
        same(got, want)
    else:
        for name in ("alpha", "norm", "variance", "boundary"):
            close(getattr(got, name), getattr(want, name))
        assert max(got.input_residual, got.logit_residual) < li.RECONSTRUCTION_TOL


# --------------------------------------------------------------------------- perplexity
def test_perplexity_in_smaller_batches(persistent):
    """The default batch (8 ≥ the pool) is the one-forward value; smaller batches add the
    float64 NLL sums in another grouping of float32-rounded logits: ~1e-7 relative."""
    model, ids, _ = persistent
    whole = perplexity(model, ids)
    assert perplexity(model, ids, batch_size=5) == whole
    for batch in SIZES:
        assert perplexity(model, ids, batch_size=batch) == pytest.approx(whole, rel=1e-6)


# --------------------------------------------------------------------------- probes
@pytest.mark.parametrize("batch", [None, *SIZES])
def test_probe_features_keep_the_budget_positions_in_order(persistent, batch):
    from headgeom.samoe.stages import probes as samoe_probes

    model, ids, _ = persistent
    full = capture(model, ids)
    S, T = ids.shape
    order = np.random.default_rng(0).permutation(S * T)
    keep = order[:50]
    data = samoe_probes.PoolData(model, ids, [f"s{i}" for i in range(S)], [2, 3], [2, 3, 5],
                                 keep, batch)  # fmt: skip
    assert sorted(data.hidden) == [2, 3] and sorted(data.top2) == [2, 3, 5]
    flat = lambda x: x.reshape(S * T, *x.shape[2:]).numpy()  # noqa: E731
    for layer in (2, 3):
        want_h, want_s = flat(full.router_in[layer])[keep], flat(full.state[layer])[keep]
        if batch is None:
            np.testing.assert_array_equal(data.hidden[layer], want_h, strict=True)
            np.testing.assert_array_equal(data.state[layer], want_s, strict=True)
        else:
            np.testing.assert_allclose(data.hidden[layer], want_h, atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(data.state[layer], want_s, atol=ATOL, rtol=RTOL)
    for layer in (2, 3, 5):
        np.testing.assert_array_equal(data.top2[layer], flat(full.top_ids[layer, ..., :2])[keep])
    np.testing.assert_array_equal(data.sequence, np.repeat([f"s{i}" for i in range(S)], T)[keep])


# --------------------------------------------------------------------------- the scripts
@pytest.mark.parametrize("script, variant", [("capture", "persistent"), ("capture", "latest"),
                                             ("probes", "persistent")])  # fmt: skip
def test_scripts_with_one_chunk_write_the_default_tables(script, variant, inputs, tmp_path):
    """--batch-sequences ≥ every pool (6 sequences): bitwise the default's tables; the
    metadata adds only ``capture_batch_sequences``."""
    got, want = _run_both(script, variant, inputs, tmp_path, "6")
    assert list(got) == list(want) and got
    for name, (data, meta) in want.items():
        assert got[name][0].equals(data), name
        assert {**meta, b"capture_batch_sequences": b"6"} == got[name][1], name


@pytest.mark.parametrize("script, variant, batch", [("capture", "persistent", "1"),
                                                    ("capture", "latest", "2"),
                                                    ("interventions", "persistent", "1"),
                                                    ("interventions", "persistent", "6"),
                                                    ("li", "ordinary", "2"),
                                                    ("probes", "persistent", "2")])  # fmt: skip
def test_scripts_in_chunks_agree_to_float32_rounding(script, variant, batch, inputs, tmp_path):
    """Smaller chunks, or suppression and oracle forwards of other row counts (interventions
    and Li at 6: their default puts 64 rows, or every row, in one forward): every float
    within ATOL/RTOL of the default's, everything else (Top-k ids, roles, counts, the probes'
    chosen C) equal; the probes' L-BFGS iteration counts are left out (they follow the
    rounding of the features: 2 of 18 fits differ here, by up to 23 iterations)."""
    got, want = _run_both(script, variant, inputs, tmp_path, batch)
    assert list(got) == list(want) and got
    for name, (data, meta) in want.items():
        got_meta = got[name][1]
        assert set(got_meta) == {*meta, b"capture_batch_sequences"}, name
        assert got_meta[b"capture_batch_sequences"] == batch.encode()
        for key, value in meta.items():  # a check's residual moves with the rounding
            if key.startswith(b"check_") and b"residual" in key:
                assert float(got_meta[key]) == pytest.approx(float(value), abs=1e-6), key
            else:
                assert got_meta[key] == value, key
        a, b = got[name][0].to_pandas(), data.to_pandas()
        assert list(a.columns) == list(b.columns), name
        for column in a.columns:
            if column == "iterations":  # L-BFGS's path length follows the rounding; not a result
                continue
            x, y = a[column].to_numpy(), b[column].to_numpy()
            if column == "contributions":
                x, y = np.concatenate(x), np.concatenate(y)
            if np.issubdtype(y.dtype, np.floating) or column == "contributions":
                np.testing.assert_allclose(x.astype(float), y.astype(float), atol=ATOL,
                                           rtol=RTOL, err_msg=f"{name}:{column}")  # fmt: skip
            else:
                np.testing.assert_array_equal(x, y, err_msg=f"{name}:{column}")


def _run_both(script, variant, inputs, tmp_path, batch):
    default, chunked = tmp_path / "default", tmp_path / "chunked"
    default.mkdir(), chunked.mkdir()
    assert SCRIPTS[script].main(argv(script, inputs, variant, default)) == 0
    assert SCRIPTS[script].main([*argv(script, inputs, variant, chunked),
                                 "--batch-sequences", batch]) == 0  # fmt: skip
    return tables(chunked), tables(default)


# --------------------------------------------------------------------------- devices
def test_the_chunked_paths_make_no_tensor_on_the_default_device(persistent):
    """As test_samoe_devices: run under a meta default device, a tensor made without a device
    would land there and fail or differ; the chunked paths take theirs from the inputs."""
    from headgeom.samoe.stages import probes as samoe_probes
    from tests.unit.samoe.test_samoe_devices import on_default_meta

    model, ids, targets = persistent

    def run():
        cap = token_capture(model, ids, targets.batch, targets.position, 2,
                            ("router_in", "state", "write_proposal", "output_logits"))  # fmt: skip
        led = ledger(model, cap, targets)
        states, changes = PoolStates(model.moe_cfg.clamp), PoolSetChanges(model, LAMBDAS)
        for _, chunk in captures(model, ids, 2, ("router_in", "state")):
            states.add(chunk)
            changes.add(chunk)
        data = samoe_probes.PoolData(model, ids, [str(i) for i in range(5)], [2], [2, 4],
                                     np.arange(7, 40), 2)  # fmt: skip
        out = suppression_outcomes(model, ids, cap, targets, rows_per_forward=2)
        return led, states.geometry(), changes.rates(), data.hidden[2], out

    want = run()
    got = on_default_meta(run)
    same(got[0], want[0])
    assert got[1] == want[1] and got[2] == want[2]
    np.testing.assert_array_equal(got[3], want[3])
    same(got[4], want[4])


# --------------------------------------------------------------------------- K1 (samoe_seeds)
@pytest.fixture(scope="module")
def step0(tmp_path_factory):
    """Step-0 checkpoints of the three variants of one seed (upcycled from one dense GPT),
    their init records and a final pool of 6 sequences."""
    import pandas as pd

    from headgeom.hashing import sha256_file
    from headgeom.io import write_manifest
    from headgeom.samoe.checkpoint import save_moe
    from headgeom.samoe.upcycle import init_manifest, upcycle

    d = tmp_path_factory.mktemp("step0")
    dense = h.dense_gpt().state_dict()
    paths, inits = {}, {}
    for variant in ("ordinary", "latest", "persistent"):
        moe = dataclasses.replace(h.MOE, router_x_init="state_block")  # K1.ordinary_* run
        model = upcycle(dense, h.CFG, moe, variant, 42)
        ckpt = d / f"{variant}.safetensors"
        save_moe(ckpt, model, np.arange(h.N_VOCAB))
        write_manifest(d / f"{variant}.json", {"checkpoint_file_sha256": sha256_file(ckpt)})
        paths[variant] = (ckpt, d / f"{variant}.json")
        inits[variant] = {"init": init_manifest(model)}
    rng = np.random.default_rng(0)
    frame = pd.DataFrame([{"role": "final", "domain": ("prose", "code", "math")[i % 3],
                           "seq_id": f"final-{i:04d}", "intervention": False,
                           "tokens": rng.integers(0, h.N_VOCAB, 24).astype(np.int32)}
                          for i in range(6)])  # fmt: skip
    return paths, frame, inits


@pytest.mark.kernel_pin  # K1 compares two variants' forwards bit for bit
@pytest.mark.parametrize("batch", [1, 4])
def test_k1_in_chunks_gives_the_one_forward_record(step0, batch, monkeypatch):
    from headgeom.samoe.stages import seeds as samoe_seeds

    paths, frame, inits = step0
    monkeypatch.setattr(samoe_seeds, "K1_BATCH", samoe_seeds.K1_SEQUENCES, raising=False)
    want = samoe_seeds.step0_checks(paths, frame, inits)
    for check in ("K1.writes", "K1.logits", "K1.ordinary_logits", "K1.ordinary_outputs"):
        assert any(check in key for key in want), check  # every K1 part ran
    monkeypatch.setattr(samoe_seeds, "K1_BATCH", batch, raising=False)
    assert samoe_seeds.step0_checks(paths, frame, inits) == want


# --------------------------------------------------------------------------- the config key
def test_the_config_key_reaches_the_flag_and_no_hash():
    """capture.batch_sequences: unset in the toy (no flag: a pool in one forward), 2 in the
    paper config; refused below 1; outside every analysis config hash."""
    from pathlib import Path

    import yaml

    from headgeom.samoe.study import SAMoEStudy
    from headgeom.validation import StudyConfigError

    root = Path(__file__).resolve().parents[3]
    demo = yaml.safe_load((root / "config/samoe.yaml").read_text())
    toy = SAMoEStudy.from_config(demo)
    assert toy.batch_flag == ""
    paper = SAMoEStudy.from_config(yaml.safe_load((root / "config/samoe-paper.yaml").read_text()))
    assert paper.batch_flag == "--batch-sequences 2"
    chunked = SAMoEStudy.from_config({**demo, "capture": {"batch_sequences": 3}})
    assert chunked.batch_flag == "--batch-sequences 3"
    assert chunked.analysis_config("toy") == toy.analysis_config("toy")
    with pytest.raises(StudyConfigError, match="batch_sequences"):
        SAMoEStudy.from_config({**demo, "capture": {"batch_sequences": 0}})
