"""Check C6 on trained checkpoints (headgeom.model.frozen, folded into hash_checkpoint)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgeom.model import registry
from headgeom.model.checkpoint import load_checkpoint, save_checkpoint
from headgeom.model.frozen import FrozenBufferError, check_frozen_buffers
from headgeom.run_config import TrainConfig
from headgeom.training.loop import train
from tests.helpers.models import GPT_GEOMETRIES, V_TINY, tiny_model

FROZEN = [g for g in GPT_GEOMETRIES if not registry.is_baseline(g)]


@pytest.mark.parametrize("geometry", FROZEN)
def test_frozen_buffers_do_not_depend_on_the_rng(geometry):
    # the premise of C6: a model rebuilt from its record regenerates the same bases
    a, b = tiny_model(geometry, seed=1), tiny_model(geometry, seed=2)
    for (name, x), (_, y) in zip(a.named_buffers(), b.named_buffers(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("geometry", ["all-rotated", "write-routed-b"])
def test_a_trained_checkpoint_passes_and_a_changed_buffer_fails(tmp_path, geometry):
    model = tiny_model(geometry)
    ids = np.tile(np.arange(V_TINY, dtype=np.int32), 20)
    cfg = TrainConfig(steps=2, batch_size=4, lr_max=1e-2, lr_min=1e-3, warmup_steps=1,
                      eval_every=2, eval_batch_size=4)  # fmt: skip
    train(model, ids, ids[:100], cfg, data_seed=1729, progress=False)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, np.arange(V_TINY))
    loaded, _ = load_checkpoint(path)
    residuals = check_frozen_buffers(loaded, path)
    assert residuals and set(residuals.values()) == {0.0}
    name, buffer = next(iter(loaded.named_buffers()))
    with torch.no_grad():
        buffer.view(-1)[0] += 2.0**-40  # one ulp-scale change in one entry
    with pytest.raises(FrozenBufferError, match=rf"m.safetensors: check C6 failed.*{name}"):
        check_frozen_buffers(loaded, path)


def test_a_learned_model_has_nothing_to_check():
    assert check_frozen_buffers(tiny_model("learned"), "x") == {}
