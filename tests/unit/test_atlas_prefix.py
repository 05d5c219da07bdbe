"""Resumed forwards (headgeom.atlas.prefix): layers before the start taken from the clean run
give the model's own logits bit for bit, with and without an edit, on Llama and on Gemma 4 /
Gemma 3n, whose KV-sharing layers read keys and values a skipped layer left behind."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headgeom.atlas import edits as E  # noqa: E402
from headgeom.atlas import prefix  # noqa: E402
from headgeom.atlas.blocks import AtlasModel  # noqa: E402
from tests.helpers import atlas as tiny  # noqa: E402


def exact(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.fixture(scope="module", params=sorted(tiny.BUILDERS))
def model(request):
    return AtlasModel(tiny.BUILDERS[request.param]())


@pytest.mark.parametrize("last_only", [False, True])
def test_resumed_equals_the_full_forward(model, last_only):
    ids = tiny.ids()
    full = model.logits(ids, last_only=last_only)
    clean = prefix.clean_run(model, ids, last_only=last_only)
    exact(clean.logits, full)
    for start in range(model.n_layer + 1):
        exact(prefix.resumed_logits(model, clean, start), full)


def test_resumed_edits_equal_full_edited_forwards(model):
    """Every edit of the atlas, at its own start layer, against the same edit on a full
    forward (the hooks are the same; only the layers before the start differ)."""
    ids = tiny.ids()
    means = E.write_means(model, tiny.ids(3, 9, seed=1), batch_size=2)
    edits = E.atlas_edits(model)
    tables = E.needed_tables(model, edits)
    clean = prefix.clean_run(model, ids)
    before = [o.clone() for o in clean.outputs]
    for edit in edits:
        with E.applied(model, edit, means, tables):
            full = model.logits(ids)
            resumed = prefix.resumed_logits(model, clean, edit.start)
        exact(resumed, full)
        assert not torch.equal(full, clean.logits), edit.label  # every edit does something
    for a, b in zip(before, clean.outputs, strict=True):
        exact(a, b)  # the clean run is left as it was


def test_kv_sharing_layers_read_the_clean_keys():
    """Gemma 4's layers 2 and 3 reuse layers 0's and 1's keys and values: resumed from
    layer 2, the skipped layers must leave them in the shared mapping."""
    model = AtlasModel(tiny.tiny_gemma4())
    clean = prefix.clean_run(model, tiny.ids())
    assert all(clean.mappings[layer] for layer in (0, 1))  # what the producers left
    lost = {k: {} for k in clean.mappings[0]}
    clean.mappings[0] = clean.mappings[1] = lost
    with pytest.raises(KeyError):
        prefix.resumed_logits(model, clean, 2)


def test_resumed_refuses_other_ids(model):
    clean = prefix.clean_run(model, tiny.ids())
    with pytest.raises(ValueError, match="not on the clean run's ids"):
        with prefix.resumed(model, clean, 2):
            model.logits(tiny.ids(length=7))
    with pytest.raises(ValueError, match="outside"):
        with prefix.resumed(model, clean, model.n_layer + 1):
            pass
    exact(model.logits(tiny.ids()), clean.logits)  # the layers' own forwards are back
