"""SA-MoE configs (SAMOE §19.1): defaults as the demo config states them, hashable dicts,
and one clear error naming the key and value for each bad value."""

import pytest

from headgeom.hashing import content_hash
from headgeom.samoe.config import VARIANTS, CPTConfig, DenseConfig, MoEConfig, check_variant


def test_defaults_are_the_demo_config():
    moe = MoEConfig()
    assert (moe.n_experts, moe.n_shared, moe.top_k, moe.state_dim, moe.clamp) == (16, 1, 2, 16, 5.0)
    assert (moe.write_input, moe.gate) == ("moe_output", "softmax_topk_unnormalised")
    assert (moe.drop_prob, moe.router_init_a) == (0.55, 0.01)
    cpt = CPTConfig()
    assert (cpt.steps, cpt.lr, cpt.shared_freeze_steps, cpt.warmup_steps) == (120, 1e-3, 12, 6)
    assert (cpt.aux.load_balance, cpt.aux.z_loss) == (0.01, 1e-3)
    dense = DenseConfig()
    assert (dense.n_layer, dense.d_model, dense.n_head, dense.d_head, dense.d_mlp) == (
        8,
        64,
        4,
        16,
        128,
    )
    assert VARIANTS == ("ordinary", "latest", "persistent")


def test_dicts_round_trip_and_hash():
    for cls in (MoEConfig, CPTConfig, DenseConfig):
        cfg = cls()
        assert cls.from_dict(cfg.to_dict()) == cfg
        assert content_hash(cfg.to_dict()) == content_hash(cls().to_dict())
    assert content_hash(MoEConfig(state_dim=8).to_dict()) != content_hash(MoEConfig().to_dict())


@pytest.mark.parametrize(
    "cls, key, value",
    [
        (MoEConfig, "gate", "softmax"),
        (MoEConfig, "write_input", "state"),
        (MoEConfig, "top_k", 16),
        (MoEConfig, "drop_prob", 1.5),
        (MoEConfig, "clamp", -1.0),
        (MoEConfig, "router_x_init", "copy"),
        (CPTConfig, "shared_freeze_steps", 500),
        (CPTConfig, "final_lr_frac", 2.0),
        (DenseConfig, "d_head", 15),
    ],
)
def test_bad_values_name_key_and_value(cls, key, value):
    with pytest.raises(ValueError, match=rf"{key}={value!r}"):
        cls(**{key: value})


def test_unknown_keys_and_variants_are_refused():
    with pytest.raises(ValueError, match="unknown keys"):
        MoEConfig.from_dict({"n_expert": 16})
    with pytest.raises(ValueError, match="cpt.aux"):
        CPTConfig.from_dict({"aux": {"load_balance": -1}})
    with pytest.raises(ValueError, match="'lwo'"):
        check_variant("lwo")
