"""The two-checkpoint views (headgeom.atlas.checkpoints) and the tensor groups they act on
(headgeom.atlas.tensor_groups), each against an identity, a hand-built case or a naive
state-dict loop: the blend dial's ends are the checkpoints, a graft of every group is the
donor, the low-rank delta at full rank is B, drift on a hand-built pair, row swaps."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from headgeom.atlas import checkpoints as ck
from headgeom.atlas.tensor_groups import (
    RULES,
    Role,
    UnknownTensorError,
    Weights,
    check_same_architecture,
    role_of,
)
from headgeom.heads.analysis.tolerance import rounding_tolerance
from headgeom.model.families import FAMILIES
from tests.helpers import atlas_weights as aw
from tests.helpers.hf import tiny_family_config
from tests.helpers.models import GPT_GEOMETRIES, small_gpt, tiny_model, zoo_model
from tests.tolerances import largest

transformers = pytest.importorskip("transformers", reason="a [dev] extra")

F32 = rounding_tolerance(torch.float32, 1.0, 1)  # one float32 rounding at magnitude 1


def _ids(n_vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, n_vocab, (3, 9), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if torch.is_tensor(out) else out.logits


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p ‖ q) of next-token distributions, mean over positions (float64)."""
    lp, lq = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def _loaded(template, weights: Weights):
    return weights.load_into(copy.deepcopy(template))


def _pair(kind: str):
    """(A, B) models of one lineage: B is A with every parameter moved."""
    if kind == "gpt":
        a = small_gpt(seed=0)
        return a, aw.moved(a, seed=1, buffers=False)
    if kind == "gpt-frozen":  # a geometry with frozen bases (buffers, equal in A and B)
        a = zoo_model("write-common", 0)
        return a, aw.moved(a, seed=1, buffers=False)
    a = {"llama": aw.tiny_llama, "gemma4": aw.tiny_gemma4, "gemma3n": aw.tiny_gemma3n}[kind]()
    return a, aw.moved(a, seed=1)


def _vocab(model) -> int:
    return model.cfg.n_vocab if hasattr(model, "cfg") else model.config.vocab_size


PAIRS = ["gpt", "gpt-frozen", "llama", "gemma4", "gemma3n"]


# ------------------------------------------------------------------ tensor groups
def test_gemma4_roles_name_the_ple_table_branch_and_knobs():
    w = Weights.of(aw.tiny_gemma4())
    r = w.roles
    assert r["model.embed_tokens_per_layer.weight"] == Role("ple_table", None, "table")
    assert r["model.embed_tokens.weight"] == Role("embedding", None, "table")
    assert r["model.per_layer_model_projection.weight"] == Role("ple", None, "linear")
    assert r["model.layers.1.per_layer_input_gate.weight"] == Role("ple", 1, "linear")
    assert r["model.layers.0.per_layer_projection.weight"] == Role("ple", 0, "linear")
    assert r["model.layers.0.post_per_layer_input_norm.weight"] == Role("norms", 0, "norm")
    assert r["model.layers.1.layer_scalar"] == Role("scales", 1, "scale")
    assert r["model.layers.1.self_attn.k_norm.weight"] == Role("norms", 1, "norm")
    assert r["model.layers.0.mlp.down_proj.weight"] == Role("mlp", 0, "linear")
    assert "lm_head.weight" not in w.tensors  # tied: the embedding, stored once
    assert w.groups() == ["embedding", "ple_table", "ple", "attention", "mlp", "norms", "scales"]
    assert w.tensors["model.embed_tokens_per_layer.weight"].shape == (aw.VOCAB, 2 * 8)


def test_gemma3n_roles_cover_altup_and_laurel():
    w = Weights.of(aw.tiny_gemma3n())
    assert w.roles["model.layers.1.laurel.linear_left.weight"] == Role("laurel", 1, "linear")
    assert w.roles["model.layers.0.altup.correct_output_scale"] == Role("altup", 0, "scale")
    assert w.roles["model.altup_projections.0.weight"] == Role("altup", None, "linear")
    assert w.roles["model.embed_tokens_per_layer.weight"].group == "ple_table"


def test_every_registered_family_and_geometry_has_its_tensors_named():
    for family in FAMILIES:
        model = transformers.AutoModelForCausalLM.from_config(tiny_family_config(family))
        w = Weights.of(model)  # refuses any tensor no rule names
        assert {"attention", "mlp", "norms", "embedding"} <= set(w.groups()), family
    for geometry in GPT_GEOMETRIES:
        w = Weights.of(tiny_model(geometry))
        assert w.roles["wte.weight"] == Role("embedding", None, "table")
        assert w.layers() == [0, 1]


def test_weights_are_a_snapshot_that_loading_restores():
    a, b = _pair("llama")
    ids = _ids(aw.VOCAB)
    wa, la = Weights.of(a), _logits(a, ids)
    Weights.of(b).load_into(a)  # the model now computes B
    assert torch.equal(_logits(a, ids), _logits(b, ids))
    wa.load_into(a)
    assert torch.equal(_logits(a, ids), la)


def test_unknown_family_or_tensor_is_refused():
    with pytest.raises(UnknownTensorError, match="'mamba' has no tensor-group table"):
        role_of("mamba", "backbone.embeddings.weight")
    moe = "model.layers.0.block_sparse_moe.gate.weight"
    with pytest.raises(UnknownTensorError, match="block_sparse_moe.gate.weight"):
        Weights.build("llama", {moe: torch.zeros(2, 2)})
    assert "llama" in RULES and "gemma4_text" in RULES


def test_different_architectures_are_refused_naming_the_tensor():
    a = Weights.of(small_gpt(n_vocab=40))
    with pytest.raises(ValueError, match=r"'wte.weight': A has \(40, 32\)"):
        ck.blend(a, Weights.of(small_gpt(n_vocab=41)), 0.5)
    missing = "'blocks.0.attn.writer.c_proj.weight' is in A but not in B"
    with pytest.raises(ValueError, match=missing):
        ck.drift(a, Weights.of(small_gpt("write-common-axis")))
    with pytest.raises(ValueError, match="A is a gpt model, B a llama model"):
        check_same_architecture(a, Weights.of(aw.tiny_llama()))
    with pytest.raises(ValueError, match="'wte.weight'"):
        a.load_into(small_gpt(n_vocab=41))


# ------------------------------------------------------------------ blend dial
@pytest.mark.parametrize("kind", PAIRS)
def test_blend_ends_are_the_checkpoints_exactly(kind):
    a, b = _pair(kind)
    wa, wb = Weights.of(a), Weights.of(b)
    ids = _ids(_vocab(a))
    la, lb = _logits(a, ids), _logits(b, ids)
    assert torch.equal(_logits(_loaded(a, ck.blend(wa, wb, 0.0)), ids), la)
    assert torch.equal(_logits(_loaded(a, ck.blend(wa, wb, 1.0)), ids), lb)
    assert _kl(la, lb) > 1e-3  # the ends differ, so the identity says something


@pytest.mark.parametrize("kind", ["gpt", "llama", "gemma4"])
def test_blend_equals_the_naive_state_dict_loop(kind):
    a, b = _pair(kind)
    sa, sb = a.state_dict(), b.state_dict()
    for alpha in (-0.25, 0.4, 1.5):
        naive = copy.deepcopy(a)
        naive.load_state_dict({n: (1 - alpha) * sa[n] + alpha * sb[n] for n in sa})
        ours = _loaded(a, ck.blend(Weights.of(a), Weights.of(b), alpha))
        for n, t in naive.state_dict().items():
            tol = rounding_tolerance(torch.float32, largest(sa[n], sb[n]), 2)
            assert torch.allclose(ours.state_dict()[n], t, rtol=0, atol=tol), (alpha, n)


def test_blend_keeps_tensors_equal_in_both_checkpoints():
    a, b = _pair("gpt-frozen")
    mid = ck.blend(Weights.of(a), Weights.of(b), 0.3)
    frozen = mid.names(lambda r: r.kind == "frozen")
    assert frozen
    for n in frozen:
        assert torch.equal(mid.tensors[n], a.state_dict()[n])


def test_blend_kl_to_each_end():
    a, b = _pair("llama")
    wa, wb, ids = Weights.of(a), Weights.of(b), _ids(aw.VOCAB)
    la, lb = _logits(a, ids), _logits(b, ids)
    kl = {x: _logits(_loaded(a, ck.blend(wa, wb, x)), ids) for x in ck.ALPHAS}
    assert _kl(la, kl[0.0]) == 0.0 and _kl(lb, kl[1.0]) == 0.0
    assert _kl(la, kl[0.5]) > 0.0 and _kl(lb, kl[0.5]) > 0.0
    assert ck.ALPHAS[0] == -0.25 and ck.ALPHAS[-1] == 1.5


# ------------------------------------------------------------------ grafts
@pytest.mark.parametrize("kind", PAIRS)
def test_graft_of_every_group_is_the_donor(kind):
    a, b = _pair(kind)
    wa, wb = Weights.of(a), Weights.of(b)
    groups = ck.group_grafts(wa)
    every = [n for names in groups.values() for n in names]
    assert sorted(every) == sorted(wa.tensors)
    ids = _ids(_vocab(a))
    assert torch.equal(_logits(_loaded(a, ck.graft(wa, wb, every)), ids), _logits(b, ids))
    assert torch.equal(_logits(_loaded(b, ck.graft(wb, wa, every)), ids), _logits(a, ids))


def test_group_graft_changes_that_group_only():
    a, b = _pair("llama")
    wa, wb = Weights.of(a), Weights.of(b)
    g = ck.graft(wa, wb, ck.group_grafts(wa)["mlp"])
    for n, t in g.tensors.items():
        donor = ".mlp." in n  # Llama's MLP tensors, by name
        assert torch.equal(t, (wb if donor else wa).tensors[n]), n
    # the tied unembedding follows the grafted embedding
    e = _loaded(a, ck.graft(wa, wb, ck.group_grafts(wa)["embedding"]))
    assert torch.equal(e.lm_head.weight, b.model.embed_tokens.weight)


def test_layer_grafts_are_one_layers_norms_or_linear_weights():
    w = Weights.of(aw.tiny_llama())
    grafts = ck.layer_grafts(w)
    assert set(grafts) == {(0, "norms"), (0, "linear"), (1, "norms"), (1, "linear")}
    assert grafts[1, "norms"] == [
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight",
    ]
    p = "model.layers.1."
    assert sorted(grafts[1, "linear"]) == sorted(
        [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        + [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    )


# ------------------------------------------------------------------ drift
def test_drift_on_a_hand_built_pair():
    def w(wte, ln_w, ln_b):
        t = {"wte.weight": wte, "ln_f.weight": ln_w, "ln_f.bias": ln_b}
        return Weights.build("gpt", {k: torch.tensor(v) for k, v in t.items()})

    a = w([[3.0, 4.0]], [0.0, 0.0], [1.0, 2.0])
    b = w([[3.0, 5.0]], [0.0, 0.0], [1.0, 4.0])
    d = ck.drift(a, b)
    assert d["wte.weight"] == pytest.approx(1 / 5, rel=1e-15)
    assert d["ln_f.weight"] == 0.0  # a zero tensor that stayed zero
    assert d["ln_f.bias"] == pytest.approx(2 / math.sqrt(5), rel=1e-15)
    # the norms together: √(0 + 2²) / √(0 + 1 + 4)
    assert ck.drift_by_group(a, b) == pytest.approx({"embedding": 0.2, "norms": 2 / 5**0.5})
    moved_zero = w([[3.0, 4.0]], [0.0, 1.0], [1.0, 2.0])
    assert ck.drift(a, moved_zero)["ln_f.weight"] == math.inf


# ------------------------------------------------------------------ is it a low-rank change
def _linear(w: Weights) -> list[str]:
    return w.names(lambda r: r.kind == "linear")


@pytest.mark.parametrize("kind", ["gpt", "llama", "gemma4"])
def test_low_rank_delta_at_full_rank_is_b(kind):
    a, b = _pair(kind)
    wa, wb = Weights.of(a), Weights.of(b)
    full = max(min(wa.tensors[n].shape[-2:]) for n in _linear(wa))
    for mode, kw in (("top", {"k": full}), ("random", {"k": 10**6}), ("fraction", {"fraction": 1})):
        out = ck.partial_change(wa, wb, mode, **kw)
        for n, t in out.tensors.items():
            tol = rounding_tolerance(torch.float32, largest(wa.tensors[n], wb.tensors[n]), 2)
            assert torch.allclose(t, wb.tensors[n], rtol=0, atol=tol), (mode, n)
    back = ck.partial_change(wa, wb, "minus_top", k=full)
    for n in _linear(wa):
        tol = rounding_tolerance(torch.float32, largest(wa.tensors[n], wb.tensors[n]), 2)
        assert torch.allclose(back.tensors[n], wa.tensors[n], rtol=0, atol=tol), n


def test_low_rank_delta_at_rank_zero_is_a_on_linear_layers_and_b_elsewhere():
    a, b = _pair("llama")
    wa, wb = Weights.of(a), Weights.of(b)
    for mode, kw in (("top", {"k": 0}), ("random", {"k": 0}), ("fraction", {"fraction": 0.0})):
        out = ck.partial_change(wa, wb, mode, **kw)
        for n, t in out.tensors.items():
            expected = wa if wa.roles[n].kind == "linear" else wb
            assert torch.equal(t, expected.tensors[n]), (mode, n)


def test_top_k_delta_against_numpy_svd():
    a, b = _pair("gpt")
    wa, wb = Weights.of(a), Weights.of(b)
    name, k = "blocks.1.mlp.c_fc.weight", 3
    x, y = wa.tensors[name].double().numpy(), wb.tensors[name].double().numpy()
    U, S, Vt = np.linalg.svd(y - x, full_matrices=False)
    naive = x + (U[:, :k] * S[:k]) @ Vt[:k]
    top = ck.partial_change(wa, wb, "top", k=k).tensors[name].double().numpy()
    assert np.allclose(top, naive, rtol=0, atol=F32 * largest(naive))
    # Eckart–Young: what stays of ΔW is its tail
    rest = np.linalg.norm(y - top) ** 2
    assert rest == pytest.approx(float(np.sum(S[k:] ** 2)), rel=1e-5)
    minus = ck.partial_change(wa, wb, "minus_top", k=k).tensors[name].double().numpy()
    assert np.allclose(minus, y - (U[:, :k] * S[:k]) @ Vt[:k], rtol=0, atol=F32 * largest(y))


def test_random_slice_has_rank_k_and_follows_its_seed():
    a, b = _pair("gpt")
    wa, wb = Weights.of(a), Weights.of(b)
    name = "blocks.0.attn.reader.c_attn.weight"  # (96, 32)
    r1 = ck.partial_change(wa, wb, "random", k=5, seed=1).tensors[name].double()
    r1b = ck.partial_change(wa, wb, "random", k=5, seed=1).tensors[name].double()
    r2 = ck.partial_change(wa, wb, "random", k=5, seed=2).tensors[name].double()
    step = r1 - wa.tensors[name].double()
    assert torch.equal(r1, r1b) and not torch.equal(r1, r2)
    s = torch.linalg.svdvals(step)
    assert (s[:5] > 1e-3 * s[0]).all() and (s[5:] < 1e-5 * s[0]).all()  # rank 5 in float32


def test_partial_change_refuses_bad_arguments():
    w = Weights.of(small_gpt())
    with pytest.raises(ValueError, match="mode must be one of"):
        ck.partial_change(w, w, "bottom", k=1)
    with pytest.raises(ValueError, match="needs fraction"):
        ck.partial_change(w, w, "fraction")
    with pytest.raises(ValueError, match="needs a rank k"):
        ck.partial_change(w, w, "top")


# ------------------------------------------------------------------ special-token rows
def test_row_swap_takes_the_named_rows_of_every_vocabulary_table():
    a, b = _pair("gemma4")
    wa, wb = Weights.of(a), Weights.of(b)
    ids = ck.token_ids({"<|turn>": 5, "<turn|>": 7, "a": 9}, ["<|turn>", "<turn|>"])
    assert ids == [5, 7]
    swapped = ck.with_rows(wa, wb, ids)
    tables = ["model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"]
    assert ck.vocabulary_tables(wa) == tables
    for n, t in swapped.tensors.items():
        if n in tables:
            rows = np.isin(np.arange(t.shape[0]), ids)
            assert torch.equal(t[rows], wb.tensors[n][rows]), n
            assert torch.equal(t[~rows], wa.tensors[n][~rows]), n
        else:
            assert torch.equal(t, wa.tensors[n]), n
    only_embedding = ck.with_rows(wa, wb, ids, groups=["embedding"])
    assert torch.equal(only_embedding.tensors[tables[1]], wa.tensors[tables[1]])
    # the tied unembedding follows: the swapped tokens' logits move, others' lead is A's
    m = _loaded(a, swapped)
    assert torch.equal(m.lm_head.weight[ids], b.lm_head.weight[ids])
    with pytest.raises(KeyError, match="not in the vocabulary"):
        ck.token_ids({"a": 1}, ["<|turn>"])


def test_row_swap_inside_a_blend():
    a, b = _pair("gpt")
    wa, wb = Weights.of(a), Weights.of(b)
    mid = ck.with_rows(ck.blend(wa, wb, 0.4), wa, [3])
    assert torch.equal(mid.tensors["wte.weight"][3], wa.tensors["wte.weight"][3])
    naive = 0.6 * wa.tensors["wte.weight"][4] + 0.4 * wb.tensors["wte.weight"][4]
    assert torch.equal(mid.tensors["wte.weight"][4], naive)


def test_lead_is_the_tokens_logit_minus_the_best_other():
    logits = torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 0.0]])
    assert ck.lead(logits, 1).tolist() == [2.0, 0.0]
    assert ck.lead(logits, 0).tolist() == [-4.0, 0.0]
    assert ck.lead(logits, 2).tolist() == [-2.0, -2.0]
