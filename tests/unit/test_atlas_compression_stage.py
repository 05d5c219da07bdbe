"""The atlas's compression view (stage ``headgeom.atlas.stages.compression``) on a random tiny
Llama with its own tokenizer (nothing downloaded): the original row scores nothing, int8 moves
predictions less than int2, the bytes are the hand-counted ones, the original weights are back
after the stage, mixed precision is scored off its sensitivity corpus, and bad configs are
refused naming their key."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import artifacts  # noqa: E402
from headgeom.atlas import compression_view as view  # noqa: E402
from headgeom.atlas.stages import compression, inputs  # noqa: E402
from headgeom.atlas.study import AtlasStudy  # noqa: E402
from headgeom.atlas.tensor_groups import Weights  # noqa: E402
from headgeom.io import read_parquet_metadata, read_table  # noqa: E402
from headgeom.validation import StudyConfigError  # noqa: E402
from tests.helpers.hf import save_tiny_llama  # noqa: E402

CORPORA = [{"name": "demo", "source": "demo", "seed": 3},
           {"name": "math", "source": "domain", "domain": "math", "seed": 3}]  # fmt: skip
COMPRESSION = {
    "groups": ["embedding", "attention", "mlp"], "bits": [8, 4, 2],
    "low_rank": {"groups": ["embedding"], "ks": [4, 32, 64]},  # 64 > D = 32: left out
    "prune": {"groups": ["embedding"], "ns": [20], "bits": [16, 4], "counting_corpus": "demo",
              "count_tokens": 2000},
    "mixed": {"bits": 2, "high_bits": 8, "n_sensitive": [1], "sensitivity_corpus": "demo"},
}  # fmt: skip


def _config(model, **over):
    return {"kind": "atlas", "study": "t", "model": model, "corpora": CORPORA,
            "windows": {"n_ctx": 16, "n_mean": 1, "n_scored": 3},
            "skills": {"tasks": ["sva"], "n_items": 8},
            "sweep": {"batch_size": 2, "kl_chunk": 7, "probe_rows": 3},
            "compression": COMPRESSION, **over}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas_compression")
    hf = save_tiny_llama(root / "llama", seed=0)
    model = {"format": "hf-causal-lm", "path": str(root / "llama")}
    study = AtlasStudy.from_config(_config(model))
    out = {k: str(root / f"{k}.parquet") for k in ("windows", "probes", "compression")}
    assert inputs.main(["--config-json", json.dumps(study.inputs_config()), "--out-windows",
                        out["windows"], "--out-probes", out["probes"]]) == 0  # fmt: skip
    assert compression.main(["--config-json", json.dumps(study.compression_config()),
                             "--windows", out["windows"], "--probes", out["probes"],
                             "--out", out["compression"],
                             "--out-report", str(root / "compression.md")]) == 0  # fmt: skip
    frame = read_table(out["compression"]).to_pandas()
    return root, study, out, frame, hf


def _row(frame, method, group, corpus="mean", setting=None):
    part = frame[(frame["method"] == method) & (frame["group"] == group)
                 & (frame["corpus"] == corpus)]  # fmt: skip
    if setting is not None:
        part = part[part["setting"].str.contains(setting, regex=False)]
    assert len(part) == 1, (method, group, corpus, setting)
    return part.iloc[0]


def test_the_original_scores_nothing_and_keeps_every_skill(run):
    _, _, _, frame, _ = run
    original = frame[frame["method"] == "original"]
    assert set(original["corpus"]) == {"demo", "math", "mean"}
    assert (original["kl"] == 0).all() and (original["delta_top1"] == 0).all()
    assert (original["retention"] == 1).all()
    assert (original["bytes"] == original["bytes_original"]).all()


def test_bytes_are_the_hand_counted_ones(run):
    _, _, _, frame, hf = run
    V, D = hf.model.embed_tokens.weight.shape  # D = 32: one ragged group of 32 per row
    dense = V * D * 2  # 16 bits a value
    for bits in (8, 4, 2):
        row = _row(frame, f"int{bits}", "embedding")
        assert row["bytes_original"] == dense
        assert row["bytes"] == V * D * bits // 8 + V * 1 * 4  # codes + fp16 scale and min
    # rank 4 of a V × D table: 4 · (V + D) values at 16 bits
    assert _row(frame, "low_rank", "embedding", setting="rank 4")["bytes"] == 4 * (V + D) * 2
    assert _row(frame, "low_rank", "embedding", setting="rank 32")["bytes"] == 32 * (V + D) * 2
    assert not frame["setting"].str.contains("rank 64").any()  # above the table's side
    # 20 kept rows + the fallback row
    assert _row(frame, "prune", "embedding", setting="16-bit")["bytes"] == 21 * D * 2
    assert _row(frame, "prune", "embedding", setting="int4")["bytes"] == 21 * D // 2 + 21 * 4
    every = sum(p.numel() for n, p in hf.named_parameters() if "norm" not in n)
    assert _row(frame, "original", "all")["bytes"] == every * 2


def test_fewer_bits_move_predictions_more_and_full_rank_nothing(run):
    _, _, _, frame, _ = run
    for group in ("embedding", "attention", "mlp", "all"):
        kls = [_row(frame, f"int{b}", group)["kl"] for b in (8, 4, 2)]
        assert all(math.isfinite(k) and k >= 0 for k in kls)
        assert kls[0] < kls[1] < kls[2], (group, kls)
    # rank D of a V × D table is the table itself (up to float32 round-off)
    assert _row(frame, "low_rank", "embedding", setting="rank 32")["kl"] < 1e-8
    assert _row(frame, "low_rank", "embedding", setting="rank 4")["kl"] > 1e-4


def test_mixed_precision_is_scored_off_its_sensitivity_corpus(run):
    _, _, out, frame, _ = run
    mixed = frame[frame["method"] == "mixed"]
    assert set(mixed["corpus"]) == {"math", "mean"}  # not demo, where the layer was chosen
    scores = json.loads(read_parquet_metadata(out["compression"])["layer_sensitivity"])
    top = max(scores, key=lambda k: (scores[k], -int(k)))
    assert f"(L{top})" in mixed.iloc[0]["setting"]
    # one layer back at int8 moves predictions less than every layer at int2
    assert _row(frame, "mixed", "all", "math")["kl"] < _row(frame, "int2", "all", "math")["kl"]


def test_the_original_weights_are_back(run):
    root, study, out, _, hf = run
    meta = read_parquet_metadata(out["compression"])
    assert meta["weights_sha256_before"] == meta["weights_sha256_after"]
    # in process: every tensor equal to the saved model's after the variants ran
    model, _ = artifacts.load_model(study.model_spec, torch.device("cpu"))
    weights = Weights.of(model.hf)
    _, scored, _ = artifacts.read_windows(out["windows"])
    scorer = view.Scorer(model, scored, [], 2, 7, 3)
    todo = list(view.variants(weights, {**COMPRESSION, "prune": {**COMPRESSION["prune"], "ns": []}},
                              None))  # fmt: skip
    view.run(model, weights, todo, scorer)
    for name, t in hf.state_dict().items():
        assert torch.equal(model.hf.state_dict()[name], t), name


def test_bad_compression_configs_are_refused_naming_the_key(tmp_path):
    model = {"format": "hf-causal-lm", "path": str(tmp_path)}
    only_demo = _config(model, corpora=CORPORA[:1])
    with pytest.raises(StudyConfigError, match=r"compression\.mixed\.sensitivity_corpus"):
        AtlasStudy.from_config(only_demo)
    unknown = _config(model, compression={**COMPRESSION, "groups": ["embedding", "lm_head"]})
    with pytest.raises(StudyConfigError, match=r"compression\.groups\[1\]: .lm_head. is not"):
        AtlasStudy.from_config(unknown)
    counting = _config(
        model,
        compression={**COMPRESSION, "prune": {**COMPRESSION["prune"], "counting_corpus": "prose"}},
    )
    with pytest.raises(StudyConfigError, match=r"compression\.prune\.counting_corpus.*'prose'"):
        AtlasStudy.from_config(counting)
    with pytest.raises(ValueError, match="unknown tensor groups"):
        view.present(Weights.of(transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
            num_attention_heads=2))), ["lm_head"])  # fmt: skip
