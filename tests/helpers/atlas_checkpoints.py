"""Our own checkpoints as the atlas reads them (format ``checkpoint``), tiny and offline: a
compact vocabulary of the GPT-2 ids that the demo corpus's atlas stream and the tests' task
items use (as the demo compacts its vocabulary), random GPTs of that vocabulary, and a run
folder or timeline checkpoint written with a sealed manifest that names its bytes' SHA-256 and
the GPT-2 tokenizer files (as the head-geometry study writes them)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np

from headgeom.data.corpus import build_vocab, iter_demo_texts
from headgeom.data.tasks import SPLITS, build_task
from headgeom.data.tokenizer import load_gpt2_tokenizer, tokenizer_files_sha256
from headgeom.hashing import sha256_file
from headgeom.io import write_manifest
from headgeom.model import registry, zoo
from headgeom.model.checkpoint import save_checkpoint
from headgeom.model.gpt import GPT
from tests.helpers.models import perturbed

#: The demo corpus seed, the skills' task seed (sva), and the items of each split the tests
#: build: the vocabulary holds every token they use.
CORPUS_SEED, TASK_SEED, N_ITEMS = 5, 101, 8
ARCH = dict(n_layer=2, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=32)


@functools.cache
def demo_vocab() -> np.ndarray:
    """Sorted GPT-2 ids of the first 60 documents of the demo's atlas stream (seed
    :data:`CORPUS_SEED`) and of sva's first :data:`N_ITEMS` discovery and evaluation items."""
    tok = load_gpt2_tokenizer()
    texts = itertools.islice(iter_demo_texts(CORPUS_SEED, "atlas"), 60)
    arrays = [np.asarray(tok.encode(t).ids) for t in texts]
    for split in ("discovery", "evaluation"):
        splits = {**{s: 0 for s in SPLITS}, split: N_ITEMS}
        frame = build_task("sva", tok, {"seed": TASK_SEED, "splits": splits}).frame
        arrays += [np.asarray(ids) for ids in frame["clean_ids"]]
        arrays += [frame["correct_id"].to_numpy(), frame["incorrect_id"].to_numpy()]
    return build_vocab(arrays).astype(np.int64)


def tiny_gpt(geometry: str = "learned", seed: int = 0, **arch) -> GPT:
    """A random GPT of ``geometry`` over :func:`demo_vocab`, weights
    :func:`tests.helpers.models.perturbed` (every head and norm matters)."""
    import torch

    torch.manual_seed(seed)
    cfg = zoo.derive_model_config(geometry, {**ARCH, **arch}, {})
    return perturbed(registry.build_model(cfg, len(demo_vocab())), seed)


def write_checkpoint(path: Path, model: GPT, step: int | None = None) -> Path:
    """``model`` saved at ``path`` (a ``.safetensors`` file) with its manifest beside it
    (``model.safetensors`` → ``manifest.json``, ``stepN.safetensors`` →
    ``stepN.manifest.json``); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, model, demo_vocab())
    name = "manifest.json" if path.name == "model.safetensors" else f"{path.stem}.manifest.json"
    write_manifest(path.with_name(name), {
        "checkpoint_file_sha256": sha256_file(path), "config_id": "tiny-s0", "model_name": "tiny",
        "step": step, "data": {"tokenizer": "gpt2",
                               "tokenizer_files_sha256": tokenizer_files_sha256()},
    })  # fmt: skip
    return path


def write_run(folder: Path, model: GPT) -> Path:
    """A run folder (``model.safetensors`` and ``manifest.json``); returns the folder."""
    write_checkpoint(folder / "model.safetensors", model)
    return folder
