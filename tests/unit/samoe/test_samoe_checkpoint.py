"""SA-MoE checkpoints: a toy model comes back as it was saved, and loading it draws nothing
from the caller's random streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.samoe.checkpoint import load_moe, save_moe
from tests.helpers import samoe as h


@pytest.mark.parametrize("variant", ["ordinary", "latest", "persistent"])
def test_a_toy_model_round_trips_without_touching_the_rng(variant, tmp_path):
    model = h.random_model(variant)
    vocab = np.arange(h.N_VOCAB, dtype=np.int64)
    save_moe(tmp_path / "m.safetensors", model, vocab)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    back, vocab_back, record = load_moe(tmp_path / "m.safetensors")
    # the construction's initial draws are forked away: the caller's next draw is unchanged
    assert torch.equal(torch.random.get_rng_state(), before)
    assert record["variant"] == variant and back.variant == variant
    np.testing.assert_array_equal(vocab_back, vocab)
    saved, loaded = model.state_dict(), back.state_dict()
    assert saved.keys() == loaded.keys()
    for name in saved:
        assert torch.equal(saved[name], loaded[name]), name
    ids = h.token_ids()
    with torch.no_grad():
        # the same numbers in other memory: equal to rounding anywhere (bitwise below)
        torch.testing.assert_close(back(ids), model(ids), rtol=1e-5, atol=1e-6)


@pytest.mark.kernel_pin  # the same numbers at other addresses: MKL_CBWR makes MKL ignore that
@pytest.mark.parametrize("variant", ["ordinary", "latest", "persistent"])
def test_a_reloaded_toy_model_gives_the_saved_models_logits_bitwise(variant, tmp_path):
    model = h.random_model(variant)
    save_moe(tmp_path / "m.safetensors", model, np.arange(h.N_VOCAB, dtype=np.int64))
    back, _, _ = load_moe(tmp_path / "m.safetensors")
    ids = h.token_ids()
    with torch.no_grad():
        assert torch.equal(model(ids), back(ids))
