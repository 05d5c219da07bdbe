"""The peer harness (benchmarks/peer_patching.py): the exchange round-trips, and every peer
script whose environment exists agrees with our engine to 1e-5 on a tiny model, and every
peer that loads Llamas on a tiny grouped-query Llama (4 query heads sharing 2 key/value
heads) too. The peers' environments (benchmarks/peers/envs.py) are not needed for the suite:
absent, their test is skipped with the command that makes one; the TransformerLens 3.9
script and the naive torch-hooks loop also run in our own [dev] environment, so they are
checked everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from patching_engine import forward_flops  # noqa: E402
from peers import envs, exchange  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exchange")
    model, pairs = exchange.tiny(folder)
    return folder, pairs


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is the hf extra")
    folder = tmp_path_factory.mktemp("exchange-llama")
    exchange.tiny(folder, llama=True)
    return folder


def test_examples_round_trip(tiny, tmp_path):
    folder, pairs = tiny
    back = exchange.read_examples(folder / "examples.parquet")
    for a, b in zip(pairs[0] + pairs[1], back[0] + back[1], strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(pairs[2], back[2]) and np.array_equal(pairs[3], back[3])
    assert [g.tolist() for g in exchange.groups(back[0])] == [[0, 1, 2], [3, 4, 5]]
    (tmp_path / "bad.parquet").write_bytes((folder / "examples.parquet").read_bytes())
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(folder / "examples.parquet").drop(["ref_ids"]),
                   tmp_path / "bad.parquet")  # fmt: skip
    with pytest.raises(ValueError, match="missing columns \\['ref_ids'\\]"):
        exchange.read_examples(tmp_path / "bad.parquet")


def _agreement(python: str, script: str, folder: Path, name: str) -> float:
    out = folder / f"{name}.npz"
    proc = subprocess.run([python, str(ROOT / "benchmarks" / "peers" / script), "--exchange",
                           str(folder), "--out", str(out)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, ours = exchange.read_effects(out), exchange.read_effects(folder / "ours.npz")
    assert np.abs(ours["effects"]).max() > 1e-3  # the comparison has something to compare
    return float(np.abs(got["effects"] - ours["effects"]).max())


def test_transformer_lens_script_in_our_environment_agrees(tiny):
    pytest.importorskip("transformer_lens", reason="transformer_lens is a [dev] extra")
    folder, _ = tiny
    assert _agreement(sys.executable, "patch_transformer_lens.py", folder, "ours-tl") <= 1e-5


@pytest.mark.parametrize("name", [n for n, p in envs.PEERS.items() if p.task == "heads"])
def test_each_installed_peer_agrees(tiny, name):
    peer = envs.PEERS[name]
    if not peer.ready():
        pytest.skip(f"no {name} environment (python benchmarks/peers/envs.py {name})")
    folder, _ = tiny
    assert _agreement(str(peer.python), peer.script, folder, name) <= 1e-5


def test_llama_exchange_is_the_model_itself(tiny_llama):
    """The exchange holds the wrapped model's own tensors: transformers reloads the same
    logits bit for bit, and the peers' layout finds o_proj, whose input is H · d_head wide."""
    import torch
    import transformers

    from headgeom.model.hf import HFCausalLM

    hf = exchange.load_transformers(tiny_llama / "model")
    assert isinstance(hf, transformers.LlamaForCausalLM)
    again, _ = exchange.tiny(tiny_llama / "again", llama=True)  # the same seeded model
    assert isinstance(again, HFCausalLM)
    ids = torch.as_tensor(exchange.read_examples(tiny_llama / "examples.parquet")[0][0])[None]
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, again.hf(ids).logits)
    n_layer, n_head, d_head = exchange.head_shape(hf.config)
    projections = exchange.out_projections(hf, hf.config)
    assert (n_layer, n_head, d_head) == (3, 4, 8) and hf.config.num_key_value_heads == 2
    assert [p.in_features for p in projections] == [n_head * d_head] * n_layer
    assert projections[1] is hf.model.layers[1].self_attn.o_proj


@pytest.mark.parametrize(
    "name", [n for n, p in envs.PEERS.items() if p.task == "heads" and "llama" in p.models]
)
def test_each_installed_llama_peer_agrees(tiny_llama, name):
    peer = envs.PEERS[name]
    if not peer.ready():
        pytest.skip(f"no {name} environment (python benchmarks/peers/envs.py {name})")
    assert _agreement(str(peer.python), peer.script, tiny_llama, name) <= 1e-5


def test_transformer_lens_script_in_our_environment_agrees_on_llama(tiny_llama):
    pytest.importorskip("transformer_lens", reason="transformer_lens is a [dev] extra")
    got = _agreement(sys.executable, "patch_transformer_lens.py", tiny_llama, "ours-tl")
    assert got <= 1e-5


def test_auto_circuit_edges_agree_with_ours(tiny):
    peer = envs.PEERS["auto-circuit-1.0"]
    if not peer.ready():
        pytest.skip(f"no {peer.name} environment (python benchmarks/peers/envs.py {peer.name})")
    import torch

    from headgeom.heads.analysis import edges as E

    folder, pairs = tiny
    out = folder / "edges.npz"
    proc = subprocess.run([str(peer.python), str(ROOT / "benchmarks" / "peers" / peer.script),
                           "--exchange", str(folder), "--out", str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as f:
        got = f["kl"]
    model, _ = exchange.tiny(folder / "again")  # the same seeded model
    ours = E.edge_kl(
        model.to(torch.float64), pairs[0], pairs[1], batch_size=16, max_rows=2048
    ).mean(axis=0)
    assert len(got) == len(ours) == E.edge_count(3, 4)
    big = ours >= 1e-9
    assert big.sum() > 10 and np.abs(got - ours).max() <= 1e-12
    assert (np.abs(got - ours)[big] / ours[big]).max() <= 1e-6


def test_full_forward_flops_are_the_counted_flops_of_a_llama(tiny_llama):
    """The FLOP bound's forward (benchmarks/patching_engine.py: grouped-query readers, gated
    MLP, full-vocabulary logits of the last ``logits`` positions) against torch's own counter
    of a forward of the tiny Llama, every matmul seen (eager attention), whose QKᵀ and AV
    cover all T × T scores where the model counts the causal half: t + 1 keys at t."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, _ = exchange.tiny(tiny_llama / "flops", llama=True)
    model.hf.config._attn_implementation = "eager"
    cfg, T = model.cfg, 7
    ids = torch.arange(T)[None] + 3
    per_key = 4 * cfg.n_head * cfg.d_head  # q·k and a·v of one query against one key
    masked = cfg.n_layer * per_key * sum(T - (t + 1) for t in range(T))
    for logits, last_only in ((T, False), (1, True)):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(ids, last_only=last_only)
        assert forward_flops(cfg, T, logits) == counter.get_total_flops() - masked
